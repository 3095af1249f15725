// How a coroutine that must not block its thread waits for the work queued so far on a lane, in
// each non-blocking mode (wait_mode): evr's gpu_waiter, a host function (host_func_wait.hpp), or
// its io thread's event poller (event_poller.hpp). One object per io_context, shared by its
// connections (each wait is cancelled on its own, through its handler's slot), and one per /mlp
// batcher, bound to the io_context it lives on; the blocking modes wait with
// lane::wait_blocking instead.
//
// async_wait is an Asio asynchronous operation with the signature void(std::error_code): a
// coroutine co_awaits it without a frame of its own (the request path of GET /busy allocates
// nothing once warm, in every mode).
//
// Thread safety: async_wait on the thread of the io_context the object is bound to.
#pragma once

#include <optional>
#include <system_error>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>

#include <evr/evr.hpp>

#include "event_poller.hpp"
#include "host_func_wait.hpp"
#include "lanes.hpp"
#include "wait_mode.hpp"

class gpu_wait {
 public:
  /// What a mode waits with: the reactor (evr) or the io thread's poller (poll); hostfunc needs
  /// neither.
  struct source {
    wait_mode mode = wait_mode::evr;
    evr::reactor* reactor = nullptr;  ///< evr
    event_poller* poller = nullptr;   ///< poll: the poller of the io_context of `executor`
  };

  /// `executor`: the io_context's executor the waits' handlers run on. Throws
  /// std::invalid_argument when the mode blocks or its source is missing.
  gpu_wait(const asio::any_io_executor& executor, const source& s);

  /// Completes with the wait's result once the work queued so far on `l` is done. `cancel`, when
  /// not null (evr mode; the other waits cannot be cancelled and ignore it): a signal, emitted on
  /// this object's executor, that cancels the wait (operation_aborted; the GPU work goes on).
  template <typename CompletionToken>
  auto async_wait(lane& l, asio::cancellation_signal* cancel, CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(std::error_code)>(
        [this](auto handler, lane* target, asio::cancellation_signal* signal) {
          this->start(*target, signal, std::move(handler));
        },
        token, &l, cancel);
  }

 private:
  template <typename Handler>
  void start(lane& l, asio::cancellation_signal* cancel, Handler handler) {
    switch (mode_) {
      case wait_mode::evr:
        if (cancel != nullptr)
          waiter_->async_wait(l.wait_target(),
                              asio::bind_cancellation_slot(cancel->slot(), std::move(handler)));
        else
          waiter_->async_wait(l.wait_target(), std::move(handler));
        break;
      case wait_mode::hostfunc: host_func_wait::start(l.stream(), std::move(handler)); break;
      case wait_mode::poll: poller_->start(l, std::move(handler)); break;
      case wait_mode::pool:
      case wait_mode::thread: break;  // refused by the constructor
    }
  }

  wait_mode mode_;
  std::optional<evr::gpu_waiter> waiter_;  // evr
  event_poller* poller_ = nullptr;         // poll
};
