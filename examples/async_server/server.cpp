// The server (server.hpp): its life cycle (construction, start, stop, drain) and a connection's
// requests: reading each head and body, routing it, waiting for its GPU work and writing the
// answer (keep-alive, pipelining, 100-continue).
#include "server.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <utility>

#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/read_until.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include "use_tuple.hpp"

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

/// The label requests are counted under (a closed set: see server_metrics::paths).
std::string_view metrics_path(std::string_view path) {
  for (std::string_view p : server_metrics::paths)
    if (p == path) return p;
  return "other";
}

}  // namespace

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

std::chrono::nanoseconds server::drain_grace() const noexcept {
  return std::min<std::chrono::nanoseconds>(cfg_.drain_idle_grace, cfg_.io_timeout);
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
