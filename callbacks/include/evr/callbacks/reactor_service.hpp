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
// Context shutdown (what makes destroying an io_context with waits pending safe): every
// gpu_waiter registers its reactor here (track()). When the context shuts down (its destructor,
// or asio::execution_context::shutdown()), shutdown() detaches every pending wait whose I/O
// executor belongs to this context from each registered reactor still alive, in a handshake with
// the reactor thread (detail::detach_group: the reactor forgets them and acknowledges; done
// directly when called on the reactor thread itself, and nothing to do once the reactor stopped),
// then destroys those operations on this thread without running their handlers, as Asio's own
// services do. Afterwards nothing is posted to the context for those waits; completions posted
// before are destroyed with the context's queue. The GPU markers of detached waits stay in the
// reactor's timelines and return to the pool only once the GPU is past them. A coroutine
// suspended in co_await waiter.async_wait(...) is destroyed with its handler (frames freed).
// Limit: a handler bound to an executor of *another* context (bind_executor) is detached with its
// waiter's context only; that other context must outlive the wait.
//
// Thread safety: use(), get() and track() are thread-safe.
// Lifetime: an attached reactor must outlive the waiters that use it (not the context: a reactor
// destroyed first has completed all its waits). An owned reactor is stopped when the context shuts
// down, after its waits were detached.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <evr/callbacks/detail/asio_forward.hpp>
#include <evr/callbacks/detail/io_context_host.hpp>
#include <evr/callbacks/detail/io_context_posts.hpp>
#include <evr/reactor/reactor.hpp>

namespace evr {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {

/// The Asio service that finds a reactor through an execution context and detaches a context's
/// waits when it shuts down. Thread safety: use(), get() and track() are thread-safe. Lifetime:
/// an attached reactor must outlive the waiters that use it. See the file comment.
class reactor_service : public asio::execution_context::service {
 public:
  static inline asio::execution_context::id id;  ///< the service's identity (Asio convention)

  /// Made by Asio (use of() to get a context's service).
  explicit reactor_service(asio::execution_context& context)
      : asio::execution_context::service(context) {}

  /// The service of `context`; when it is created now, it is created after the context's strand
  /// service. A context shuts its services down in the reverse order of their creation, so this
  /// one (after which the reactor posts nothing more to the context) then comes before the
  /// strands that completions are posted to. The other way round, a completion posted to a strand
  /// while it shuts down could be left in its queue for ever (Asio's strand appends to its ready
  /// queue after releasing its lock, and only the shutdown would have drained it): a handler
  /// neither run nor destroyed. (A legacy io_context::strand has a service of its own, not
  /// covered.)
  static reactor_service& of(asio::execution_context& context) {
    if (!asio::has_service<reactor_service>(context))
      (void)asio::use_service<asio::detail::strand_executor_service>(context);
    return asio::use_service<reactor_service>(context);
  }

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

  /// Registers `r` as serving waits of this context, so that shutdown() detaches them there.
  /// Called by every gpu_waiter's constructor. Holds no reference: a reactor destroyed meanwhile
  /// is skipped (it completed all its waits).
  void track(reactor& r) {
    detail::reactor_core* core = detail::reactor_access::core(r);
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = tracked_.begin(); it != tracked_.end();) {
      if (it->first == core && !it->second.expired()) return;
      if (it->second.expired()) {
        it = tracked_.erase(it);  // a reactor gone since: its slot (and maybe its address) is free
      } else {
        ++it;
      }
    }
    tracked_.emplace_back(core, detail::reactor_access::weak_core(r));
  }

  /// The group of this context's waits (detail::wait_op::group_).
  std::uintptr_t group() noexcept { return reinterpret_cast<std::uintptr_t>(&context()); }

  /// The poll host of this context, which is `io`, for `r` in role `role`
  /// (detail/io_context_host.hpp: the last hop of delivery::post and post_woken), created on first
  /// use; nullptr when hosting is not available here (the waits are then delivered plainly). It
  /// lives until the context shuts down.
  detail::io_context_host* host(reactor& r, asio::io_context& io, detail::poll_host::role role) {
    if (!detail::io_context_host::available()) return nullptr;
    detail::reactor_core* core = detail::reactor_access::core(r);
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& h : hosts_)
      if (h.core == core && h.role == role && !h.weak.expired()) return h.host.get();
    hosts_.push_back(host_entry{
        core, role, detail::reactor_access::weak_core(r),
        std::make_unique<detail::io_context_host>(io, detail::reactor_access::weak_core(r), role)});
    return hosts_.back().host.get();
  }

 private:
  void shutdown() override {
    std::vector<std::pair<detail::reactor_core*, std::weak_ptr<detail::reactor_core>>> tracked;
    std::unique_ptr<reactor> owned;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tracked.swap(tracked_);
      owned = std::move(owned_);
      current_ = nullptr;
    }
    for (auto& entry : tracked) {
      std::shared_ptr<detail::reactor_core> core = entry.second.lock();
      if (!core) continue;  // destroyed: every wait of it has completed
      // Handed back, not completed: complete() sees detached_ and destroys the operation (and its
      // handler, a coroutine's frames included) here, without running it.
      for (detail::wait_op* op : detail::detach_group(*core, group())) op->complete({});
    }
    // No wait of this context is left with a reactor, so no reactor calls a host any more. The
    // hosts themselves live on until this service is destroyed: completions already posted to
    // the context tell their host they are done when the scheduler's shutdown destroys them,
    // after this one (services shut down in the reverse order of their creation).
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& h : hosts_) h.host->close();
    }
    owned.reset();  // stop + join; its waits of this context were detached above
  }

  struct host_entry {
    detail::reactor_core* core;
    detail::poll_host::role role;
    std::weak_ptr<detail::reactor_core> weak;  // a reactor destroyed since: its slot is stale
    std::unique_ptr<detail::io_context_host> host;
  };

  std::mutex mutex_;
  reactor* current_ = nullptr;
  std::unique_ptr<reactor> owned_;
  std::vector<std::pair<detail::reactor_core*, std::weak_ptr<detail::reactor_core>>> tracked_;
  std::vector<host_entry> hosts_;
};

/// Attaches `r` to `context`: waiters constructed from the context's executors use it.
inline void use_reactor(asio::execution_context& context, reactor& r) {
  reactor_service::of(context).use(r);
}

}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE
}  // namespace evr
