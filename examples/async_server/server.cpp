#include "server.hpp"

#include <cstdio>
#include <optional>
#include <utility>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

namespace {

/// Where a request head ends: at "\r\n\r\n", or at "\n\n" / "\n\r\n" so that a client using bare
/// LFs gets its 400 at once instead of a connection that waits for a terminator that never comes.
struct head_end {
  template <typename Iterator>
  std::pair<Iterator, bool> operator()(Iterator begin, Iterator end) const {
    for (Iterator i = begin; i != end; ++i) {
      if (*i != '\n') continue;
      Iterator j = i + 1;
      if (j == end) return {i, false};  // resume at this LF when more bytes arrive
      if (*j == '\n') return {j + 1, true};
      if (*j == '\r') {
        if (j + 1 == end) return {i, false};
        if (*(j + 1) == '\n') return {j + 2, true};
      }
    }
    return {end, false};
  }
};

}  // namespace

template <>
struct asio::is_match_condition<head_end> : std::true_type {};

namespace {

using clock_type = std::chrono::steady_clock;
constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);

/// The label requests are counted under (a closed set: see server_metrics::paths).
std::string_view metrics_path(std::string_view path) {
  for (std::string_view p : server_metrics::paths)
    if (p == path) return p;
  return "other";
}

/// The head as parse_request_head wants it: without the blank line that ends it. A head ended by
/// a bare LF is passed whole, so the parser reports the bare LF.
std::string_view head_without_blank_line(const std::string& buffer, std::size_t head_size) {
  const std::string_view head(buffer.data(), head_size);
  return head.ends_with("\r\n\r\n") ? head.substr(0, head_size - 2) : head;
}

std::string json_number(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string fixed1(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

}  // namespace

const char* to_string(wait_mode m) noexcept { return m == wait_mode::evr ? "evr" : "blocking"; }

struct server::connection {
  connection(asio::ip::tcp::socket s, evr::reactor* reactor)
      : socket(std::move(s)), deadline(socket.get_executor()) {
    if (reactor != nullptr) waiter.emplace(socket.get_executor(), *reactor);
  }
  asio::ip::tcp::socket socket;  // on the connection's strand, like everything below
  asio::steady_timer deadline;
  std::optional<evr::gpu_waiter> waiter;  // evr mode only
};

server::server(asio::io_context& io, server_config cfg, lane_pool& lanes, evr::reactor* reactor,
               server_metrics& metrics)
    : io_(io),
      cfg_(std::move(cfg)),
      lanes_(lanes),
      reactor_(cfg_.mode == wait_mode::evr ? reactor : nullptr),
      metrics_(metrics),
      accept_strand_(asio::make_strand(io)),
      acceptor_(accept_strand_) {
  if (cfg_.mode == wait_mode::evr && reactor_ == nullptr)
    throw std::invalid_argument("server: wait_mode::evr needs a reactor");
}

void server::start() {
  std::error_code ec;
  const asio::ip::address address = asio::ip::make_address(cfg_.address, ec);
  if (ec)
    throw std::runtime_error("'" + cfg_.address + "' is not an IP address (" + ec.message() + ")");
  const asio::ip::tcp::endpoint endpoint(address, cfg_.port);
  const std::string where = cfg_.address + ":" + std::to_string(cfg_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("cannot listen on " + where + ": " + ec.message());
  port_ = acceptor_.local_endpoint().port();
  asio::co_spawn(accept_strand_, accept_loop(), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);  // a bug, not a client's doing: let run() report it
  });
}

void server::stop() {
  std::unordered_set<std::shared_ptr<connection>> open;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    open = connections_;
  }
  asio::post(accept_strand_, [this] {
    std::error_code ignored;
    acceptor_.close(ignored);
  });
  // Each connection is closed on its own strand, where its coroutine runs.
  for (const auto& c : open) {
    asio::post(c->socket.get_executor(), [c] {
      std::error_code ignored;
      c->socket.close(ignored);
      c->deadline.cancel();
    });
  }
}

asio::awaitable<void> server::accept_loop() {
  asio::steady_timer backoff(accept_strand_);
  std::error_code ignored;
  acceptor_.non_blocking(true,
                         ignored);  // for the draining accepts below (async ones are unaffected)
  for (;;) {
    // Every connection gets its own strand: with several io threads, its socket and timer are
    // only ever used from one at a time.
    auto [ec, socket] = co_await acceptor_.async_accept(asio::make_strand(io_), use_tuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      // Out of descriptors and the like: say so and retry a little later instead of spinning.
      std::fprintf(stderr, "evr-async-server: accept: %s\n", ec.message().c_str());
      backoff.expires_after(std::chrono::milliseconds(50));
      co_await backoff.async_wait(use_tuple);
      continue;
    }
    if (!start_connection(std::move(socket))) co_return;
    // Then take what else is waiting in the backlog without another trip through the scheduler:
    // when every io thread is busy (blocking mode), each trip can take milliseconds, and 256
    // clients connecting at once would otherwise wait in line for one accept each.
    for (int i = 0; i < 256; ++i) {
      asio::ip::tcp::socket more = acceptor_.accept(asio::make_strand(io_), ec);
      if (ec) break;  // would_block: the backlog is empty (other errors: the async accept reports)
      if (!start_connection(std::move(more))) co_return;
    }
  }
}

