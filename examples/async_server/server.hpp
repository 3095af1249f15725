// The HTTP server: accepts connections, reads requests (keep-alive, pipelining), runs each
// request's GPU work on a lane and answers with the result.
//
// Routes:
//   GET|POST /saxpy?n=N[&a=A][&seed=S]   y = a*x + y on N floats  } CPU-bound: filling and checking
//   GET|POST /sum?n=N[&seed=S]           the sum of N floats      } the inputs dominate (job.hpp)
//   GET      /busy?us=D[&seed=S]         a kernel of D us on one block: GPU-bound (busy.hpp)
//   GET|POST /mlp?seed=S[&rows=R]        an MLP forward pass, dynamically batched in evr mode
//                                        (mlp.hpp, batcher.hpp)
//   GET      /healthz                    "ok": no GPU work (alive; the cost of the HTTP path alone)
//   GET      /readyz                     "ready" (200) while it takes work, 503 once draining
//   GET      /metrics                    Prometheus text format (metrics.hpp)
//
// Five ways to wait for the GPU (wait_mode.hpp), everything else identical:
//   * evr       the request's coroutine co_awaits evr::gpu_waiter::async_wait: its thread serves
//               other connections meanwhile, so N threads keep any number of requests in flight
//               (up to the lanes).
//   * hostfunc  the same coroutine, resumed by a host function behind its work that posts to its
//   * poll      io_context (host_func_wait.hpp), or by its io thread, which queries its requests'
//               events between I/O (event_poller.hpp): the two waits a user writes without evr.
//   * pool      a pool of N threads; a request blocks its thread until its GPU work is done
//               (sync_kind: spin, the driver's default, or blocking-sync): requests in flight <= N.
//   * thread    a thread per connection, which blocks the same way: requests in flight <=
//               connections (and lanes), at the price of a thread each.
// evr, hostfunc and poll share everything but the wait (gpu_wait.hpp), /mlp batching included.
//
// Threads:
//   * evr, hostfunc, poll: one io_context per thread (N of them); the acceptor (on the first)
//     hands connections to the contexts round-robin, and a connection lives on its context's
//     plain executor, no strand: only that context's one thread ever runs its socket and
//     coroutine. Nothing is shared between the threads on a request's path but the lane pools
//     (lock-free) and what the mode waits with (evr: the reactor; hostfunc: the driver's
//     host-function thread; poll: nothing), and evr's delivery sees a plain io_context executor
//     (its batched posts apply).
//   * pool: one io_context run by N threads, each connection on its own strand. A blocking pool
//     needs the shared queue: any idle thread must take the next ready connection (with an
//     io_context per thread a connection would wait behind the blocked thread it was pinned to).
//   * thread: each accepted connection gets a thread of its own running a private io_context for
//     that one socket, so its reads, writes and waits block only that thread.
// Files: a connection's requests (read, route, answer), start, stop and drain in server.cpp; the
// accept loop, placement and admission against the limits in accept.cpp; the deadline sweep and
// abandoned requests in deadlines.cpp; what each route does in routes.cpp; the drain's state and
// deadline in drain.cpp.
// GPUs: the lanes of every device used (lane_set.hpp); each connection prefers one device,
// round-robin at accept, and /mlp has a batcher per device.
// Deadlines (idle and slow clients): a connection stores when it must next make progress; one
// sweep every io_timeout/8 (at most 50 ms) closes the late ones. No timer per request.
// Abandoned requests: the same sweep starts watching the socket of a connection whose request it
// finds still being served a sweep later (no cost for the quick ones): a client that closes or
// resets its connection then has its request dropped if it still waits for a lane, an admission
// slot or its /mlp batch (cancellation slots), its evr wait cancelled if its work is on the GPU
// (the lane goes back once the GPU is done: evr::release_after), and no answer written. stop()
// does the same for every connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <evr/evr.hpp>

#include "batcher.hpp"
#include "busy.hpp"
#include "connection.hpp"
#include "connection_table.hpp"
#include "drain.hpp"
#include "event_poller.hpp"
#include "gpu_wait.hpp"
#include "http.hpp"
#include "index_pool.hpp"
#include "job.hpp"
#include "lane_set.hpp"
#include "lanes.hpp"
#include "memory_budget.hpp"
#include "metrics.hpp"
#include "mlp.hpp"
#include "offload_threads.hpp"
#include "wait_mode.hpp"

