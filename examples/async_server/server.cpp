#include "server.hpp"

#include <pthread.h>

#include <algorithm>
#include <charconv>
#include <cmath>
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

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

/// v with one decimal, like printf's %.1f (but for halfway cases, which round away from zero),
/// without printf's cost (a few thousand instructions per call: it was 9 % of a /busy request).
void append_fixed1(std::string& out, double v) {
  if (!(std::fabs(v) < 1e15)) {  // NaN, infinities, absurd values: printf's way
    char buf[48];
    const int n = std::snprintf(buf, sizeof buf, "%.1f", v);
    out.append(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    return;
  }
  long long tenths = std::llround(v * 10);
  if (tenths < 0) {
    out += '-';
    tenths = -tenths;
  }
  append_uint(out, static_cast<std::uint64_t>(tenths / 10));
  out += '.';
  out += static_cast<char>('0' + tenths % 10);
}

std::string fixed1(double v) {
  std::string s;
  append_fixed1(s, v);
  return s;
}

std::int64_t to_ns(clock_type::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

double micros(clock_type::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

}  // namespace

struct server::connection {
  /// `wait`: what its GPU waits use (null in the blocking modes); `device`: the device it prefers.
  connection(asio::ip::tcp::socket s, const gpu_wait::source* wait, std::size_t device)
      : socket(std::move(s)), device(device) {
    body.reserve(256);  // a /busy answer is ~110 bytes, its response ~200: no growing later
    wire.reserve(512);
    if (wait != nullptr) {
      gpu.emplace(socket.get_executor(), *wait);
      mailbox.emplace(socket.get_executor(), 1);
    }
  }
  // On the connection's executor (evr, hostfunc, poll: its io_context's one thread; pool: its
  // strand; thread: its own thread), like everything below but deadline_ns.
  asio::ip::tcp::socket socket;
  const std::size_t device;  // its requests take this device's lanes first
  /// When the connection must have made progress (steady_clock, ns), 0: no deadline. Set by the
  /// connection, taken (exchanged with 0) by the sweep that closes it.
  std::atomic<std::int64_t> deadline_ns{0};
  std::optional<gpu_wait> gpu;                  // the non-blocking modes
  std::optional<mlp_batcher::mailbox> mailbox;  // the non-blocking modes: /mlp batches answer here
  // Reused from request to request (cleared, their capacity kept): no allocation per request once
  // they have grown to what this connection's requests need.
  std::string in;  // bytes read and not yet consumed: a pipelined request may follow a body
  http::request req;
  params::list query, form;
  std::string body;  // the response's body
  std::string wire;  // the response as sent
};

struct server::conn_thread {
  asio::io_context io{1};
  std::thread thread;
  std::atomic<bool> done{false};
};

server::server(std::vector<asio::io_context*> contexts, server_config cfg, lane_set& lanes,
               evr::reactor* reactor, const mlp::model& model, server_metrics& metrics)
    : contexts_(std::move(contexts)),
      cfg_(std::move(cfg)),
      lanes_(lanes),
      reactor_(cfg_.mode == wait_mode::evr ? reactor : nullptr),
      model_(model),
      metrics_(metrics),
      control_(cfg_.mode == wait_mode::pool
                   ? asio::any_io_executor(asio::make_strand(*contexts_.at(0)))
                   : asio::any_io_executor(contexts_.at(0)->get_executor())),
      acceptor_(control_),
      sweep_timer_(control_) {
  if (cfg_.mode == wait_mode::evr && reactor_ == nullptr)
    throw std::invalid_argument("server: wait_mode::evr needs a reactor");
  if (cfg_.check_every == 0) throw std::invalid_argument("server: check_every must be at least 1");
  if (cfg_.mode == wait_mode::evr && cfg_.busy_signal) {
    for (std::size_t d = 0; d < lanes.devices(); ++d) {
      lane_pool& pool = lanes.pool(d);
      for (std::size_t i = 0; i < pool.size(); ++i) {
        lane& l = pool.lane_at(i);
        l.use_signal(reactor_->pools().signals(l.stream().device()).acquire());
      }
    }
  }
  if (cfg_.mode == wait_mode::poll)
    for (asio::io_context* io : contexts_)
      pollers_.push_back(std::make_unique<event_poller>(*io, lanes.size()));
  if (!blocks_a_thread(cfg_.mode)) {
    // A batcher per device, spread over the io_contexts (its batches run on its context).
    for (std::size_t d = 0; d < lanes.devices(); ++d) {
      const std::size_t home = d % contexts_.size();
      batchers_.push_back(std::make_unique<mlp_batcher>(*contexts_[home], lanes.pool(d),
                                                        wait_source(home), model.dims(),
                                                        cfg_.batching, metrics));
    }
  }
  for (asio::io_context* io : contexts_) keep_running_.push_back(asio::make_work_guard(*io));
}

gpu_wait::source server::wait_source(std::size_t context) const noexcept {
  return {cfg_.mode, reactor_, pollers_.empty() ? nullptr : pollers_[context].get()};
}

lane_pool& server::home_pool(const connection& c) noexcept {
  return lanes_.pool(c.device % lanes_.devices());
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
  asio::co_spawn(control_, accept_loop(), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);  // a bug, not a client's doing: let run() report it
  });
  asio::co_spawn(control_, sweep_deadlines(), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
}

void server::stop() {
  std::unordered_set<std::shared_ptr<connection>> open;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> running;
  {
    std::lock_guard lock(mutex_);
    if (stopping_.load(std::memory_order_relaxed)) return;
    stopping_.store(true, std::memory_order_relaxed);
    open = connections_;
    running.swap(keep_running_);
  }
  asio::post(control_, [this] {
    std::error_code ignored;
    acceptor_.close(ignored);
    sweep_timer_.cancel();
  });
  // Each connection is closed on its own executor (or thread), where its coroutine runs.
  for (const auto& c : open) {
    asio::post(c->socket.get_executor(), [c] {
      std::error_code ignored;
      c->socket.close(ignored);
    });
  }
  // `running` goes now: each context's run() returns once its connections are done.
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
  asio::steady_timer backoff(control_);
  std::error_code ignored;
  acceptor_.non_blocking(true,
                         ignored);  // for the draining accepts below (async ones are unaffected)
  const bool own_threads = cfg_.mode == wait_mode::thread;
  for (;;) {
    placement where = next_placement();
    auto [ec, socket] = co_await acceptor_.async_accept(where.executor, use_tuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      // Out of descriptors and the like: say so and retry a little later instead of spinning.
      std::fprintf(stderr, "evr-async-server: accept: %s\n", ec.message().c_str());
      backoff.expires_after(std::chrono::milliseconds(50));
      co_await backoff.async_wait(use_tuple);
      continue;
    }
    if (own_threads) reap_conn_threads();
    if (!start_connection(std::move(socket), std::move(where))) co_return;
    // Then take what else is waiting in the backlog without another trip through the scheduler:
    // when every io thread is busy (pool mode), each trip can take milliseconds, and 256 clients
    // connecting at once would otherwise wait in line for one accept each.
    for (int i = 0; i < 256; ++i) {
      placement more_where = next_placement();
      asio::ip::tcp::socket more = acceptor_.accept(more_where.executor, ec);
      if (ec) break;  // would_block: the backlog is empty (other errors: the async accept reports)
      if (!start_connection(std::move(more), std::move(more_where))) co_return;
    }
  }
}

server::placement server::next_placement() {
  // thread: an io_context and thread of its own. pool: a strand of the shared io_context (its
  // socket and coroutine are only ever used from one thread at a time). The others: the next
  // io_context, round-robin (its one thread is the only one to touch the connection).
  if (cfg_.mode == wait_mode::thread) {
    auto t = new_conn_thread();
    return {t->io.get_executor(), t, 0};
  }
  if (cfg_.mode == wait_mode::pool) return {asio::make_strand(*contexts_[0]), nullptr, 0};
  const std::size_t i = next_context_++ % contexts_.size();
  return {contexts_[i]->get_executor(), nullptr, i};
}

bool server::start_connection(asio::ip::tcp::socket socket, placement where) {
  std::error_code ignored;
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);  // small responses, sent at once
  socket.non_blocking(true, ignored);  // responses are written at once when the socket takes them
  std::optional<gpu_wait::source> wait;
  if (!blocks_a_thread(cfg_.mode)) wait = wait_source(where.context);
  auto c = std::make_shared<connection>(std::move(socket), wait ? &*wait : nullptr,
                                        next_device_++ % lanes_.devices());
  std::shared_ptr<conn_thread>& own = where.own;
  {
    std::lock_guard lock(mutex_);
    if (stopping_.load(std::memory_order_relaxed)) return false;  // c's socket closes as it goes
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
      pthread_setname_np(pthread_self(), "evr-conn");
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

void server::arm_deadline(connection& c, std::chrono::nanoseconds after) noexcept {
  c.deadline_ns.store(to_ns(clock_type::now() + after), std::memory_order_relaxed);
}

asio::awaitable<void> server::sweep_deadlines() {
  using namespace std::chrono_literals;
  const auto period = std::clamp<clock_type::duration>(cfg_.io_timeout / 8, 10ms, 250ms);
  std::vector<std::shared_ptr<connection>> late;
  for (;;) {
    sweep_timer_.expires_after(period);
    auto [ec] = co_await sweep_timer_.async_wait(use_tuple);
    if (ec || stopping_.load(std::memory_order_relaxed)) co_return;
    const std::int64_t now = to_ns(clock_type::now());
    {
      std::lock_guard lock(mutex_);
      for (const auto& c : connections_) {
        std::int64_t d = c->deadline_ns.load(std::memory_order_relaxed);
        // Taken only if unchanged: a connection that made progress meanwhile has moved it.
        if (d != 0 && d <= now && c->deadline_ns.compare_exchange_strong(d, 0)) late.push_back(c);
      }
    }
    for (auto& c : late) {
      asio::post(c->socket.get_executor(), [c] {
        std::error_code ignored;
        c->socket.close(ignored);  // the pending read or write fails, the coroutine ends
      });
    }
    late.clear();
  }
}

void server::forget(const std::shared_ptr<connection>& c) {
  std::lock_guard lock(mutex_);
  connections_.erase(c);
}

asio::awaitable<void> server::serve(std::shared_ptr<connection> c) {
  struct forget_on_exit {
    server* self;
    std::shared_ptr<connection> c;
    ~forget_on_exit() { self->forget(c); }
  } guard{this, c};

  std::string& buffer = c->in;
  http::request& req = c->req;
  bool lingering_close = false;
  for (;;) {
    arm_deadline(*c, cfg_.io_timeout);
    auto [ec, head_size] = co_await asio::async_read_until(
        c->socket, asio::dynamic_buffer(buffer, http::max_head_bytes), head_end{}, use_tuple);
    const auto t0 = clock_type::now();
    response r;
    c->body.clear();
    if (ec == asio::error::not_found) {  // the head outgrew max_head_bytes
      req.clear();
      r = error_response(
          *c, 431,
          "the request head is larger than " + std::to_string(http::max_head_bytes) + " bytes",
          true);
    } else if (ec) {
      break;  // the peer closed (eof, reset), the deadline passed, or stop() closed the socket
    } else if (auto bad =
                   http::parse_request_head(std::string_view(buffer.data(), head_size), req)) {
      // After a malformed head we cannot know where the next request starts: answer and close.
      r = error_response(*c, bad->status, bad->message, true);
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
      req.body.assign(buffer, 0, req.content_length);
      buffer.erase(0, req.content_length);
      c->deadline_ns.store(0, std::memory_order_relaxed);  // the GPU work is not the client's delay
      struct in_flight {
        server_metrics& m;
        explicit in_flight(server_metrics& metrics) : m(metrics) { m.request_started(); }
        ~in_flight() { m.request_finished(); }
      } counted(metrics_);
      busy::spec spec;
      if (!busy_request(req, *c, spec, r)) {
        if (!healthz_request(req, *c, r)) r = co_await handle(req, *c);
      } else if (r.status == 200) {
        // GET /busy, the GPU-bound route, runs here rather than in handle() and run_busy():
        // GCC's frames for those coroutines are over 1 KiB, more than Asio's recycling allocator
        // keeps, so each request paid two allocations for them. serve()'s frame lives as long as
        // the connection.
        double gpu_us = 0;
        std::uint32_t result = 0;
        std::error_code ec;
        {
          lane_pool::lease lease = lanes_.try_acquire(c->device);
          if (!lease) {
            lane_pool& home = home_pool(*c);
            lease = home.adopt(co_await home.async_wait_lane(asio::use_awaitable));
          }
          if (!launch_busy(lease, spec, *c, r)) {
            const auto tw = clock_type::now();
            if (c->gpu) {
              auto [wec] = co_await c->gpu->async_wait(*lease, use_tuple);
              ec = wec;
            } else {
              ec = lease->wait_blocking(cfg_.sync);
            }
            const auto d = clock_type::now() - tw;
            gpu_us = micros(d);
            if (!ec) {
              waited(lease, "/busy", d);
              result = lease->busy_result();
            }
          }
        }  // the lane goes back before the answer is checked and sent
        if (r.status == 200) r = answer_busy(*c, spec, ec, result, gpu_us);
      }
    }

    const bool keep_alive =
        req.keep_alive && !r.close && !stopping_.load(std::memory_order_relaxed);
    c->wire.clear();
    http::append_response(c->wire, r.status, r.content_type, c->body, keep_alive, r.extra_headers);
    // At once when the socket takes it all, the usual case for a response this small (no Asio
    // operation, no trip through the scheduler); what it does not take, asynchronously.
    std::error_code wec;
    std::size_t sent = c->socket.write_some(asio::buffer(c->wire), wec);
    if (wec == asio::error::would_block || wec == asio::error::try_again) {
      wec.clear();
      sent = 0;
    }
    if (!wec && sent < c->wire.size()) {
      arm_deadline(*c, cfg_.io_timeout);
      auto [aec, n] = co_await asio::async_write(
          c->socket, asio::buffer(c->wire.data() + sent, c->wire.size() - sent), use_tuple);
      wec = aec;
    }
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
    arm_deadline(*c, std::chrono::seconds(1));
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

server::response server::error_response(connection& c, int status, std::string_view message,
                                        bool close) {
  response r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  c.body.clear();
  c.body += "error ";
  append_uint(c.body, static_cast<std::uint64_t>(status));
  c.body += ": ";
  c.body += message;
  c.body += '\n';
  r.close = close;
  return r;
}

bool server::sample_check() noexcept {
  return answers_.fetch_add(1, std::memory_order_relaxed) % cfg_.check_every == 0;
}

asio::awaitable<server::response> server::handle(const http::request& req, connection& c) {
  const std::string_view path = req.path();
  auto method_not_allowed = [&c](std::string_view what, const char* allow) {
    response r = error_response(c, 405, std::string(what) + " takes " + allow);
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
    c.body = metrics_.render(m ? &*m : nullptr, cfg_.info, open);
    co_return r;
  }

  const bool known = path == "/saxpy" || path == "/sum" || path == "/busy" || path == "/mlp";
  if (!known)
    co_return error_response(c, 404,
                             "no such path '" + std::string(path.substr(0, 64)) +
                                 "'; try /busy?us=2000, /mlp?seed=1, /saxpy?n=65536, "
                                 "/sum?n=65536, /healthz or /metrics");
  if (path == "/busy" ? req.method != "GET" : req.method != "GET" && req.method != "POST")
    co_return method_not_allowed(path, path == "/busy" ? "GET" : "GET, POST");

  // Parameters in the query; for POST /saxpy and /sum also in the body (form encoding), after any
  // in the query. POST /mlp carries its rows in the body (CSV).
  params::list& query = c.query;  // the connection's: reused, no allocation per request
  params::list& body_params = c.form;
  if (auto bad = http::parse_query(req.query(), query))
    co_return error_response(c, bad->status, bad->message);

  // (GET /busy is served by serve() itself: see busy_request.)
  if (path == "/mlp") {
    mlp::request mreq;
    if (auto bad = mlp::parse(query, req.body, req.method == "POST", model_.dims(),
                              cfg_.batching.max_rows, mreq))
      co_return error_response(c, bad->status, bad->message);
    co_return co_await run_mlp(mreq, c);
  }
  const job::kind kind = path == "/saxpy" ? job::kind::saxpy : job::kind::sum;
  if (req.method == "POST") {
    if (auto bad = http::parse_query(req.body, body_params))
      co_return error_response(c, bad->status, bad->message);
    query.insert(query.end(), body_params.begin(), body_params.end());
  }
  job::spec spec;
  if (auto bad = job::parse(kind, query, cfg_.max_n, spec)) co_return error_response(c, 400, *bad);
  co_return co_await run_job(spec, c);
}

asio::awaitable<std::error_code> server::wait_gpu(lane_pool::lease& lease, connection& c,
                                                  std::string_view path, double& waited_us) {
  const auto t0 = clock_type::now();
  std::error_code ec;
  if (c.gpu) {
    // evr, hostfunc, poll: this thread serves other connections until the work is done.
    auto [wec] = co_await c.gpu->async_wait(*lease, use_tuple);
    ec = wec;
  } else {
    // pool / thread: this thread can do nothing else until the GPU is done.
    ec = lease->wait_blocking(cfg_.sync);
  }
  const auto d = clock_type::now() - t0;
  waited_us = micros(d);
  if (!ec) waited(lease, path, d);
  co_return ec;
}

void server::waited(lane_pool::lease& lease, std::string_view path, clock_type::duration d) {
  lease.mark_idle();
  metrics_.record_gpu_wait(path, d);
}

asio::awaitable<server::response> server::run_job(const job::spec& spec, connection& c) {
  // Waits (suspended) while every lane is taken: bounded GPU memory and streams under any load.
  lane_pool::lease lease = lanes_.try_acquire(c.device);
  if (!lease) lease = co_await home_pool(c).acquire_waiting();
  lane& l = *lease;
  // (No co_return inside the handlers: the response is built after the try statement.)
  std::optional<response> refused;
  try {
    l.reserve(spec.n);
    job::fill_inputs(spec, l.x(), l.y());
    lease.mark_busy();  // from here on, an early exit drains the lane before it is reused
    l.enqueue(spec);
  } catch (const std::bad_alloc&) {
    refused = error_response(c, 503, "out of memory for n=" + std::to_string(spec.n));
  } catch (const std::exception& e) {
    refused = error_response(c, 500, std::string("launching the GPU work failed: ") + e.what());
  }
  if (refused) co_return std::move(*refused);

  double gpu_us = 0;
  const std::error_code ec =
      co_await wait_gpu(lease, c, spec.kind == job::kind::saxpy ? "/saxpy" : "/sum", gpu_us);
  if (ec) co_return error_response(c, 500, "waiting for the GPU failed: " + ec.message());

  double value = 0;
  if (auto wrong = job::check(spec, l.x(), l.y(), l.out(), l.sum(), value)) {
    metrics_.record_check(false);
    std::fprintf(stderr, "evr-async-server: %s (n=%zu seed=%u)\n", wrong->c_str(), spec.n,
                 spec.seed);
    co_return error_response(c, 500, *wrong);
  }
  metrics_.record_check(true);
  c.body = std::string("{\"op\":\"") + job::to_string(spec.kind) +
           "\",\"n\":" + std::to_string(spec.n) +
           (spec.kind == job::kind::saxpy ? ",\"a\":" + json_number(spec.a) : std::string()) +
           ",\"seed\":" + std::to_string(spec.seed) + ",\"result\":" + json_number(value) +
           ",\"checked\":true,\"wait_us\":" + fixed1(gpu_us) + ",\"wait\":\"" +
           to_string(cfg_.mode) + "\"}\n";
  co_return response{};
}

bool server::busy_request(const http::request& req, connection& c, busy::spec& spec, response& r) {
  if (req.path() != "/busy" || req.method != "GET") return false;
  if (auto bad = http::parse_query(req.query(), c.query)) {
    r = error_response(c, bad->status, bad->message);
  } else if (auto wrong = busy::parse(c.query, cfg_.max_busy_us, spec)) {
    r = error_response(c, 400, *wrong);
  } else {
    r = response{};
  }
  return true;
}

bool server::healthz_request(const http::request& req, connection& c, response& r) {
  if (req.path() != "/healthz") return false;
  if (req.method != "GET") {
    r = error_response(c, 405, "/healthz takes GET");
    r.extra_headers = "Allow: GET\r\n";
    return true;
  }
  r = response{};
  r.content_type = "text/plain; charset=utf-8";
  c.body = "ok\n";
  return true;
}

bool server::launch_busy(lane_pool::lease& lease, const busy::spec& spec, connection& c,
                         response& r) {
  try {
    lease.mark_busy();
    lease->enqueue_busy(spec);
    return false;
  } catch (const std::exception& e) {
    r = error_response(c, 500, std::string("launching the GPU work failed: ") + e.what());
    return true;
  }
}

server::response server::answer_busy(connection& c, const busy::spec& spec, std::error_code ec,
                                     std::uint32_t result, double gpu_us) {
  if (ec) return error_response(c, 500, "waiting for the GPU failed: " + ec.message());
  const bool checked = sample_check();
  if (checked) {
    const std::uint32_t want = busy_math::reference(spec.seed);
    metrics_.record_check(result == want);
    if (result != want) {
      const std::string msg = "wrong busy answer from the device: got " + std::to_string(result) +
                              ", the CPU says " + std::to_string(want);
      std::fprintf(stderr, "evr-async-server: %s (seed=%u)\n", msg.c_str(), spec.seed);
      return error_response(c, 500, msg);
    }
  }
  std::string& b = c.body;
  b += "{\"op\":\"busy\",\"us\":";
  append_uint(b, spec.us);
  b += ",\"seed\":";
  append_uint(b, spec.seed);
  b += ",\"result\":";
  append_uint(b, result);
  b += checked ? ",\"checked\":true,\"wait_us\":" : ",\"checked\":false,\"wait_us\":";
  append_fixed1(b, gpu_us);
  b += ",\"wait\":\"";
  b += to_string(cfg_.mode);
  b += "\"}\n";
  return response{};
}

asio::awaitable<server::response> server::run_mlp(const mlp::request& req, connection& c) {
  const mlp::shape& d = model_.dims();
  const std::size_t in = static_cast<std::size_t>(d.in), out = static_cast<std::size_t>(d.out);
  std::vector<float> outputs(req.rows * out);
  std::size_t batch_rows = req.rows;
  double gpu_us = 0;
  if (!batchers_.empty()) {
    // The request joins a batch of its device; this coroutine (not a thread) waits for it.
    const auto t0 = clock_type::now();
    mlp_batcher& batcher = *batchers_[c.device % batchers_.size()];
    const mlp_batcher::result r = co_await batcher.run(req, outputs.data(), *c.mailbox);
    gpu_us = micros(clock_type::now() - t0);
    if (r.ec) co_return error_response(c, 500, r.what);
    batch_rows = r.batch_rows;
  } else {
    // pool / thread: a batch of this request alone, waited for by blocking the thread.
    lane_pool::lease lease = lanes_.try_acquire(c.device);
    if (!lease) lease = co_await home_pool(c).acquire_waiting();
    lane& l = *lease;
    std::optional<response> refused;
    try {
      l.reserve_rows(req.rows);
      std::memcpy(l.mlp_input(), req.inputs.data(), req.rows * in * sizeof(float));
      lease.mark_busy();
      l.enqueue_mlp(req.rows);
    } catch (const std::exception& e) {
      refused = error_response(c, 500, std::string("launching the GPU work failed: ") + e.what());
    }
    if (refused) co_return std::move(*refused);
    const std::error_code ec = co_await wait_gpu(lease, c, "/mlp", gpu_us);
    if (ec) co_return error_response(c, 500, "waiting for the GPU failed: " + ec.message());
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
        co_return error_response(c, 500, msg);
      }
    }
    metrics_.record_check(true);
  }
  std::string& body = c.body;
  body = "{\"op\":\"mlp\",\"rows\":" + std::to_string(req.rows) +
         ",\"batch\":" + std::to_string(batch_rows);
  if (req.seed) body += ",\"seed\":" + std::to_string(*req.seed);
  body += ",\"checksums\":[";
  for (std::size_t row = 0; row < req.rows; ++row) {
    if (row != 0) body += ',';
    body += json_number(mlp::checksum(outputs.data() + row * out, d.out));
  }
  body += "],\"first\":[";
  for (std::size_t i = 0; i < 4 && i < out; ++i) {
    if (i != 0) body += ',';
    body += json_number(outputs[i]);
  }
  body += std::string("],\"checked\":") + (checked ? "true" : "false") +
          ",\"wait_us\":" + fixed1(gpu_us) + ",\"wait\":\"" + to_string(cfg_.mode) + "\"}\n";
  co_return response{};
}
