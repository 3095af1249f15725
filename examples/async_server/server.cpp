#include "server.hpp"

#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <evr/callbacks/asio_compat.hpp>

#include "busy_math.hpp"

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
constexpr auto use_tuple = evr::compat::as_tuple(asio::use_awaitable);

/// The label requests are counted under (a closed set: see server_metrics::paths).
std::string_view metrics_path(std::string_view path) {
  for (std::string_view p : server_metrics::paths)
    if (p == path) return p;
  return "other";
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

double micros(clock_type::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

}  // namespace

const char* to_string(wait_mode m) noexcept {
  switch (m) {
    case wait_mode::evr: return "evr";
    case wait_mode::pool: return "pool";
    case wait_mode::thread: return "thread";
  }
  return "?";
}

struct server::connection {
  connection(asio::ip::tcp::socket s, evr::reactor* reactor)
      : socket(std::move(s)), deadline(socket.get_executor()) {
    if (reactor != nullptr) {
      waiter.emplace(socket.get_executor(), *reactor);
      mailbox.emplace(socket.get_executor(), 1);
    }
  }
  asio::ip::tcp::socket socket;  // on the connection's strand, like everything below
  asio::steady_timer deadline;
  std::optional<evr::gpu_waiter> waiter;        // evr mode only
  std::optional<mlp_batcher::mailbox> mailbox;  // evr mode only: /mlp batches answer here
};

struct server::conn_thread {
  asio::io_context io{1};
  std::thread thread;
  std::atomic<bool> done{false};
};

server::server(asio::io_context& io, server_config cfg, lane_pool& lanes, evr::reactor* reactor,
               const mlp::model& model, server_metrics& metrics)
    : io_(io),
      cfg_(std::move(cfg)),
      lanes_(lanes),
      reactor_(cfg_.mode == wait_mode::evr ? reactor : nullptr),
      model_(model),
      metrics_(metrics),
      accept_strand_(asio::make_strand(io)),
      acceptor_(accept_strand_) {
  if (cfg_.mode == wait_mode::evr && reactor_ == nullptr)
    throw std::invalid_argument("server: wait_mode::evr needs a reactor");
  if (cfg_.check_every == 0) throw std::invalid_argument("server: check_every must be at least 1");
  if (reactor_ != nullptr)
    batcher_ =
        std::make_unique<mlp_batcher>(io, lanes, *reactor_, model.dims(), cfg_.batching, metrics);
}

server::~server() {
  stop();
  join_connection_threads();
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
  // Each connection is closed on its own strand (or thread), where its coroutine runs.
  for (const auto& c : open) {
    asio::post(c->socket.get_executor(), [c] {
      std::error_code ignored;
      c->socket.close(ignored);
      c->deadline.cancel();
    });
  }
}

void server::join_connection_threads() {
  std::list<std::shared_ptr<conn_thread>> threads;
  {
    std::lock_guard lock(mutex_);
    threads.swap(conn_threads_);
  }
  for (auto& t : threads)
    if (t->thread.joinable()) t->thread.join();
}

std::shared_ptr<server::conn_thread> server::new_conn_thread() {
  return std::make_shared<conn_thread>();
}

void server::reap_conn_threads() {
  std::list<std::shared_ptr<conn_thread>> finished;
  {
    std::lock_guard lock(mutex_);
    for (auto it = conn_threads_.begin(); it != conn_threads_.end();) {
      if ((*it)->done.load(std::memory_order_acquire)) {
        finished.push_back(std::move(*it));
        it = conn_threads_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& t : finished) t->thread.join();  // already past run(): returns at once
}

asio::awaitable<void> server::accept_loop() {
  asio::steady_timer backoff(accept_strand_);
  std::error_code ignored;
  acceptor_.non_blocking(true,
                         ignored);  // for the draining accepts below (async ones are unaffected)
  const bool own_threads = cfg_.mode == wait_mode::thread;
  // Each connection gets its own strand (with several io threads, its socket and timer are only
  // ever used from one at a time) or, in thread mode, its own io_context and thread.
  auto next = [&]() -> std::pair<asio::any_io_executor, std::shared_ptr<conn_thread>> {
    if (!own_threads) return {asio::make_strand(io_), nullptr};
    auto t = new_conn_thread();
    return {t->io.get_executor(), t};
  };
  for (;;) {
    auto [ex, own] = next();
    auto [ec, socket] = co_await acceptor_.async_accept(ex, use_tuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      // Out of descriptors and the like: say so and retry a little later instead of spinning.
      std::fprintf(stderr, "evr-async-server: accept: %s\n", ec.message().c_str());
      backoff.expires_after(std::chrono::milliseconds(50));
      co_await backoff.async_wait(use_tuple);
      continue;
    }
    if (own_threads) reap_conn_threads();
    if (!start_connection(std::move(socket), std::move(own))) co_return;
    // Then take what else is waiting in the backlog without another trip through the scheduler:
    // when every io thread is busy (pool mode), each trip can take milliseconds, and 256 clients
    // connecting at once would otherwise wait in line for one accept each.
    for (int i = 0; i < 256; ++i) {
      auto [ex2, own2] = next();
      asio::ip::tcp::socket more = acceptor_.accept(ex2, ec);
      if (ec) break;  // would_block: the backlog is empty (other errors: the async accept reports)
      if (!start_connection(std::move(more), std::move(own2))) co_return;
    }
  }
}

bool server::start_connection(asio::ip::tcp::socket socket, std::shared_ptr<conn_thread> own) {
  std::error_code ignored;
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);  // small responses, sent at once
  auto c = std::make_shared<connection>(std::move(socket), reactor_);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return false;  // c's socket closes as it goes
    connections_.insert(c);
    if (own) conn_threads_.push_back(own);
  }
  asio::co_spawn(c->socket.get_executor(), serve(c), [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "evr-async-server: connection ended by an exception: %s\n", ex.what());
    }
  });
  if (own) {
    // The thread runs this one connection and ends with it. Its io_context (and so the thread's
    // only reference to it) is kept by conn_threads_ until joined.
    own->thread = std::thread([t = own.get()] {
      try {
        t->io.run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "evr-async-server: connection thread: %s\n", e.what());
      }
      t->done.store(true, std::memory_order_release);
    });
  }
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
                   http::parse_request_head(std::string_view(buffer.data(), head_size), req)) {
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
      struct in_flight {
        server_metrics& m;
        explicit in_flight(server_metrics& metrics) : m(metrics) { m.request_started(); }
        ~in_flight() { m.request_finished(); }
      } counted(metrics_);
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
    // until the client closes, for at most ~1 s and 256 KiB (what servers call lingering close;
    // more than the largest body refused, so that the client reads its response before any reset).
    c->socket.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    c->deadline.expires_after(std::chrono::seconds(1));
    c->deadline.async_wait([weak = std::weak_ptr<connection>(c)](std::error_code ec) {
      if (auto c = weak.lock(); c && !ec) {
        std::error_code ignored;
        c->socket.close(ignored);
      }
    });
    char sink[4096];
    for (std::size_t drained = 0; drained < 256 * 1024;) {
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

bool server::sample_check() noexcept {
  return answers_.fetch_add(1, std::memory_order_relaxed) % cfg_.check_every == 0;
}

asio::awaitable<server::response> server::handle(const http::request& req, connection& c) {
  const std::string_view path = req.path();
  auto method_not_allowed = [](std::string_view what, const char* allow) {
    response r = error_response(405, std::string(what) + " takes " + allow);
    r.extra_headers = std::string("Allow: ") + allow + "\r\n";
    return r;
  };
  if (path == "/metrics") {
    if (req.method != "GET") co_return method_not_allowed("/metrics", "GET");
    const std::optional<evr::reactor_metrics> m =
        reactor_ != nullptr ? std::optional(reactor_->metrics()) : std::nullopt;
    response r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    std::size_t open = 0;
    {
      std::lock_guard lock(mutex_);
      open = connections_.size();
    }
    r.body = metrics_.render(m ? &*m : nullptr, cfg_.info, open);
    co_return r;
  }

  const bool known = path == "/saxpy" || path == "/sum" || path == "/busy" || path == "/mlp";
  if (!known)
    co_return error_response(404, "no such path '" + std::string(path.substr(0, 64)) +
                                      "'; try /busy?us=2000, /mlp?seed=1, /saxpy?n=65536, "
                                      "/sum?n=65536 or /metrics");
  if (path == "/busy" ? req.method != "GET" : req.method != "GET" && req.method != "POST")
    co_return method_not_allowed(path, path == "/busy" ? "GET" : "GET, POST");

  // Parameters in the query; for POST /saxpy and /sum also in the body (form encoding), after any
  // in the query. POST /mlp carries its rows in the body (CSV).
  params::list query, body_params;
  if (auto bad = http::parse_query(req.query(), query))
    co_return error_response(bad->status, bad->message);

  if (path == "/busy") {
    busy::spec spec;
    if (auto bad = busy::parse(query, cfg_.max_busy_us, spec)) co_return error_response(400, *bad);
    co_return co_await run_busy(spec, c);
  }
  if (path == "/mlp") {
    mlp::request mreq;
    if (auto bad = mlp::parse(query, req.body, req.method == "POST", model_.dims(),
                              cfg_.batching.max_rows, mreq))
      co_return error_response(bad->status, bad->message);
    co_return co_await run_mlp(mreq, c);
  }
  const job::kind kind = path == "/saxpy" ? job::kind::saxpy : job::kind::sum;
  if (req.method == "POST") {
    if (auto bad = http::parse_query(req.body, body_params))
      co_return error_response(bad->status, bad->message);
    query.insert(query.end(), body_params.begin(), body_params.end());
  }
  job::spec spec;
  if (auto bad = job::parse(kind, query, cfg_.max_n, spec)) co_return error_response(400, *bad);
  co_return co_await run_job(spec, c);
}

asio::awaitable<std::error_code> server::wait_gpu(lane_pool::lease& lease, connection& c,
                                                  std::string_view path, double& waited_us) {
  const auto t0 = clock_type::now();
  std::error_code ec;
  if (c.waiter) {
    // evr: this thread serves other connections until the reactor sees the stream done.
    auto [wec] = co_await c.waiter->async_wait(lease->stream(), use_tuple);
    ec = wec;
  } else {
    // pool / thread: this thread can do nothing else until the GPU is done.
    ec = lease->wait_blocking(cfg_.sync);
  }
  const auto waited = clock_type::now() - t0;
  waited_us = micros(waited);
  if (!ec) {
    lease.mark_idle();
    metrics_.record_gpu_wait(path, waited);
  }
  co_return ec;
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

  double gpu_us = 0;
  const std::error_code ec =
      co_await wait_gpu(lease, c, spec.kind == job::kind::saxpy ? "/saxpy" : "/sum", gpu_us);
  if (ec) co_return error_response(500, "waiting for the GPU failed: " + ec.message());

  double value = 0;
  if (auto wrong = job::check(spec, l.x(), l.y(), l.out(), l.sum(), value)) {
    metrics_.record_check(false);
    std::fprintf(stderr, "evr-async-server: %s (n=%zu seed=%u)\n", wrong->c_str(), spec.n,
                 spec.seed);
    co_return error_response(500, *wrong);
  }
  metrics_.record_check(true);
  response r;
  r.body = std::string("{\"op\":\"") + job::to_string(spec.kind) +
           "\",\"n\":" + std::to_string(spec.n) +
           (spec.kind == job::kind::saxpy ? ",\"a\":" + json_number(spec.a) : std::string()) +
           ",\"seed\":" + std::to_string(spec.seed) + ",\"result\":" + json_number(value) +
           ",\"checked\":true,\"wait_us\":" + fixed1(gpu_us) + ",\"wait\":\"" +
           to_string(cfg_.mode) + "\"}\n";
  co_return r;
}

asio::awaitable<server::response> server::run_busy(const busy::spec& spec, connection& c) {
  std::uint32_t result = 0;
  double gpu_us = 0;
  {
    lane_pool::lease lease = co_await lanes_.acquire();
    std::optional<response> refused;
    try {
      lease.mark_busy();
      lease->enqueue_busy(spec);
    } catch (const std::exception& e) {
      refused = error_response(500, std::string("launching the GPU work failed: ") + e.what());
    }
    if (refused) co_return std::move(*refused);
    const std::error_code ec = co_await wait_gpu(lease, c, "/busy", gpu_us);
    if (ec) co_return error_response(500, "waiting for the GPU failed: " + ec.message());
    result = lease->busy_result();
  }  // the lane goes back before the answer is checked and sent
  const bool checked = sample_check();
  if (checked) {
    const std::uint32_t want = busy_math::reference(spec.seed);
    metrics_.record_check(result == want);
    if (result != want) {
      const std::string msg = "wrong busy answer from the device: got " + std::to_string(result) +
                              ", the CPU says " + std::to_string(want);
      std::fprintf(stderr, "evr-async-server: %s (seed=%u)\n", msg.c_str(), spec.seed);
      co_return error_response(500, msg);
    }
  }
  response r;
  r.body = "{\"op\":\"busy\",\"us\":" + std::to_string(spec.us) +
           ",\"seed\":" + std::to_string(spec.seed) + ",\"result\":" + std::to_string(result) +
           ",\"checked\":" + (checked ? "true" : "false") + ",\"wait_us\":" + fixed1(gpu_us) +
           ",\"wait\":\"" + to_string(cfg_.mode) + "\"}\n";
  co_return r;
}

asio::awaitable<server::response> server::run_mlp(const mlp::request& req, connection& c) {
  const mlp::shape& d = model_.dims();
  const std::size_t in = static_cast<std::size_t>(d.in), out = static_cast<std::size_t>(d.out);
  std::vector<float> outputs(req.rows * out);
  std::size_t batch_rows = req.rows;
  double gpu_us = 0;
  if (batcher_) {
    // evr: the request joins a batch; this coroutine (not a thread) waits for the batch.
    const auto t0 = clock_type::now();
    const mlp_batcher::result r = co_await batcher_->run(req, outputs.data(), *c.mailbox);
    gpu_us = micros(clock_type::now() - t0);
    if (r.ec) co_return error_response(500, r.what);
    batch_rows = r.batch_rows;
  } else {
    // pool / thread: a batch of this request alone, waited for by blocking the thread.
    lane_pool::lease lease = co_await lanes_.acquire();
    lane& l = *lease;
    std::optional<response> refused;
    try {
      l.reserve_rows(req.rows);
      std::memcpy(l.mlp_input(), req.inputs.data(), req.rows * in * sizeof(float));
      lease.mark_busy();
      l.enqueue_mlp(req.rows);
    } catch (const std::exception& e) {
      refused = error_response(500, std::string("launching the GPU work failed: ") + e.what());
    }
    if (refused) co_return std::move(*refused);
    const std::error_code ec = co_await wait_gpu(lease, c, "/mlp", gpu_us);
    if (ec) co_return error_response(500, "waiting for the GPU failed: " + ec.message());
    std::memcpy(outputs.data(), l.mlp_output(), outputs.size() * sizeof(float));
    metrics_.record_batch(req.rows);
  }

  const bool checked = sample_check();
  if (checked) {
    std::vector<float> want(out);
    for (std::size_t r = 0; r < req.rows; ++r) {
      model_.forward(req.inputs.data() + r * in, want.data());
      if (auto wrong = mlp::compare_row(outputs.data() + r * out, want.data(), d.out)) {
        metrics_.record_check(false);
        const std::string msg =
            "wrong mlp answer from the device, row " + std::to_string(r) + ", " + *wrong;
        std::fprintf(stderr, "evr-async-server: %s\n", msg.c_str());
        co_return error_response(500, msg);
      }
    }
    metrics_.record_check(true);
  }
  response r;
  r.body = "{\"op\":\"mlp\",\"rows\":" + std::to_string(req.rows) +
           ",\"batch\":" + std::to_string(batch_rows);
  if (req.seed) r.body += ",\"seed\":" + std::to_string(*req.seed);
  r.body += ",\"checksums\":[";
  for (std::size_t row = 0; row < req.rows; ++row) {
    if (row != 0) r.body += ',';
    r.body += json_number(mlp::checksum(outputs.data() + row * out, d.out));
  }
  r.body += "],\"first\":[";
  for (std::size_t i = 0; i < 4 && i < out; ++i) {
    if (i != 0) r.body += ',';
    r.body += json_number(outputs[i]);
  }
  r.body += std::string("],\"checked\":") + (checked ? "true" : "false") +
            ",\"wait_us\":" + fixed1(gpu_us) + ",\"wait\":\"" + to_string(cfg_.mode) + "\"}\n";
  co_return r;
}
