// evr-coroutines: C++20 coroutines that co_await GPU work through evr.
//
//   1. a pipeline, copy in -> kernel -> copy out, with a co_await after each stage;
//   2. a GPU wait raced against a timeout (make_parallel_group): the loser is cancelled;
//   3. a wait cancelled by hand (asio::cancellation_signal).
// A cancelled wait completes with asio::error::operation_aborted, but the GPU work goes on:
// cancelling stops the *waiting*, never the GPU. 2 and 3 show both.
//
//   evr-coroutines [--device auto|cuda|sim]     (no argument: the GPU if there is one; --help)
//
// as_tuple, deferred and make_parallel_group come from <evr/callbacks/asio_compat.hpp>, which
// names them for the Asio found (they left asio::experimental in Asio 1.23).
//
// Everything runs on one thread (io.run() in main): while a coroutine waits for the GPU it is
// suspended, and the thread is free to run the others. evr's reactor thread resumes it (through
// the io_context) once the GPU has passed the point it waits for.
#include <chrono>
#include <cstdio>
#include <exception>

#include <asio.hpp>

#include <evr/callbacks/asio_compat.hpp>
#include <evr/evr.hpp>

#include "example_device.hpp"
#include "example_device_cli.hpp"

namespace {

using namespace std::chrono_literals;
using evr::compat::as_tuple;
using evr::compat::deferred;

constexpr std::size_t n = 1 << 16;

// --- 1. a pipeline, one co_await per stage -------------------------------------------------------
asio::awaitable<bool> pipeline(examples::device& gpu, evr::gpu_waiter& waiter,
                               const evr::stream& s) {
  examples::host_floats in = gpu.alloc_host(n), out = gpu.alloc_host(n);
  examples::device_floats on_device = gpu.alloc_device(n);
  for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i % 1000);

  gpu.copy_to_device(s, on_device, in);
  // Suspends this coroutine until the copy is done. A device error would throw std::system_error.
  co_await waiter.async_wait(s, asio::use_awaitable);
  std::printf("   %7.1f ms  copy in done\n", examples::ms_since_start());

  gpu.affine(s, on_device, 0.5f, 3.0f);
  co_await waiter.async_wait(s, asio::use_awaitable);
  std::printf("   %7.1f ms  kernel done\n", examples::ms_since_start());

  gpu.copy_to_host(s, out, on_device);
  co_await waiter.async_wait(s, asio::use_awaitable);
  std::printf("   %7.1f ms  copy out done\n", examples::ms_since_start());

  for (std::size_t i = 0; i < n; ++i)
    if (out[i] != 0.5f * in[i] + 3.0f) co_return false;
  co_return true;
}

// --- 2. a GPU wait raced against a timeout -------------------------------------------------------
// Waits for the work queued on `s`, or gives up after `timeout`, whichever comes first. Returns the
// GPU wait's outcome: {} when the GPU won, operation_aborted when the timeout did.
asio::awaitable<std::error_code> wait_with_timeout(evr::gpu_waiter& waiter, const evr::stream& s,
                                                   std::chrono::milliseconds timeout) {
  asio::steady_timer timer(co_await asio::this_coro::executor, timeout);
  // `deferred` makes each async_wait a not-yet-started operation; the group starts both and, with
  // wait_for_one, cancels the other as soon as one finishes. It completes once both have.
  auto [order, gpu_ec, timer_ec] =
      co_await evr::compat::make_parallel_group(waiter.async_wait(s, deferred),
                                                timer.async_wait(deferred))
          .async_wait(evr::compat::wait_for_one(), asio::use_awaitable);
  std::printf("   %7.1f ms  first: %s; GPU wait: %s; timer: %s\n", examples::ms_since_start(),
              order[0] == 0 ? "the GPU" : "the timeout", gpu_ec ? gpu_ec.message().c_str() : "done",
              timer_ec ? timer_ec.message().c_str() : "expired");
  co_return gpu_ec;
}

