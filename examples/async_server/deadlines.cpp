// The server's deadlines and abandoned requests (server.hpp): one sweep every io_timeout/8 closes
// the connections that missed their deadline and starts watching the sockets of requests still
// being served a sweep later, so that a client that went away has its request dropped.
#include "server.hpp"

#include <algorithm>
#include <utility>

#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include "use_tuple.hpp"

namespace {

std::int64_t to_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

void server::arm_deadline(connection& c, std::chrono::nanoseconds after) noexcept {
  c.deadline_ns.store(to_ns(clock_type::now() + after), std::memory_order_relaxed);
}

asio::awaitable<void> server::sweep_deadlines() {
  using namespace std::chrono_literals;
  const auto period = std::clamp<clock_type::duration>(cfg_.io_timeout / 8, 10ms, 50ms);
  std::vector<std::shared_ptr<connection>> late;
  std::vector<std::pair<std::shared_ptr<connection>, std::uint32_t>> slow;
  for (;;) {
    sweep_timer_.expires_after(period);
    auto [ec] = co_await sweep_timer_.async_wait(use_tuple);
    if (ec || stopping_.load(std::memory_order_relaxed)) co_return;
    {
      std::lock_guard lock(mutex_);
      if (drain_.ended()) co_return;  // (not "table empty": admit() may still take one in)
    }
    const std::int64_t now = to_ns(clock_type::now());
    {
      std::lock_guard lock(mutex_);
      for (const auto& c : table_.all()) {
        std::int64_t d = c->deadline_ns.load(std::memory_order_relaxed);
        // Taken only if unchanged: a connection that made progress meanwhile has moved it.
        if (d != 0 && d <= now && c->deadline_ns.compare_exchange_strong(d, 0)) late.push_back(c);
        // A request served since the last sweep at least: its client is watched from now on.
        const std::uint32_t serving = c->serving.load(std::memory_order_relaxed);
        if (serving != 0 && serving == c->swept) slow.emplace_back(c, serving);
        c->swept = serving;
      }
    }
    for (auto& c : late) {
      asio::post(c->socket.get_executor(), [c] {
        std::error_code ignored;
        c->socket.close(ignored);  // the pending read or write fails, the coroutine ends
      });
    }
    for (auto& entry : slow) {
      // Copied out of the pair: clang 14 cannot capture structured bindings.
      std::shared_ptr<connection> c = entry.first;
      const auto request = entry.second;
      asio::post(c->socket.get_executor(), [this, c, request] { watch_client(c, request); });
    }
    late.clear();
    slow.clear();
  }
}

void server::watch_client(const std::shared_ptr<connection>& c, std::uint32_t request) {
  if (c->watching || c->gone || c->serving.load(std::memory_order_relaxed) != request) return;
  c->watching = true;
  c->socket.async_wait(asio::ip::tcp::socket::wait_read,
                       [this, c](std::error_code ec) { client_readable(c, ec); });
}

void server::client_readable(const std::shared_ptr<connection>& c, std::error_code ec) {
  c->watching = false;
  if (ec || !c->socket.is_open()) return;
  // One byte peeked: a pipelined request (the client is there), nothing yet (woken for no
  // reason), or the end: the client closed or reset the connection. A client that only shut
  // down its sending side is taken as gone too, as proxies such as nginx do.
  char byte;
  std::error_code pec;
  const std::size_t n =
      c->socket.receive(asio::buffer(&byte, 1), asio::socket_base::message_peek, pec);
  if (n > 0 || pec == asio::error::would_block || pec == asio::error::try_again) return;
  abandon(*c);
}

void server::abandon(connection& c) {
  c.gone = true;
  c.abandon.emit(asio::cancellation_type::terminal);
}
