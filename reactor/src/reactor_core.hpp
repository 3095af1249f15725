// reactor/src/reactor_core.hpp — the reactor's machinery (the public evr::reactor holds one): the
// parts, each owning its state behind a narrow interface, and the thread's loop that composes
// them (docs/architecture.md, "reactor/", has who owns what and who calls whom):
//   submitter           streams, markers, the submission stack (any thread)
//   intake              submitted waits into the registry (the loop, a host's pass)
//   control_inbox       cancels, owner cancels, reported faults, stop (any thread -> reactor)
//   detach_coordinator  execution contexts taking their waits back (any thread -> reactor)
//   wait_registry       the waits accepted and not yet delivered, and how they leave
//   stream_sweep        how far each stream got, per strategy
//   idle_governor       each stream's plan, and how the thread rests between passes
//   delivery_batch      completing what a pass retired
//   host_pass           a pass on a thread that completions are delivered to (the last hop)
//   pass_lock, device_scope, marker_budget, reactor_counters: shared by several of them
//
// Threads: submit / cancel / cancel_owner / stop / detach_group / poll_here / metrics run on any
// thread; the loop (run and its steps) on the reactor thread, under the pass lock. The reactor
// thread holds a shared_ptr to the core, so the core outlives the thread even when the reactor is
// destroyed from one of its own inline handlers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include <evr/pool/pool_set.hpp>
#include <evr/reactor/detail/poll_host.hpp>
#include <evr/reactor/detail/wait_op.hpp>
#include <evr/reactor/metrics.hpp>
#include <evr/reactor/options.hpp>
#include <evr/reactor/wait_target.hpp>

#include "control_inbox.hpp"
#include "counters.hpp"
#include "delivery_batch.hpp"
#include "detach_coordinator.hpp"
#include "device_scope.hpp"
#include "host_pass.hpp"
#include "idle_governor.hpp"
#include "intake.hpp"
#include "marker_budget.hpp"
#include "pass_lock.hpp"
#include "strategy_traits.hpp"
#include "stream_sweep.hpp"
#include "submitter.hpp"
#include "wait_registry.hpp"
#include "wakeup.hpp"

namespace evr::detail {

class reactor_core : public std::enable_shared_from_this<reactor_core> {
 public:
  reactor_core(device::backend& backend, reactor_options options);
  ~reactor_core();
  reactor_core(const reactor_core&) = delete;
  reactor_core& operator=(const reactor_core&) = delete;

  void start();  // launches the thread (needs shared_from_this)
  void stop(bool destroying) noexcept;
  std::error_code submit(wait_op* op, const wait_target& target,
                         host_window* window = nullptr) noexcept {
    return submitter_.submit(op, target, window);
  }
  /// The winner's half of detail::cancel_wait (control_inbox::request_cancel is the first).
  void push_cancel(wait_op* op) noexcept { inbox_.push_cancel(op); }
  void cancel_owner(std::uintptr_t owner) noexcept { inbox_.cancel_owner(owner); }
  /// See detail::detach_group (reactor.hpp). Any thread; blocks for the reactor's answer.
  std::vector<wait_op*> detach_group(std::uintptr_t group);
  /// See detail::poll_here (reactor.hpp). Any thread but the reactor's.
  poll_result poll_here(poll_host& host) noexcept { return hosts_.run(host); }
  reactor_metrics metrics() const noexcept;
  std::chrono::nanoseconds cpu_time() const noexcept;
  bool on_reactor_thread() const noexcept {
    return thread_id_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }
  const reactor_options& options() const noexcept { return options_; }
  device::backend& backend() const noexcept { return backend_; }
  pool_set& pools() noexcept { return pools_; }

 private:
  using clock = std::chrono::steady_clock;

  // The loop's steps (reactor thread, under the pass lock).
  void run(std::shared_ptr<reactor_core> self);
  void become_reactor_thread() noexcept;
  bool one_pass();
  void close_submissions(clock::time_point now);
  bool take_inputs(clock::time_point now);
  bool take_submissions(clock::time_point now);
  void take_cancels(wait_op* cancels);
  void settle_cancel(wait_op* op);
  bool take_reported_faults();
  void deliver(clock::time_point detected);
  bool finish_closing();
  void rest(clock::time_point now, bool progress, bool took_new);
  /// Takes the pass lock (pass_lock::enter), counting a sleep on it.
  void enter_pass() noexcept;
  void park();
  void nap_until(clock::time_point until, bool learn_overshoot);
  bool has_inputs() const noexcept;

  // The parts, in construction order (each takes references to those it needs).
  device::backend& backend_;
  const reactor_options options_;
  const strategy_traits traits_;
  pool_set pools_;
  std::shared_ptr<wakeup> wake_ = std::make_shared<wakeup>();
  reactor_counters counters_;
  pass_lock pass_;
  device_scope devices_{backend_};
  marker_budget markers_{backend_, options_};
  control_inbox inbox_{wake_};
  delivery_batch batch_{counters_};
  wait_registry registry_{traits_, batch_, markers_, counters_};
  idle_governor idle_{options_, traits_, backend_, registry_, counters_};
  submitter submitter_{
      {backend_, options_, traits_, pools_, wake_, counters_, markers_, inbox_, idle_}};
  intake intake_{submitter_, registry_, idle_};
  stream_sweep sweep_{backend_, options_, traits_, registry_, idle_, devices_, counters_};
  detach_coordinator detach_{wake_, registry_, batch_, counters_};
  host_pass hosts_{{options_, pass_, inbox_, intake_, registry_, sweep_, idle_, batch_, devices_,
                    counters_, wake_}};

  // The thread.
  std::mutex stop_mutex_;  // serializes stop() callers (join once)
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<bool> cpu_clock_valid_{false};
  std::uint64_t cpu_clock_id_ = 0;  // clockid_t of the reactor thread, set before cpu_clock_valid_
  bool closed_ = false;             // (reactor) stopping: submissions closed, draining
  clock::time_point drain_deadline_{};
};

}  // namespace evr::detail
