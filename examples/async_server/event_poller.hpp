// The second GPU wait a user writes by hand, without evr (wait_mode::poll): each io thread records
// an event behind its requests' work and queries those events itself between I/O. One poller per
// io thread (per io_context, which only that thread runs).
//
// The loop a user writes is
//     for (;;) { io.poll(); query the pending events, resume the finished requests;
//                if nothing is pending: io.run_one(), sleeping in epoll }
// and this is that loop in Asio's own terms: while a wait is pending, a sweep (the queries) is
// posted to the io_context and re-posts itself after each pass, so the thread's run() alternates
// the sweep with its other handlers and a non-blocking look at the sockets (Asio's scheduler
// polls epoll without sleeping while handlers are queued); with nothing pending no sweep is queued
// and run() sleeps in epoll. Running the sweep inside run() rather than between run_one() calls
// lets the coroutines it resumes allocate from Asio's per-thread caches, as in every other mode.
//
// Events: one per lane, created once and recorded behind each piece of work on the lane (a lane
// has at most one piece of work pending, so "the oldest event of each stream" is every event).
// Each pass queries every pending event, oldest first: different routes finish out of order, so
// the first not-ready one says nothing about the others.
//
// Costs, by design of the approach: while any request of the thread is on the GPU the thread never
// sleeps (a core per io thread under load), and a pass costs one query per pending request. A
// device fault is reported: the query returns it and the request answers with a 500.
//
// Thread safety: everything on the io_context's one thread. Lifetime: the io_context outlives the
// poller; a wait still pending at destruction (the context was torn down with requests waiting)
// has its handler destroyed without running.
#pragma once

#include <cstddef>
#include <system_error>
#include <vector>

#include <asio/io_context.hpp>

#include <evr/evr.hpp>

#include "lanes.hpp"
#include "wait_op.hpp"

class event_poller {
 public:
  /// `capacity`: the most waits pending at once (the lanes: each wait holds one); reserved so
  /// that no request grows the lists.
  event_poller(asio::io_context& io, std::size_t capacity);
  ~event_poller();
  event_poller(const event_poller&) = delete;
  event_poller& operator=(const event_poller&) = delete;

  /// Completes `handler` (void(std::error_code)), on this poller's thread, once the work queued so
  /// far on `l` is done. On the poller's thread.
  template <typename Handler>
  void start(lane& l, Handler handler) {
    wait_op* op = wait_op::create(std::move(handler));
    evr::device::native_event event = nullptr;
    if (std::error_code ec = l.record_done_event(event)) {
      op->post_complete(ec);
      return;
    }
    add({l.stream().backend(), event, op, {}});
  }

 private:
  struct wait {
    evr::device::backend* backend;
    evr::device::native_event event;
    wait_op* op;
    std::error_code result;  // once found done
  };
  void add(const wait& w);
  void schedule();
  /// Queries every pending event once, completes the finished waits, and schedules the next
  /// pass while any is left.
  void sweep();

  asio::io_context& io_;
  std::vector<wait> pending_;   // oldest first
  std::vector<wait> finished_;  // of the current pass
  bool scheduled_ = false;      // a sweep is queued on io_
};
