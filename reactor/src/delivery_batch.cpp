// reactor/src/delivery_batch.cpp — see delivery_batch.hpp.
#include "delivery_batch.hpp"

#include <algorithm>

namespace evr::detail {
namespace {

/// The batch this thread is delivering, while it runs a posted completion (null otherwise:
/// outside deliver(), and while an inline completion runs user code).
thread_local delivery_batch* delivering_batch = nullptr;

/// Marks this thread as delivering `batch` for the duration of one posted completion.
class delivering_scope {
 public:
  explicit delivering_scope(delivery_batch* batch) noexcept { delivering_batch = batch; }
  ~delivering_scope() { delivering_batch = nullptr; }
  delivering_scope(const delivering_scope&) = delete;
  delivering_scope& operator=(const delivering_scope&) = delete;
};

}  // namespace

bool hold_until_batch_end(deferred_posts& d) noexcept {
  delivery_batch* batch = delivering_batch;
  return batch != nullptr && batch->hold(d);
}

bool delivery_batch::hold(deferred_posts& d) noexcept {
  for (std::size_t i = 0; i < held_count_; ++i) {
    if (held_[i] == &d) return true;
  }
  if (held_count_ == held_.size()) return false;
  held_[held_count_++] = &d;
  return true;
}

void delivery_batch::flush_held() noexcept {
  for (std::size_t i = 0; i < held_count_; ++i) held_[i]->flush();
  held_count_ = 0;
}

bool delivery_batch::posted_only() const noexcept {
  return std::none_of(ready_.begin(), ready_.end(), [](const auto& r) {
    return r.first != nullptr && r.first->how_ == delivery::inline_on_reactor;
  });
}

void delivery_batch::detach_group(std::uintptr_t group, std::vector<wait_op*>& out) {
  // Entries are nulled, never erased: a deliver() under way (an inline handler detaching) stays
  // valid.
  for (auto& [op, ec] : ready_) {
    if (op != nullptr && op->group_ == group) {
      op->detached_ = true;
      out.push_back(op);
      op = nullptr;
    }
  }
}

void delivery_batch::count(const wait_op& op, std::error_code ec, clock::time_point detected,
                           clock::time_point now) noexcept {
  if (!ec) {
    bump(counters_.completed);
  } else if (ec == aborted_error()) {
    bump(counters_.cancelled);
  } else {
    bump(counters_.failed);
  }
  add_sample(counters_.detect_to_deliver, now - detected);
  add_sample(counters_.submit_to_deliver, now - op.submitted_at_);
}

void delivery_batch::deliver(clock::time_point detected) {
  if (ready_.empty()) return;
  // Inline handlers may call submit/cancel/stop: those only push onto the stacks.
  const clock::time_point now = clock::now();
  for (std::size_t i = 0; i < ready_.size(); ++i) {
    auto [op, ec] = ready_[i];
    if (op == nullptr) continue;  // detached from an inline handler
    // Delivered entries are nulled: an inline handler's detach scans the batch and must not
    // touch operations already freed by their completion (this one included).
    ready_[i].first = nullptr;
    count(*op, ec, detected, now);
    if (op->how_ == delivery::inline_on_reactor) {
      flush_held();
      op->complete(ec);  // frees op; runs the user's handler here
    } else {
      delivering_scope scope(this);
      op->complete(ec);  // frees op, or hands it to a post (held back or not)
    }
  }
  flush_held();
  ready_.clear();
}

}  // namespace evr::detail