bool server::start_connection(asio::ip::tcp::socket socket) {
  std::error_code ignored;
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);  // small responses, sent at once
  auto c = std::make_shared<connection>(std::move(socket), reactor_);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return false;  // c's socket closes as it goes
    connections_.insert(c);
  }
  asio::co_spawn(c->socket.get_executor(), serve(c), [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "evr-async-server: connection ended by an exception: %s\n", ex.what());
    }
  });
  return true;
}

void server::arm_deadline(const std::shared_ptr<connection>& c) {
  // Re-arming cancels the previous wait (its handler sees operation_aborted and does nothing).
  c->deadline.expires_after(cfg_.io_timeout);
  c->deadline.async_wait([weak = std::weak_ptr<connection>(c)](std::error_code ec) {
    if (ec) return;
    if (auto c = weak.lock()) {
      std::error_code ignored;
      c->socket.close(ignored);  // the pending read or write fails, the coroutine ends
    }
  });
}

void server::forget(const std::shared_ptr<connection>& c) {
  c->deadline.cancel();
  std::lock_guard lock(mutex_);
  connections_.erase(c);
}

asio::awaitable<void> server::serve(std::shared_ptr<connection> c) {
  struct forget_on_exit {
    server* self;
    std::shared_ptr<connection> c;
    ~forget_on_exit() { self->forget(c); }
  } guard{this, c};

  std::string buffer;  // bytes read and not yet consumed: a pipelined request may follow a body
  bool lingering_close = false;
  for (;;) {
    arm_deadline(c);
    auto [ec, head_size] = co_await asio::async_read_until(
        c->socket, asio::dynamic_buffer(buffer, http::max_head_bytes), head_end{}, use_tuple);
    const auto t0 = clock_type::now();
    response r;
    http::request req;
    if (ec == asio::error::not_found) {  // the head outgrew max_head_bytes
      r = error_response(
          431, "the request head is larger than " + std::to_string(http::max_head_bytes) + " bytes",
          true);
    } else if (ec) {
      break;  // the peer closed (eof, reset), the deadline fired, or stop() closed the socket
    } else if (auto bad =
                   http::parse_request_head(head_without_blank_line(buffer, head_size), req)) {
      // After a malformed head we cannot know where the next request starts: answer and close.
      r = error_response(bad->status, std::move(bad->message), true);
    } else {
      buffer.erase(0, head_size);
      if (buffer.size() < req.content_length) {
        // curl sends "Expect: 100-continue" before bodies over 1 KiB and waits ~1 s for this.
        if (const std::string* expect = req.header("expect");
            expect != nullptr && http::iequals(*expect, "100-continue")) {
          static constexpr std::string_view go_on = "HTTP/1.1 100 Continue\r\n\r\n";
          auto [cec, cn] = co_await asio::async_write(c->socket, asio::buffer(go_on), use_tuple);
          if (cec) break;
        }
        auto [bec, n] = co_await asio::async_read(
            c->socket, asio::dynamic_buffer(buffer),
            asio::transfer_exactly(req.content_length - buffer.size()), use_tuple);
        if (bec) break;
      }
      req.body = buffer.substr(0, req.content_length);
      buffer.erase(0, req.content_length);
      c->deadline.cancel();  // the GPU work is not the client's delay
      r = co_await handle(req, *c);
    }

    bool keep_alive = req.keep_alive && !r.close;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) keep_alive = false;
    }
    const std::string wire =
        http::format_response(r.status, r.content_type, r.body, keep_alive, r.extra_headers);
    arm_deadline(c);
    auto [wec, written] = co_await asio::async_write(c->socket, asio::buffer(wire), use_tuple);
    metrics_.record(req.target.empty() ? "other" : metrics_path(req.path()), r.status,
                    clock_type::now() - t0);
    if (wec) break;
    if (!keep_alive) {
      lingering_close = r.close;
      break;
    }
  }

  std::error_code ignored;
  if (lingering_close && c->socket.is_open()) {
    // An error response was sent while the client may still be sending (an oversized head, a
    // body we refused). Closing with unread bytes makes the kernel send a reset, which can
    // destroy our response before the client reads it; so stop sending, then read and discard
    // until the client closes, for at most ~1 s and 64 KiB (what servers call lingering close).
    c->socket.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    c->deadline.expires_after(std::chrono::seconds(1));
    c->deadline.async_wait([weak = std::weak_ptr<connection>(c)](std::error_code ec) {
      if (auto c = weak.lock(); c && !ec) {
        std::error_code ignored;
        c->socket.close(ignored);
      }
    });
    char sink[4096];
    for (std::size_t drained = 0; drained < 64 * 1024;) {
      auto [rec, n] = co_await c->socket.async_read_some(asio::buffer(sink), use_tuple);
      if (rec) break;
      drained += n;
    }
  } else {
    c->socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  }
  c->socket.close(ignored);
}

