// reactor/src/detach_coordinator.cpp — see detach_coordinator.hpp.
#include "detach_coordinator.hpp"

namespace evr::detail {

std::vector<wait_op*> detach_coordinator::request(std::uintptr_t group) {
  request_state req;
  req.group = group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return {};  // the thread has ended: every wait has completed
    queue_.push_back(&req);
  }
  pending_.store(true, std::memory_order_seq_cst);  // seq_cst: the wake handshake
  wake_->wake_urgent();
  std::unique_lock<std::mutex> lock(mutex_);
  answered_.wait(lock, [&] { return req.done; });
  return std::move(req.detached);
}

void detach_coordinator::collect(request_state& req) {
  registry_.remove_if([&](wait_op* op) {
    if (op->group_ != req.group) return false;
    op->detached_ = true;
    // A wait whose canceller still holds it is handed back when its request arrives (claims).
    if (registry_.settle(op)) req.detached.push_back(op);
    return true;
  });
  // Retired but not delivered yet (a batch is under way only when this runs from an inline
  // handler).
  batch_.detach_group(req.group, req.detached);
}

bool detach_coordinator::claims(wait_op* op) {
  if (op->group_ == 0) return false;
  for (request_state* req : under_way_) {
    if (req->group != op->group_) continue;
    op->detached_ = true;
    req->detached.push_back(op);
    return true;
  }
  return false;
}

void detach_coordinator::finish(request_state& req) noexcept {
  // Counted before the requester is answered: its thread sees in_flight without them.
  bump(counters_.detached, req.detached.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    req.done = true;  // the requester may return (and free `req`) from here on
  }
  answered_.notify_all();
}

void detach_coordinator::close() noexcept {
  // No wait is left: every queued or unanswered request has nothing (more) to detach.
  for (request_state* req : under_way_) finish(*req);
  under_way_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    for (request_state* req : queue_) req->done = true;
    queue_.clear();
  }
  answered_.notify_all();
}

}  // namespace evr::detail
