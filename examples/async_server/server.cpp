#include "server.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
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

namespace {

/// Nothing of a request waits in the socket's receive buffer (FIONREAD; an error counts as
/// nothing: the connection is closing anyway).
bool nothing_arrived(asio::ip::tcp::socket& socket) {
  std::error_code ec;
  const std::size_t n = socket.available(ec);
  return ec || n == 0;
}

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

std::int64_t to_ns(clock_type::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

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
      sweep_timer_(control_),
      budget_(cfg_.request_memory),
      large_turns_(cfg_.large_concurrency),
      large_threads_(cfg_.large_concurrency, "evr-large"),
      table_(cfg_.connections),
      drain_(control_, cfg_.drain_timeout, mutex_, table_, metrics_, [this] { stop(); }) {
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
  if (!blocks_a_thread(cfg_.mode))
    for (std::size_t i = 0; i < contexts_.size(); ++i)
      gpu_waits_.push_back(
          std::make_unique<gpu_wait>(contexts_[i]->get_executor(), wait_source(i)));
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
  if (spare_descriptor_ >= 0) ::close(spare_descriptor_);
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
  if (!ec && cfg_.reuse_port) {
    const int on = 1;
    if (::setsockopt(acceptor_.native_handle(), SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) != 0)
      ec = std::error_code(errno, std::generic_category());
  }
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("cannot listen on " + where + ": " + ec.message());
  port_ = acceptor_.local_endpoint().port();
  spare_descriptor_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
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
    open = table_.all();
    running.swap(keep_running_);
  }
  asio::post(control_, [this] {
    std::error_code ignored;
    acceptor_.close(ignored);
    sweep_timer_.cancel();
  });
  // Each connection is closed on its own executor (or thread), where its coroutine runs; a
  // request waiting for a lane, an admission slot or its batch is dropped there (its client can
  // get no answer now), one whose work is on the GPU finishes it.
  for (const auto& c : open) {
    asio::post(c->socket.get_executor(), [c] {
      std::error_code ignored;
      c->socket.close(ignored);
      abandon(*c);
    });
  }
  // `running` goes now: each context's run() returns once its connections are done.
}

void server::drain(std::function<void()> done) {
  std::unordered_set<std::shared_ptr<connection>> open;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> running;
  {
    std::lock_guard lock(mutex_);
    if (stopping_.load(std::memory_order_relaxed) || drain_.draining()) return;
    // Once it ended (on the control context, after its deadline is cancelled): the sweep timer,
    // which would keep that context's run() going, is cancelled too, then `done` runs.
    drain_.start([this, done = std::move(done)] {
      sweep_timer_.cancel();
      if (done) done();
    });
    open = table_.all();
    running.swap(keep_running_);
  }
  asio::post(control_, [this] {
    std::error_code ignored;
    acceptor_.close(ignored);
    std::lock_guard lock(mutex_);
    drain_.arm_deadline();
    drain_.end_if_done();
  });
  // A connection waiting for a request head has its read cancelled: serve() closes it when
  // nothing of a request has arrived (an idle keep-alive connection), and reads on otherwise.
  // The others close after the answer they are working on (keep-alive is off from now on).
  for (const auto& c : open) {
    asio::post(c->socket.get_executor(), [c] {
      if (c->reading_head.load(std::memory_order_relaxed)) {
        std::error_code ignored;
        c->socket.cancel(ignored);
      }
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
  asio::steady_timer backoff(control_);
  std::error_code ignored;
  acceptor_.non_blocking(true,
                         ignored);  // for the draining accepts below (async ones are unaffected)
  for (;;) {
    placement where = next_placement();
    auto [ec, socket] = co_await acceptor_.async_accept(where.executor, use_tuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      if (!accept_failed(ec)) {  // nothing shed: retry a little later instead of spinning
        // Out of descriptors with idle connections closing: once they are closed (5 ms).
        // Anything else: 50 ms.
        backoff.expires_after(
            std::chrono::milliseconds(ec == asio::error::no_descriptors ? 5 : 50));
        co_await backoff.async_wait(use_tuple);
      }
      continue;
    }
    admission a = admit(std::move(socket), std::move(where));
    // Then take what else is waiting in the backlog without another trip through the scheduler:
    // when every io thread is busy (pool mode), each trip can take milliseconds, and 256 clients
    // connecting at once would otherwise wait in line for one accept each. Not after an eviction:
    // the connections chosen close on their executors, and their descriptors must be free before
    // more are taken (the reserve holds one batch of them).
    for (int i = 0; i < 256 && a == admission::next; ++i) {
      placement more_where = next_placement();
      asio::ip::tcp::socket more = acceptor_.accept(more_where.executor, ec);
      if (ec) {  // would_block: the backlog is empty
        if (ec != asio::error::would_block && ec != asio::error::try_again) accept_failed(ec);
        break;
      }
      a = admit(std::move(more), std::move(more_where));
    }
    if (a == admission::stopping || a == admission::draining) co_return;
  }
}

bool server::accept_failed(const std::error_code& ec) {
  // (Asio 1.22's system category does not map errno values to std::errc: compare them.)
  const bool out_of_descriptors = ec.category() == asio::error::get_system_category() &&
                                  (ec.value() == EMFILE || ec.value() == ENFILE);
  std::size_t closed = 0;
  bool shed = false;
  if (out_of_descriptors) {
    // The limits keep connections within the descriptor limit, but other descriptors (or a lower
    // limit set from outside) can still run out. Close idle connections to make room (the loop
    // retries once they are closed, on their executors); when none is idle, take the connection
    // waiting in the backlog with the spare descriptor and close it at once (refused), so that
    // the loop neither spins on the same error nor leaves that client hanging.
    std::vector<std::shared_ptr<connection>> idle;
    {
      std::lock_guard lock(mutex_);
      table_.evict_idle(max_evicted_at_once, idle);
    }
    closed = idle.size();
    close_evicted(idle);
    if (closed == 0) shed = shed_one();
  }
  report_accept_error(ec, closed);
  return shed;
}

bool server::shed_one() {
  if (spare_descriptor_ < 0) return false;
  ::close(spare_descriptor_);
  const int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    metrics_.record_connection(connection_event::refused_descriptors);
  }
  spare_descriptor_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd >= 0;
}

void server::report_accept_error(const std::error_code& ec, std::size_t closed) {
  // At most once a second: a full server must not also flood its log.
  ++accept_errors_;
  const auto now = clock_type::now();
  if (now - last_accept_report_ < std::chrono::seconds(1)) return;
  std::fprintf(stderr,
               "evr-async-server: accept: %s (%llu times since the last report; %zu idle "
               "connections closed now)\n",
               ec.message().c_str(), static_cast<unsigned long long>(accept_errors_), closed);
  last_accept_report_ = now;
  accept_errors_ = 0;
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

server::admission server::admit(asio::ip::tcp::socket socket, placement where) {
  if (cfg_.mode == wait_mode::thread) reap_conn_threads();
  metrics_.record_connection(connection_event::accepted);
  std::error_code ec;
  const asio::ip::tcp::endpoint peer = socket.remote_endpoint(ec);
  if (ec) return admission::next;  // already reset by the client: nothing to serve
  socket.set_option(asio::ip::tcp::no_delay(true), ec);  // small responses, sent at once
  socket.non_blocking(true, ec);  // responses are written at once when the socket takes them
  gpu_wait* gpu = gpu_waits_.empty() ? nullptr : gpu_waits_[where.context].get();
  auto c = std::make_shared<connection>(std::move(socket), peer.address(), gpu,
                                        next_device_ % lanes_.devices());
  std::vector<std::shared_ptr<connection>> evicted;
  connection_table::verdict verdict;
  bool admitted_in_drain = false;
  {
    std::lock_guard lock(mutex_);
    // drain() posts the close of the listening socket, and an accept's completion may run
    // before it: a connection accepted after the drain began. Its client connected in time: it
    // is served as those before it (the drain answers its first request with Connection:
    // close). Only once the drain has ended, or the server stops, is it closed unserved.
    if (stopping_.load(std::memory_order_relaxed) || drain_.ended()) return admission::stopping;
    admitted_in_drain = drain_.draining();
    verdict = table_.admit(c, evicted);
    if (verdict == connection_table::verdict::admitted && where.own)
      conn_threads_.push_back(where.own);
  }
  close_evicted(evicted);
  if (verdict != connection_table::verdict::admitted) {
    refuse(*c, verdict);
  } else {
    ++next_device_;
    start_serving(c, where.own);
  }
  if (admitted_in_drain) return admission::draining;
  return evicted.empty() ? admission::next : admission::yield;
}

void server::refuse(connection& c, connection_table::verdict why) {
  const bool per_address = why == connection_table::verdict::over_address;
  metrics_.record_connection(per_address ? connection_event::refused_per_address
                                         : connection_event::refused_total);
  const connection_table::limits& l = table_.limit();  // (constant: no lock needed)
  const std::string body =
      per_address ? "error 503: too many connections from your address (at most " +
                        std::to_string(l.per_address) + "); retry later\n"
                  : "error 503: the server has all the connections it takes (" +
                        std::to_string(l.total) + ") and none of them is idle; retry later\n";
  // Best effort, without waiting: a fresh socket's buffer takes this at once.
  std::error_code ignored;
  c.socket.write_some(asio::buffer(http::format_response(503, "text/plain; charset=utf-8", body,
                                                         false, "Retry-After: 1\r\n")),
                      ignored);
  c.socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  c.socket.close(ignored);
}

void server::close_evicted(const std::vector<std::shared_ptr<connection>>& evicted) {
  for (const auto& c : evicted) {
    metrics_.record_connection(connection_event::evicted);
    asio::post(c->socket.get_executor(), [c] {
      std::error_code ignored;
      c->socket.close(ignored);  // its pending read fails, the coroutine ends
    });
  }
}

void server::start_serving(const std::shared_ptr<connection>& c,
                           const std::shared_ptr<conn_thread>& own) {
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
}

std::chrono::nanoseconds server::drain_grace() const noexcept {
  return std::min<std::chrono::nanoseconds>(cfg_.drain_idle_grace, cfg_.io_timeout);
}

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

void server::forget(const std::shared_ptr<connection>& c) {
  std::lock_guard lock(mutex_);
  table_.erase(c);
  drain_.end_if_done();
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
    // Draining, between requests on a kept-alive connection (drain() cancels the reads of those
    // already waiting; this one answered a request meanwhile): one more request is served if it
    // has arrived or arrives within drain_idle_grace (its client may have sent it before it could
    // see the drain), with `Connection: close`; then the connection closes.
    const bool idle_in_drain = draining() && buffer.empty() && nothing_arrived(c->socket);
    if (idle_in_drain && cfg_.drain_idle_grace.count() == 0) break;
    arm_deadline(*c, idle_in_drain ? drain_grace() : cfg_.io_timeout);
    c->reading_head.store(true, std::memory_order_relaxed);
    std::error_code ec;
    std::size_t head_size = 0;
    for (std::size_t skipped = 0;;) {
      auto [rec, n] = co_await asio::async_read_until(
          c->socket, asio::dynamic_buffer(buffer, http::max_head_bytes), head_end{}, use_tuple);
      // drain() cancelled the read: read on (a head trickling in is served, with Connection:
      // close); a connection with nothing of a request yet waits drain_idle_grace for one.
      if (rec == asio::error::operation_aborted && drain_.draining() &&
          !stopping_.load(std::memory_order_relaxed) && c->socket.is_open()) {
        const bool idle = buffer.empty() && nothing_arrived(c->socket);
        if (!idle) continue;
        if (cfg_.drain_idle_grace.count() != 0) {
          arm_deadline(*c, drain_grace());  // the sweep closes it then: the read fails
          continue;
        }
      }
      ec = rec;
      head_size = n;
      // Empty lines before a request line are skipped (RFC 9112 2.2). A "head" of empty lines
      // alone ends at the second one: drop it and read on (up to max_head_bytes of them; then
      // the parser calls what is left incomplete).
      if (ec || !http::only_line_ends(std::string_view(buffer.data(), n)) ||
          (skipped += n) > http::max_head_bytes)
        break;
      buffer.erase(0, n);
    }
    c->reading_head.store(false, std::memory_order_relaxed);
    if (!ec && draining()) arm_deadline(*c, cfg_.io_timeout);  // a grace was for the head alone
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
      c->serving.store(++c->requests, std::memory_order_relaxed);
      struct in_flight {
        server_metrics& m;
        explicit in_flight(server_metrics& metrics) : m(metrics) { m.request_started(); }
        ~in_flight() { m.request_finished(); }
      } counted(metrics_);
      busy::spec spec;
      if (!busy_request(req, *c, spec, r)) {
        if (!healthz_request(req, *c, r) && !readyz_request(req, *c, r))
          r = co_await handle(req, *c);
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
            lease = home.adopt(co_await home.async_wait_lane(
                asio::bind_cancellation_slot(c->abandon.slot(), asio::use_awaitable)));
          }
          if (!lease || c->gone) {
            r = abandoned_response(dropped::queued);
          } else if (!launch_busy(lease, spec, *c, r)) {
            const auto tw = clock_type::now();
            if (c->gpu) {
              auto [wec] = co_await c->gpu->async_wait(*lease, abandon_signal(*c), use_tuple);
              ec = wec;
            } else {
              ec = lease->wait_blocking(cfg_.sync);
            }
            const auto d = clock_type::now() - tw;
            gpu_us = micros(d);
            if (!ec) {
              waited(lease, "/busy", d);
              result = lease->busy_result();
            } else if (c->gone) {
              release_when_done(lease);
            }
          }
        }  // the lane goes back before the answer is checked and sent
        if (r.status == 200 && !c->gone) r = answer_busy(*c, spec, ec, result, gpu_us);
      }
      end_request(*c);
    }
    if (r.abandoned != dropped::no || c->gone) {
      // Nobody to answer: the request was dropped, or its answer would go nowhere.
      metrics_.record_abandoned(r.abandoned == dropped::queued);
      break;
    }

    const bool keep_alive =
        req.keep_alive && !r.close && !draining() &&
        (cfg_.max_connection_requests == 0 || c->requests < cfg_.max_connection_requests);
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

server::response server::abandoned_response(dropped stage) {
  response r;
  r.abandoned = stage;
  return r;
}

asio::cancellation_signal* server::abandon_signal(connection& c) noexcept {
  return c.watching ? &c.abandon : nullptr;
}

void server::release_when_done(lane_pool::lease& lease) {
  if (reactor_ == nullptr || !lease) return;  // only an evr wait is ever cancelled
  const evr::wait_target target(lease->stream());
  lease.mark_idle();  // destroyed only once the GPU is past `target`
  // On the first context: the lease goes back there, and run() does not return before it has.
  evr::release_after(*reactor_, target, std::move(lease), contexts_.front()->get_executor());
}

void server::end_request(connection& c) {
  c.serving.store(0, std::memory_order_relaxed);
  if (c.watching) {
    std::error_code ignored;
    c.socket.cancel(ignored);  // the watch's handler runs with operation_aborted
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