struct server_config {
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;  ///< 0: an ephemeral port (see server::port())
  wait_mode mode = wait_mode::evr;
  sync_kind sync = sync_kind::spin;  ///< pool and thread modes
  std::size_t max_n = std::size_t{1} << 22;
  std::uint32_t max_busy_us = 100000;
  /// /busy and /mlp: every check_every-th answer is compared with the CPU's reference (/saxpy and
  /// /sum: every answer; that CPU work is what those routes are about).
  std::uint32_t check_every = 16;
  /// evr mode: every lane gets an evr::signal_slot and /busy's kernel signals it when its answer
  /// is written (a device-signalled wait: nothing added to the stream, a memory read for the
  /// io thread); false: the wait puts a marker behind the kernel, as in every other mode.
  bool busy_signal = true;
  /// evr, hostfunc, poll; the blocking modes run each /mlp request alone.
  mlp_batcher::options batching;
  /// A connection that sends no complete request head (or does not take its response) for this
  /// long is closed: keeps idle keep-alive clients and slow senders from holding sockets forever.
  std::chrono::milliseconds io_timeout{30000};
  /// A connection's Nth request is answered with `Connection: close` (0: no limit): clients
  /// reconnect, and a balancer that balances connections rather than requests (HAProxy in mode
  /// tcp, SO_REUSEPORT) spreads them again, e.g. over a server restarted a moment ago.
  std::uint32_t max_connection_requests = 0;
  /// Open connections at most, and from one client address (connection_table.hpp; the command
  /// line derives the defaults from the descriptor limit: cli.hpp).
  connection_table::limits connections{10000, 10000};
  /// Bytes that the requests being served may hold beyond the lanes' standing buffers
  /// (memory_budget.hpp): /mlp rows, large /saxpy and /sum buffers. Over it: 503.
  std::uint64_t request_memory = std::uint64_t{512} << 20;
  /// /saxpy and /sum above this n are large: buffers of their own (from request_memory, given
  /// back afterwards), at most large_concurrency at once (the rest wait their turn), filled and
  /// checked on large-request threads rather than an io thread.
  std::size_t large_n = std::size_t{1} << 18;
  std::size_t large_concurrency = 2;
  /// drain(): how long the requests accepted before it may take before stop() ends the rest.
  std::chrono::milliseconds drain_timeout{30000};
  /// drain(): how long a connection between requests may take to send one more, which is then
  /// answered with `Connection: close`, before it is closed. A client in a closed loop has its
  /// next request on the way when the drain begins; a connection closed at once would fail that
  /// request, which only a client that resends survives. 0: idle connections close at once.
  std::chrono::milliseconds drain_idle_grace{250};
  /// SO_REUSEPORT on the listening socket: several server processes may listen on one port (the
  /// kernel spreads new connections over them).
  bool reuse_port = false;
  server_metrics::info info;  ///< for evr_server_info
};

