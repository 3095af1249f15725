// reactor/src/detach_coordinator.hpp — an execution context shutting down takes its waits back
// (detail::detach_group, called by reactor_service's shutdown): the reactor forgets them, marks
// them detached_ and hands them over, not completed, so nothing of that context is delivered any
// more.
//
// Owns the requests: queued under a mutex by the requesting thread, flagged for the reactor's
// input check (seq_cst: part of the wake handshake), collected by the reactor thread (from the
// wait registry and the delivery batch), answered through a condition variable once no cancel
// request is in flight (a wait retired with one pending is in no list until it arrives: claims()
// hands it back then). From one of the reactor's own inline handlers the detach is done in place.
// After the reactor's thread ended there is nothing to detach (close()).
//
// Threads: request() on any thread but the reactor's (it blocks for the answer); the rest on the
// reactor thread, under the pass lock.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <evr/reactor/detail/wait_op.hpp>

#include "counters.hpp"
#include "delivery_batch.hpp"
#include "wait_registry.hpp"
#include "wakeup.hpp"

namespace evr::detail {

class detach_coordinator {
 public:
  detach_coordinator(std::shared_ptr<wakeup> wake, wait_registry& registry, delivery_batch& batch,
                     reactor_counters& counters)
      : wake_(std::move(wake)), registry_(registry), batch_(batch), counters_(counters) {}
  detach_coordinator(const detach_coordinator&) = delete;
  detach_coordinator& operator=(const detach_coordinator&) = delete;

  /// Any thread but the reactor's: queues the request, wakes the reactor and waits for its answer
  /// (nothing once its thread has ended: every wait completed).
  std::vector<wait_op*> request(std::uintptr_t group);

  /// (reactor) A request is queued (seq_cst: the reactor's last look before it sleeps).
  bool pending() const noexcept { return pending_.load(std::memory_order_seq_cst); }
  /// (reactor) Collects the queued requests' waits, after `take_submissions()` took the
  /// submission stack: waits submitted before a request was made may still be on it (the
  /// request's mutex, released by the requester and acquired here, orders their pushes before
  /// that take). Answers the requests under way once no cancel request is in flight.
  template <class TakeSubmissions>
  void take_requests(TakeSubmissions&& take_submissions);
  /// (reactor) A retired wait's cancel request arrived: true when its group is being detached (the
  /// wait is handed back, not delivered).
  bool claims(wait_op* op);
  /// (reactor) The thread ends: every request, queued or under way, is answered.
  void close() noexcept;
  /// (reactor, inside an inline handler: the loop is below) The same, done in place: takes the
  /// submissions, collects, then `take_cancels()` until no cancel request is in flight (those
  /// of this group are claimed, the others handled as the loop would).
  template <class TakeSubmissions, class TakeCancels>
  std::vector<wait_op*> detach_here(std::uintptr_t group, TakeSubmissions&& take_submissions,
                                    TakeCancels&& take_cancels);

 private:
  /// One detach_group call: what the reactor hands back.
  struct request_state {
    std::uintptr_t group = 0;
    std::vector<wait_op*> detached;  // (reactor) until done
    bool done = false;               // guarded by mutex_
  };
  void collect(request_state& req);          // from the registry and the batch
  void finish(request_state& req) noexcept;  // answers the requester

  std::shared_ptr<wakeup> wake_;
  wait_registry& registry_;
  delivery_batch& batch_;
  reactor_counters& counters_;
  std::mutex mutex_;
  std::condition_variable answered_;
  std::vector<request_state*> queue_;  // guarded by mutex_
  bool closed_ = false;                // guarded by mutex_: the thread has ended
  std::atomic<bool> pending_{false};
  std::vector<request_state*> under_way_;  // (reactor) collected, waiting for cancels in flight
};

template <class TakeSubmissions>
void detach_coordinator::take_requests(TakeSubmissions&& take_submissions) {
  if (pending_.load(std::memory_order_relaxed) &&
      pending_.exchange(false, std::memory_order_acq_rel)) {
    std::vector<request_state*> requests;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      requests.swap(queue_);
    }
    take_submissions();
    for (request_state* req : requests) {
      collect(*req);
      under_way_.push_back(req);
    }
  }
  // Cancellers push right after their CAS, so waiting for them is prompt.
  if (!under_way_.empty() && registry_.awaiting_cancel() == 0) {
    for (request_state* req : under_way_) finish(*req);
    under_way_.clear();
  }
}

template <class TakeSubmissions, class TakeCancels>
std::vector<wait_op*> detach_coordinator::detach_here(std::uintptr_t group,
                                                      TakeSubmissions&& take_submissions,
                                                      TakeCancels&& take_cancels) {
  request_state req;
  req.group = group;
  take_submissions();  // waits submitted from this handler, not yet taken
  collect(req);
  under_way_.push_back(&req);
  while (registry_.awaiting_cancel() > 0) {
    take_cancels();
    if (registry_.awaiting_cancel() > 0) std::this_thread::yield();
  }
  under_way_.erase(std::find(under_way_.begin(), under_way_.end(), &req));
  bump(counters_.detached, req.detached.size());
  return std::move(req.detached);
}

}  // namespace evr::detail
