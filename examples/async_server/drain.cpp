#include "drain.hpp"

#include <cstdio>
#include <utility>

#include <asio/post.hpp>

#include "connection_table.hpp"
#include "metrics.hpp"

graceful_drain::graceful_drain(asio::any_io_executor control, std::chrono::milliseconds timeout,
                               std::mutex& mutex, const connection_table& table,
                               const server_metrics& metrics, std::function<void()> cut_off)
    : control_(std::move(control)),
      timeout_(timeout),
      mutex_(mutex),
      table_(table),
      metrics_(metrics),
      cut_off_(std::move(cut_off)),
      deadline_(control_) {}

void graceful_drain::start(std::function<void()> done) {
  draining_.store(true, std::memory_order_relaxed);
  done_ = std::move(done);
}

void graceful_drain::arm_deadline() {
  // The last connection may have closed before this ran: its end of the drain is posted
  // already, and a deadline armed now would keep this context's run() going until it fired.
  if (ended_) return;
  deadline_.expires_after(timeout_);
  deadline_.async_wait([this](std::error_code ec) {
    if (ec) return;
    // The deadline: what is still being served is cut off (its clients get no answer).
    std::size_t open = 0;
    {
      std::lock_guard lock(mutex_);
      if (ended_) return;  // ended as the timer fired: its cancel() came too late
      open = table_.size();
    }
    std::printf(
        "drain: the deadline (%.1f s) passed with %lld requests in flight on %zu "
        "connections: they are cut off\n",
        std::chrono::duration<double>(timeout_).count(),
        static_cast<long long>(metrics_.in_flight()), open);
    std::fflush(stdout);
    cut_off_();
  });
}

void graceful_drain::end_if_done() {
  if (!draining_.load(std::memory_order_relaxed) || table_.size() != 0 || ended_) return;
  ended_ = true;
  asio::post(control_, [this, done = std::move(done_)] {
    deadline_.cancel();
    if (done) done();
  });
}
