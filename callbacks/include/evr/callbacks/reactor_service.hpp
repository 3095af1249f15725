// evr/callbacks/reactor_service.hpp — finds a reactor through an Asio execution context, as
// Asio's timers find their service.
//
// Usage:
//
//     evr::use_reactor(io, my_reactor);      // attach a reactor to io's context (not owned)
//     evr::gpu_waiter w{io.get_executor()};  // finds it through the executor's context
//
// With no reactor attached, the first waiter made from the context creates a reactor on the CUDA
// backend (default options), owned by the context (evr::error in a build without CUDA).
//
// Thread safety: use() and get() are thread-safe.
// Lifetime: an attached reactor must outlive the context's waits. An owned reactor is stopped when
// the context shuts down (Asio calls shutdown() before destroying the handlers still queued).
#pragma once

#include <memory>
#include <mutex>

#include <evr/callbacks/detail/asio_forward.hpp>
#include <evr/reactor/reactor.hpp>

namespace evr {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {

class reactor_service : public asio::execution_context::service {
 public:
  static inline asio::execution_context::id id;

  explicit reactor_service(asio::execution_context& context)
      : asio::execution_context::service(context) {}

  /// The attached reactor, or a reactor on the CUDA backend created now (default options).
  /// Throws evr::error when none is attached and CUDA is not compiled in.
  reactor& get() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (current_ == nullptr) {
      owned_ = std::make_unique<reactor>();
      current_ = owned_.get();
    }
    return *current_;
  }

  /// Attaches `r` (not owned). Waiters created afterwards use it.
  void use(reactor& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = &r;
  }

 private:
  void shutdown() override {
    std::unique_ptr<reactor> owned;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      owned = std::move(owned_);
      current_ = nullptr;
    }
    owned.reset();  // stop + join: every wait completes (its handler is queued, then destroyed)
  }

  std::mutex mutex_;
  reactor* current_ = nullptr;
  std::unique_ptr<reactor> owned_;
};

/// Attaches `r` to `context`: waiters constructed from the context's executors use it.
inline void use_reactor(asio::execution_context& context, reactor& r) {
  asio::use_service<reactor_service>(context).use(r);
}

}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE
}  // namespace evr