asio::awaitable<bool> timeouts(examples::device& gpu, evr::gpu_waiter& waiter,
                               const evr::stream& s) {
  bool ok = true;

  std::printf("   a) 20 ms of GPU work, 2 s timeout\n");
  gpu.busy(s, 20ms);
  std::error_code ec = co_await wait_with_timeout(waiter, s, 2s);
  ok = ok && !ec;  // the GPU won; the timer was cancelled

  std::printf("   b) 300 ms of GPU work, 50 ms timeout\n");
  gpu.busy(s, 300ms);
  ec = co_await wait_with_timeout(waiter, s, 50ms);
  ok = ok && ec == asio::error::operation_aborted;  // the timeout won; the GPU wait was cancelled
  // Only the wait was cancelled: the GPU is still at work, and a new wait sees it finish.
  std::printf("   %7.1f ms  the stream is %s\n", examples::ms_since_start(),
              s.query() ? "idle" : "still busy: cancelling a wait does not stop the GPU");
  co_await waiter.async_wait(s, asio::use_awaitable);
  std::printf("   %7.1f ms  a new wait: the GPU work finished\n", examples::ms_since_start());
  co_return ok;
}

// --- 3. cancelling a wait by hand ----------------------------------------------------------------
asio::awaitable<bool> cancel_by_hand(examples::device& gpu, evr::gpu_waiter& waiter,
                                     const evr::stream& s) {
  asio::cancellation_signal stop;
  gpu.busy(s, 200ms);
  // Someone decides the result is no longer wanted (say, the client hung up) and emits the
  // signal. Here a function posted to the same io_context does it: it runs once this coroutine is
  // suspended in the wait below, on the same thread (emit where the handler's executor runs).
  asio::post(co_await asio::this_coro::executor, [&stop] {
    std::printf("   %7.1f ms  emitting the cancellation signal\n", examples::ms_since_start());
    stop.emit(asio::cancellation_type::terminal);
  });
  // as_tuple: the outcome comes back as a value instead of an exception.
  auto [ec] = co_await waiter.async_wait(
      s, asio::bind_cancellation_slot(stop.slot(), as_tuple(asio::use_awaitable)));
  std::printf("   %7.1f ms  the wait completed: %s; the stream is %s\n", examples::ms_since_start(),
              ec.message().c_str(), s.query() ? "idle" : "still busy");
  co_await waiter.async_wait(s, asio::use_awaitable);
  std::printf("   %7.1f ms  a new wait: the GPU work finished\n", examples::ms_since_start());
  co_return ec == asio::error::operation_aborted;
}

asio::awaitable<bool> run_all(examples::device& gpu, evr::gpu_waiter& waiter) {
  evr::stream s(gpu.backend(), 0);
  std::printf("\n1. pipeline: copy in -> kernel -> copy out, co_await after each stage\n");
  const bool piped = co_await pipeline(gpu, waiter, s);
  std::printf("   results %s\n", piped ? "correct" : "WRONG");
  std::printf("\n2. a GPU wait raced against a timeout (make_parallel_group)\n");
  const bool raced = co_await timeouts(gpu, waiter, s);
  std::printf("\n3. a wait cancelled through a cancellation_signal\n");
  const bool cancelled = co_await cancel_by_hand(gpu, waiter, s);
  const bool all_ok = piped && raced && cancelled;
  co_return all_ok;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string device = examples::device_from_cli(
      argc, argv,
      "C++20 coroutines that co_await GPU work: a pipeline, a wait raced against a "
      "timeout, a wait cancelled by hand",
      "evr-coroutines");

  examples::ms_since_start();  // t = 0
  examples::device gpu(device);
  evr::reactor reactor(gpu.backend());  // evr's background thread
  asio::io_context io;
  evr::gpu_waiter waiter(io.get_executor(), reactor);  // async_wait for any Asio completion token

  bool ok = false;
  asio::co_spawn(io, run_all(gpu, waiter), [&ok](std::exception_ptr e, bool result) {
    if (e) std::rethrow_exception(e);  // out of io.run(), into the catch below
    ok = result;
  });
  io.run();  // returns when the coroutines are done

  std::printf("\nresult: %s on the %s\n", ok ? "OK" : "FAILED", gpu.kind());
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "evr-coroutines: %s\n", e.what());
  return 1;
}