class server {
 public:
  /// `contexts`: the io_contexts connections run on (evr, hostfunc, poll: one per io thread;
  /// pool and thread modes: one, the pool's or the accept loop's). The accept loop and the
  /// deadline sweep run on the first. `reactor` is required in wait_mode::evr and ignored
  /// otherwise. `model` is the /mlp model (its reference checks answers; the lanes hold its
  /// weights). All must outlive the server. Until stop(), the server keeps every context's run()
  /// from returning.
  server(std::vector<asio::io_context*> contexts, server_config cfg, lane_set& lanes,
         evr::reactor* reactor, const mlp::model& model, server_metrics& metrics);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Binds, listens and starts accepting (on the io_context's threads). Throws std::runtime_error
  /// naming the address and the reason when the address is invalid or the port cannot be bound.
  void start();
  std::uint16_t port() const noexcept { return port_; }
  const server_config& config() const noexcept { return cfg_; }

  /// Stops accepting and closes every connection; a request being served finishes its GPU work
  /// first (its response then fails to send). When all are gone, io_context::run() returns.
  /// Thread-safe, idempotent.
  void stop();

  /// Stops taking new work and lets the work accepted finish (SIGTERM in serve mode; a fleet
  /// member being restarted): the listening socket closes (new connections are refused, a load
  /// balancer sends them elsewhere), /readyz answers 503, idle keep-alive connections (nothing
  /// of a request arrived) are closed, and each request read or arriving gets its answer with
  /// `Connection: close`. When the last
  /// connection is gone, run() returns; what is left after config().drain_timeout is stopped as
  /// stop() does. `done` (optional) runs on the accept loop's context once no connection is
  /// left (e.g. to cancel a signal wait that would keep that context's run() going). Thread-safe,
  /// idempotent; stop() after it ends the drain at once.
  void drain(std::function<void()> done = {});
  /// drain() or stop() was called: /readyz answers 503.
  bool draining() const noexcept {
    return drain_.draining() || stopping_.load(std::memory_order_relaxed);
  }

  /// wait_mode::thread: joins every connection thread (call after stop(), once the io threads
  /// have returned). Other modes: nothing to do.
  void join_connection_threads();

 private:
  using clock_type = std::chrono::steady_clock;
  static double micros(clock_type::duration d) noexcept {
    return std::chrono::duration<double, std::micro>(d).count();
  }
  /// Why a request got no answer: its client left (or the server stopped) while it waited for a
  /// lane, an admission slot or its batch (queued: dropped, no GPU work), or while its work ran.
  enum class dropped : std::uint8_t { no, queued, running };
  /// A response's head fields; its body is written into the connection's body buffer (reused
  /// from request to request: no allocation once it has grown to the largest body).
  struct response {
    int status = 200;
    std::string_view content_type = "application/json";  ///< always a literal
    std::string extra_headers;        ///< "Name: value\r\n" lines (error responses only)
    bool close = false;               ///< close the connection after this response
    dropped abandoned = dropped::no;  ///< not `no`: nothing is sent, the connection closes
  };
  struct conn_thread;  // wait_mode::thread: a connection's own io_context and thread
  /// Where an accepted connection runs: its executor, its own thread (thread mode) and the index
  /// of its io_context in contexts_ (the modes with one per thread).
  struct placement {
    asio::any_io_executor executor;
    std::shared_ptr<conn_thread> own;
    std::size_t context = 0;
  };

  asio::awaitable<void> accept_loop();
  /// Where the next accepted connection goes (accept loop only: round-robin state).
  placement next_placement();
  /// What the accept loop does after admit(): go on, let the evicted connections close first,
  /// or end: the drain began (the connection was admitted; what is still in the backlog stays
  /// with the kernel for the port's other listeners) or the server is stopping.
  enum class admission { next, yield, draining, stopping };
  /// An accepted socket: registered and served, or refused (a limit: connection_table.hpp).
  admission admit(asio::ip::tcp::socket socket, placement where);
  /// After a failed accept: reports it (at most once a second) and, when out of descriptors,
  /// closes idle connections, or when none is idle refuses one waiting connection with the spare
  /// descriptor. True when that shed a connection (the loop may go on at once).
  bool accept_failed(const std::error_code& ec);
  /// Closes the spare descriptor, accepts a waiting connection with it and closes that; reopens
  /// the spare. True when there was one.
  bool shed_one();
  void report_accept_error(const std::error_code& ec, std::size_t closed);
  /// Connections closed at once when out of descriptors: what the descriptor reserve holds
  /// beside the process's own (cli.hpp).
  static constexpr std::size_t max_evicted_at_once = 64;
  /// Answers 503 (Retry-After) without waiting and closes.
  void refuse(connection& c, connection_table::verdict why);
  /// Closes connections the table chose to make room (on their executors).
  void close_evicted(const std::vector<std::shared_ptr<connection>>& evicted);
  void start_serving(const std::shared_ptr<connection>& c, const std::shared_ptr<conn_thread>& own);
  /// What the waits of the connections and batchers on contexts_[context] use (non-blocking
  /// modes).
  gpu_wait::source wait_source(std::size_t context) const noexcept;
  /// The lane pool of the connection's own device (where it waits when every lane is taken).
  lane_pool& home_pool(const connection& c) noexcept;
  std::shared_ptr<conn_thread> new_conn_thread();
  void reap_conn_threads();
  asio::awaitable<void> serve(std::shared_ptr<connection> c);
  asio::awaitable<response> handle(const http::request& req, connection& c);
  asio::awaitable<response> run_job(const job::spec& spec, connection& c);
  /// A /saxpy or /sum above large_n (server_config says how it is served).
  asio::awaitable<response> run_large_job(const job::spec& spec, connection& c);
  struct large_outcome {
    int status = 200;
    std::string message;  ///< when status is not 200
    double value = 0, gpu_us = 0;
  };
  /// On a large-request thread: fill, enqueue, wait (blocking), check, give the buffers back.
  large_outcome run_large_step(const job::spec& spec, lane_pool::lease& lease);
  /// Compares the lane's result with the CPU (and counts it); what was wrong, or nothing.
  std::optional<std::string> check_job(const job::spec& spec, lane& l, double& value);
  response job_answer(connection& c, const job::spec& spec, double value, double gpu_us) const;
  static std::string_view job_path(const job::spec& spec) noexcept;
  /// The request buffers a /saxpy or /sum of n elements holds (memory_budget).
  static std::uint64_t job_bytes(std::size_t n) noexcept;
  /// 503 with Retry-After: the server is full for now, not broken.
  static response overloaded_response(connection& c, std::string_view message);
  response over_budget(connection& c, std::uint64_t bytes) const;
  /// GET /busy, served inline by serve(): false when `req` is not one; else true, with `spec`
  /// parsed, or with an error response in `r` (status != 200) when its parameters are bad.
  bool busy_request(const http::request& req, connection& c, busy::spec& spec, response& r);
  /// GET /healthz, served inline by serve() (no GPU work, no coroutine frame): false when `req`
  /// is not for /healthz; else true, with its fixed answer (or a 405) in `r`.
  bool healthz_request(const http::request& req, connection& c, response& r);
  /// GET /readyz: 200 while the server takes work (listening, lanes set up, the reactor running
  /// in evr mode); 503 once it drains or stops. A load balancer's health check.
  bool readyz_request(const http::request& req, connection& c, response& r);
  /// A probe's answer in `r`: `text` (200), or 405 for a method other than GET, or 503 with
  /// Retry-After naming `not_ready` when that is not null.
  void probe_answer(const http::request& req, connection& c, response& r, const char* text,
                    const char* not_ready);
  /// Enqueues the busy kernel on the lease's lane; true (and the 500 in `r`) when that failed.
  bool launch_busy(lane_pool::lease& lease, const busy::spec& spec, connection& c, response& r);
  /// The answer once the work is done (or the wait failed: ec).
  response answer_busy(connection& c, const busy::spec& spec, std::error_code ec,
                       std::uint32_t result, double gpu_us);
  asio::awaitable<response> run_mlp(const mlp::request& req, connection& c);
  /// Waits for the work queued so far on the lease's lane, the way this server's mode waits.
  asio::awaitable<std::error_code> wait_gpu(lane_pool::lease& lease, connection& c,
                                            std::string_view path, double& waited_us);
  /// After a successful wait: the lane is idle, the wait goes to the metrics.
  void waited(lane_pool::lease& lease, std::string_view path, clock_type::duration d);
  bool sample_check() noexcept;
  static response abandoned_response(dropped stage);
  /// What a GPU wait of `c` binds for cancellation: its abandon signal while the client is
  /// watched (so only a request that has waited a sweep period pays for it), else nothing.
  static asio::cancellation_signal* abandon_signal(connection& c) noexcept;
  /// Evr mode, after a wait cancelled because the client left: gives the lane back once the GPU
  /// is done with the work queued on it (evr::release_after), without waiting here.
  void release_when_done(lane_pool::lease& lease);
  /// The request's answer is ready: the sweep no longer counts it, the watch (if any) ends.
  static void end_request(connection& c);
  /// On c's executor: while request `request` is still being served, waits for the socket to
  /// become readable, which is how a client leaving (FIN or RST) shows (client_readable).
  void watch_client(const std::shared_ptr<connection>& c, std::uint32_t request);
  void client_readable(const std::shared_ptr<connection>& c, std::error_code ec);
  /// On c's executor: the client is gone; cancels what its request waits for.
  static void abandon(connection& c);
  /// Writes "error <status>: <message>" into c's body.
  static response error_response(connection& c, int status, std::string_view message,
                                 bool close = false);
  void arm_deadline(connection& c, std::chrono::nanoseconds after) noexcept;
  /// How long a drained connection between requests is left to send its last one.
  std::chrono::nanoseconds drain_grace() const noexcept;
  asio::awaitable<void> sweep_deadlines();
  void forget(const std::shared_ptr<connection>& c);

  std::vector<asio::io_context*> contexts_;
  std::size_t next_context_ = 0;  // round-robin (accept loop only)
  std::size_t next_device_ = 0;   // round-robin (accept loop only)
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> keep_running_;
  server_config cfg_;
  lane_set& lanes_;
  evr::reactor* reactor_;
  const mlp::model& model_;
  server_metrics& metrics_;
  std::vector<std::unique_ptr<event_poller>> pollers_;  // poll mode: one per context
  std::vector<std::unique_ptr<gpu_wait>> gpu_waits_;    // non-blocking modes: one per context
  std::vector<std::unique_ptr<mlp_batcher>> batchers_;  // non-blocking modes: one per device
  std::atomic<std::uint64_t> answers_{0};               // for sample_check
  /// Where the accept loop and the deadline sweep run: the first context's plain executor, which
  /// one thread runs (a strand would cost every sweep timer's completion an allocation), or in
  /// pool mode, where all the pool's threads run that context, a strand of it.
  asio::any_io_executor control_;
  asio::ip::tcp::acceptor acceptor_;
  asio::steady_timer sweep_timer_;  // on control_
  std::uint16_t port_ = 0;

  // The accept loop's: a descriptor kept open to be closed when the process runs out of them
  // (accept_failed), and the rate of its reports.
  int spare_descriptor_ = -1;
  std::uint64_t accept_errors_ = 0;
  clock_type::time_point last_accept_report_{};

  memory_budget budget_;
  index_pool large_turns_;         // large_concurrency turns for large /saxpy and /sum
  offload_threads large_threads_;  // where their CPU work and blocking waits run

  std::mutex mutex_;  // guards table_, conn_threads_, keep_running_, stopping_'s change and drain_
  connection_table table_;
  std::list<std::shared_ptr<conn_thread>> conn_threads_;
  std::atomic<bool> stopping_{false};  // read on every response without the lock
  graceful_drain drain_;               // drain()'s state and deadline (mutex_; drain.hpp)
};