server::response server::error_response(int status, std::string message, bool close) {
  response r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = "error " + std::to_string(status) + ": " + message + "\n";
  r.close = close;
  return r;
}

asio::awaitable<server::response> server::handle(const http::request& req, connection& c) {
  const std::string_view path = req.path();
  if (path == "/metrics") {
    if (req.method != "GET") {
      response r = error_response(405, "/metrics takes GET");
      r.extra_headers = "Allow: GET\r\n";
      co_return r;
    }
    const std::optional<evr::reactor_metrics> m =
        reactor_ != nullptr ? std::optional(reactor_->metrics()) : std::nullopt;
    response r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_.render(m ? &*m : nullptr, to_string(cfg_.mode), cfg_.device_label,
                             cfg_.strategy_label);
    co_return r;
  }

  job::kind kind;
  if (path == "/saxpy")
    kind = job::kind::saxpy;
  else if (path == "/sum")
    kind = job::kind::sum;
  else
    co_return error_response(404, "no such path '" + std::string(path.substr(0, 64)) +
                                      "'; try /saxpy?n=65536, /sum?n=65536 or /metrics");

  if (req.method != "GET" && req.method != "POST") {
    response r =
        error_response(405, "/" + std::string(job::to_string(kind)) + " takes GET or POST");
    r.extra_headers = "Allow: GET, POST\r\n";
    co_return r;
  }
  // GET: parameters in the query. POST: in the body (form encoding), after any in the query.
  std::vector<std::pair<std::string, std::string>> params, body_params;
  if (auto bad = http::parse_query(req.query(), params))
    co_return error_response(bad->status, bad->message);
  if (req.method == "POST") {
    if (auto bad = http::parse_query(req.body, body_params))
      co_return error_response(bad->status, bad->message);
    params.insert(params.end(), body_params.begin(), body_params.end());
  }
  job::spec spec;
  if (auto bad = job::parse(kind, params, cfg_.max_n, spec)) co_return error_response(400, *bad);
  co_return co_await run_job(spec, c);
}

asio::awaitable<server::response> server::run_job(const job::spec& spec, connection& c) {
  // Waits (suspended) while every lane is taken: bounded GPU memory and streams under any load.
  lane_pool::lease lease = co_await lanes_.acquire();
  lane& l = *lease;
  // (No co_return inside the handlers: the response is built after the try statement.)
  std::optional<response> refused;
  try {
    l.reserve(spec.n);
    job::fill_inputs(spec, l.x(), l.y());
    lease.mark_busy();  // from here on, an early exit drains the lane before it is reused
    l.enqueue(spec);
  } catch (const std::bad_alloc&) {
    refused = error_response(503, "out of memory for n=" + std::to_string(spec.n));
  } catch (const std::exception& e) {
    refused = error_response(500, std::string("launching the GPU work failed: ") + e.what());
  }
  if (refused) co_return std::move(*refused);

  const auto t0 = clock_type::now();
  std::error_code ec;
  if (c.waiter) {
    // evr: this thread serves other connections until the reactor sees the stream done.
    auto [wec] = co_await c.waiter->async_wait(l.stream(), use_tuple);
    ec = wec;
  } else {
    // blocking: the comparison server. This thread can do nothing else until the GPU is done.
    ec = l.synchronize();
  }
  const double gpu_us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
  if (ec) co_return error_response(500, "waiting for the GPU failed: " + ec.message());
  lease.mark_idle();

  double value = 0;
  if (auto wrong = job::check(spec, l.x(), l.y(), l.out(), l.sum(), value)) {
    std::fprintf(stderr, "evr-async-server: %s (n=%zu seed=%u)\n", wrong->c_str(), spec.n,
                 spec.seed);
    co_return error_response(500, *wrong);
  }
  response r;
  r.body = std::string("{\"op\":\"") + job::to_string(spec.kind) +
           "\",\"n\":" + std::to_string(spec.n) +
           (spec.kind == job::kind::saxpy ? ",\"a\":" + json_number(spec.a) : std::string()) +
           ",\"seed\":" + std::to_string(spec.seed) + ",\"result\":" + json_number(value) +
           ",\"checked\":true,\"wait_us\":" + fixed1(gpu_us) + ",\"wait\":\"" +
           to_string(cfg_.mode) + "\"}\n";
  co_return r;
}
