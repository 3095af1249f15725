#include "event_poller.hpp"

#include <asio/post.hpp>

event_poller::event_poller(asio::io_context& io, std::size_t capacity) : io_(io) {
  pending_.reserve(capacity);
  finished_.reserve(capacity);
}

event_poller::~event_poller() {
  for (wait& w : pending_) w.op->destroy();
}

void event_poller::add(const wait& w) {
  pending_.push_back(w);
  schedule();
}

void event_poller::schedule() {
  if (scheduled_) return;
  scheduled_ = true;
  asio::post(io_, [this] { sweep(); });
}

void event_poller::sweep() {
  scheduled_ = false;
  std::size_t kept = 0;
  for (wait& w : pending_) {
    w.result = w.backend->query_event(w.event);
    if (evr::is_not_ready(w.result))
      pending_[kept++] = w;
    else
      finished_.push_back(w);
  }
  pending_.resize(kept);
  // The finished requests resume here, inline; one that starts its next wait adds to pending_
  // (not to finished_, which only this pass fills).
  for (const wait& w : finished_) w.op->complete(w.result);
  finished_.clear();
  if (!pending_.empty()) schedule();
}
