// Dynamic batching for /mlp (the modes that do not block a thread): requests that arrive while the
// GPU is busy, within a short window, or until a batch is full, are copied into one batch; one
// forward pass runs on one lane; every request of the batch awaits that one completion and then
// takes its rows back.
//
//   request coroutine                     batcher
//   run(rows) --> joins the open batch --> closes (below) --> execute: lane, copy in, GEMMs,
//   co_await mailbox                                           co_await evr, copy out
//   <------------------------------------ try_send to each request's mailbox <--'
//
// When a batch closes:
//   * it is full (max_rows), or the next request would not fit (that request opens the next);
//   * fewer than `inflight` batches are running: the GPU has room, so waiting would only add
//     latency (one connection gets batches of one, at once);
//   * a running batch finishes (the requests that gathered meanwhile go next);
//   * `window` after its first request, even if `inflight` batches are still running (a bound on
//     how long a request waits for its batch to start).
// So under light load requests go at once, and under heavy load the batches grow to what arrives
// while the GPU works on the previous ones. window 0: every request is a batch of its own.
//
// Why this needs a non-blocking wait (evr's, or one written by hand: gpu_wait.hpp): every request
// of a batch waits for the batch. A request that held its thread while waiting would take a
// thread per row of the batch; with a non-blocking wait a batch of 128 requests costs no thread
// at all while the GPU works. The server runs one batcher per GPU, each on that GPU's lanes.
//
// Abandoned requests: a request whose client left (its connection emits the cancellation signal
// given to run()) is withdrawn while its batch is still open or waiting for a lane: the batch runs
// without its rows (not at all when none are left). Once its rows are copied to the GPU it waits
// for the batch like any other.
//
// Thread safety: run() from any thread (one mutex guards the open batch, the batches waiting for a
// lane and the count of running ones; the window timer lives on a strand). Lifetime: the batcher,
// the lane pool, what its waits use (the reactor, the poller) and the io_context must outlive every
// run() and every batch in flight (the server's io threads are joined first).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <evr/evr.hpp>

#include "gpu_wait.hpp"
#include "lanes.hpp"
#include "metrics.hpp"
#include "mlp.hpp"

class mlp_batcher {
 public:
  struct options {
    std::size_t max_rows = 128;  ///< rows per batch at most (also the most one request may carry)
    std::chrono::microseconds window{1000};
    std::size_t inflight = 2;  ///< batches running before new requests wait to be batched
  };

  /// Where a request hears that its batch ran (the message: no error, the batch's row count). One
  /// per connection (a connection has at most one request in the batcher); capacity 1, so a batch
  /// that finishes before the request starts to wait leaves the message there. (Asio 1.22 cannot
  /// instantiate a channel of void(std::error_code) alone: its channel_traits are ambiguous.)
  using mailbox = asio::experimental::concurrent_channel<void(std::error_code, std::size_t)>;

  /// What a request gets back.
  struct result {
    std::error_code ec;          ///< the batch's failure, if any
    std::string what;            ///< its description (for the 500 response)
    std::size_t batch_rows = 0;  ///< rows of the batch it ran in
  };

  /// Batches run on `lanes` and are waited for as `wait` says (its poller, in poll mode, must be
  /// the one of `io`, where the batches run).
  mlp_batcher(asio::io_context& io, lane_pool& lanes, const gpu_wait::source& wait,
              const mlp::shape& shape, options opts, server_metrics& metrics);
  mlp_batcher(const mlp_batcher&) = delete;
  mlp_batcher& operator=(const mlp_batcher&) = delete;

  /// Adds req's rows (req.rows <= max_rows) to the open batch and suspends until that batch has
  /// run; then `outputs` (req.rows x shape.out floats) holds the answers. `inputs` and `outputs`
  /// must stay valid until run() returns. A signal emitted on `cancel` (on the caller's executor)
  /// withdraws the request if its rows have not gone to the GPU yet: it then returns at once with
  /// operation_aborted.
  asio::awaitable<result> run(const mlp::request& req, float* outputs, mailbox& box,
                              asio::cancellation_slot cancel);

  const options& settings() const noexcept { return opts_; }

 private:
  struct entry {
    const float* inputs;
    std::size_t rows;
    float* outputs;
    mailbox* box;  // one per connection: names the request
    result* out;
    bool withdrawn = false;
  };
  struct batch {
    std::uint64_t id = 0;
    std::size_t rows = 0;  // of the entries not withdrawn
    std::vector<entry> entries;
  };
  /// What run() installs in the caller's cancellation slot.
  struct withdrawal {
    mlp_batcher* self;
    mailbox* box;
    void operator()(asio::cancellation_type) const { self->withdraw(box); }
  };

  void submit(const entry& e);
  /// Takes the request of `box` out of the open batch or a batch waiting for a lane, and tells it
  /// so; nothing when its batch has started.
  void withdraw(mailbox* box);
  /// A batch that got its lane: no longer withdrawable; drops the withdrawn entries.
  void start(batch& b);
  void arm_window(std::uint64_t id);  // on timer_strand_
  /// Takes the open batch for launch (mutex_ held): counts it as running.
  std::unique_ptr<batch> close_locked();
  void launch(std::unique_ptr<batch> b);
  void finished();  // a batch ran: the next one may go
  asio::awaitable<void> execute(std::unique_ptr<batch> b);

  asio::io_context& io_;
  lane_pool& lanes_;
  const mlp::shape shape_;
  const options opts_;
  server_metrics& metrics_;
  gpu_wait wait_;
  asio::strand<asio::io_context::executor_type> timer_strand_;
  asio::steady_timer timer_;  // on timer_strand_

  std::mutex mutex_;  // guards open_, waiting_lane_, the entries' `withdrawn`, next_id_, running_
  std::unique_ptr<batch> open_;
  std::vector<batch*> waiting_lane_;  // closed, not started (owned by their execute())
  std::uint64_t next_id_ = 1;
  std::size_t running_ = 0;  // batches closed and not yet finished
};
