// The server's graceful drain (server::drain: the first SIGTERM in serve mode, a fleet member
// being restarted): whether it is on, when it is over, and its deadline (--drain-seconds). It
// guards the drain's state: the draining flag (/readyz answers 503, keep-alive is off), whether
// its end was posted, the callback that end runs, and the deadline timer. The server calls it:
// starts it (after which it closes its listening socket and tells its connections), asks whether
// it is on, and tells it when a connection left the table; the drain ends once it is on and no
// connection is left, or at the deadline cuts off what is left (server::stop).
//
// Thread safety: the server's mutex, which guards its connection table, guards the state here
// too, so that "draining" and "no connection left" are seen together: start(), arm_deadline()
// and end_if_done() are called with it held. draining() is read without it (on every response);
// the flag only changes under it. The deadline timer is the control executor's (the accept
// loop's): arm_deadline() runs there, and so do the drain's end (posted) and the deadline.
// Lifetime: a member of the server; the mutex, table and metrics it is given outlive it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>

#include <asio/any_io_executor.hpp>
#include <asio/steady_timer.hpp>

class connection_table;
class server_metrics;

class graceful_drain {
 public:
  /// `control`: where the deadline's timer runs and the drain's end is posted. `timeout`: how long
  /// the requests accepted before the drain may take. `mutex` guards `table` and this drain's
  /// state. `cut_off`: what the deadline does to the connections left (server::stop; called on
  /// `control`, without the lock).
  graceful_drain(asio::any_io_executor control, std::chrono::milliseconds timeout,
                 std::mutex& mutex, const connection_table& table, const server_metrics& metrics,
                 std::function<void()> cut_off);
  graceful_drain(const graceful_drain&) = delete;
  graceful_drain& operator=(const graceful_drain&) = delete;

  /// start() was called. Read without the lock (on every response); changed under it.
  bool draining() const noexcept { return draining_.load(std::memory_order_relaxed); }
  /// (mutex held) The drain's end was posted: no connection may join the table any more.
  bool ended() const noexcept { return ended_; }
  /// (mutex held; not draining yet) The drain is on from now. `done` runs on the control executor
  /// once it ended (end_if_done), after the deadline is cancelled.
  void start(std::function<void()> done);
  /// (mutex held, on the control executor, once the listening socket is closed) Arms the
  /// deadline, unless the drain ended already.
  void arm_deadline();
  /// (mutex held) Draining and no connection left in the table: the drain ends (once), its end
  /// posted to the control executor. Called whenever a connection leaves the table, and once the
  /// deadline is armed.
  void end_if_done();

 private:
  asio::any_io_executor control_;
  std::chrono::milliseconds timeout_;
  std::mutex& mutex_;
  const connection_table& table_;
  const server_metrics& metrics_;
  std::function<void()> cut_off_;
  asio::steady_timer deadline_;        // on control_
  std::atomic<bool> draining_{false};  // read without the lock; changed under mutex_
  bool ended_ = false;                 // (mutex_) the drain's end was posted
  std::function<void()> done_;         // (mutex_) start()'s `done`
};
