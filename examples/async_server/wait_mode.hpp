// How a server waits for its requests' GPU work: the five ways the server compares. Everything
// else (HTTP, routes, lanes, checks, metrics) is the same code in every mode.
#pragma once

/// The server's ways of waiting for the GPU.
enum class wait_mode {
  /// evr: the request's coroutine co_awaits evr::gpu_waiter::async_wait; the reactor thread sees
  /// the work done and resumes it on its io thread.
  evr,
  /// Written by hand without evr: a host function (cudaLaunchHostFunc) behind the request's work
  /// posts the coroutine's resumption to its io_context (host_func_wait.hpp).
  hostfunc,
  /// Written by hand without evr: each io thread records an event behind its requests' work and
  /// queries those events itself between I/O, sleeping in epoll only when none is pending
  /// (event_poller.hpp).
  poll,
  /// A pool of threads, each blocked until its request's GPU work is done.
  pool,
  /// A thread per connection, blocked the same way.
  thread,
};

/// The mode's name on the command line and in /metrics.
constexpr const char* to_string(wait_mode m) noexcept {
  switch (m) {
    case wait_mode::evr: return "evr";
    case wait_mode::hostfunc: return "hostfunc";
    case wait_mode::poll: return "poll";
    case wait_mode::pool: return "pool";
    case wait_mode::thread: return "thread";
  }
  return "?";
}

/// True for the modes whose requests block a thread while the GPU works (pool, thread).
constexpr bool blocks_a_thread(wait_mode m) noexcept {
  return m == wait_mode::pool || m == wait_mode::thread;
}

/// True for the modes that run one io_context per io thread (evr, hostfunc, poll): a connection
/// lives on one context, which only that context's one thread runs (server.hpp says why).
constexpr bool context_per_thread(wait_mode m) noexcept { return !blocks_a_thread(m); }
