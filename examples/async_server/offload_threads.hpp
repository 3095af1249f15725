// Threads for the steps of a request that must not run on an io thread: CPU-heavy work (filling
// and checking a large /saxpy or /sum) and blocking calls (waiting for its GPU work, freeing its
// buffers: a CUDA free synchronizes the device). A coroutine hands such a step over and resumes
// on its own executor when it is done; the io thread serves other connections meanwhile.
//
// Thread safety: async_run from any thread. Lifetime: the destructor joins the threads, after the
// steps queued so far have run; the executors the handlers resume on must outlive their steps
// (each holds work on its executor until it has resumed there).
#pragma once

#include <cstddef>
#include <thread>
#include <utility>
#include <vector>

#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

class offload_threads {
 public:
  /// `n` threads named `name`-0, `name`-1, ... (at most 15 characters in all).
  offload_threads(std::size_t n, const char* name);
  ~offload_threads();
  offload_threads(const offload_threads&) = delete;
  offload_threads& operator=(const offload_threads&) = delete;

  /// Runs `step()` on one of the threads, then completes with void() on the handler's executor.
  /// `step` must stay valid until then and must not throw.
  template <typename Step, typename CompletionToken>
  auto async_run(Step& step, CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void()>(
        [this](auto handler, Step* s) {
          auto back = asio::make_work_guard(asio::get_associated_executor(handler));
          asio::post(io_, [s, h = std::move(handler), back = std::move(back)]() mutable {
            (*s)();
            auto ex = back.get_executor();
            asio::post(ex, std::move(h));
          });
        },
        token, &step);
  }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> keep_;
  std::vector<std::thread> threads_;
};
