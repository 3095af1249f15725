// Lanes: a stream and the buffers of one piece of GPU work in flight on it (a request, or an /mlp
// batch), and the pool that work takes them from.
//
// Why a pool and not a stream per request or per connection: GPU streams and pinned buffers are
// a bounded resource, and wrk opens a thousand connections. Work holds a lane from filling its
// inputs to reading its output (the buffers are the lane's, so two pieces of work must never share
// one at the same time); when all lanes are busy, a request waits for one without blocking its
// thread. Taking and giving back a lane is a compare-and-swap on a lock-free free list while lanes
// are free (no lock, no Asio operation); only a request that finds none queues a handler under a
// mutex, and the next lane given back goes to the oldest such request (index_pool.hpp; a waiting
// request is cancelled when its client leaves). How many lanes: enough
// that the GPU, not the lane count, limits how much runs at once (--streams; by default measured
// from the GPU at start-up, see main.cpp; scripts/study/server-study.py measures the effect).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/use_awaitable.hpp>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "busy.hpp"
#include "index_pool.hpp"
#include "job.hpp"
#include "mlp.hpp"

#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
#include "kernels.hpp"
#endif

/// How a blocking server waits for its GPU work (the pool and thread modes; the others never
/// block).
enum class sync_kind {
  /// cudaStreamSynchronize, with the device's scheduling set to cudaDeviceScheduleSpin at start-up:
  /// the waiting thread spins on a core (the lowest latency a blocking wait gets).
  spin,
  /// cudaStreamSynchronize under the driver's default scheduling (cudaDeviceScheduleAuto: no flag
  /// set, what a program that never thinks about it gets).
  automatic,
  /// An event created with cudaEventBlockingSync, recorded behind the work, and
  /// cudaEventSynchronize: the thread sleeps until the driver wakes it (no core, ~40-130 us later).
  blocking_sync,
};
const char* to_string(sync_kind s) noexcept;

/// One stream and its buffers. Host buffers hold the inputs the request writes and the outputs the
/// device copies back; device buffers (CUDA) hold the copies. Not thread-safe: one piece of work
/// at a time, by whoever holds the lane's lease.
class lane {
 public:
  virtual ~lane() = default;
  virtual const evr::stream& stream() const noexcept = 0;

  // --- /saxpy, /sum ------------------------------------------------------------------------
  /// Makes the x/y/out buffers hold at least n elements. Only while nothing is queued.
  virtual void reserve(std::size_t n) = 0;
  virtual float* x() noexcept = 0;  ///< host input x (n floats after reserve)
  virtual float* y() noexcept = 0;  ///< host input y
  /// Enqueues the work: copy in, kernel, copy out. Returns at once; the results are valid once the
  /// work queued so far on stream() is done. Throws (evr::error, std::runtime_error) when the
  /// device refuses a step (some steps may already be queued then).
  virtual void enqueue(const job::spec& s) = 0;
  virtual const float* out() const noexcept = 0;  ///< saxpy's result, on the host
  virtual double sum() const noexcept = 0;        ///< sum's result, on the host
  /// Gives back x/y/out buffers that hold more than n elements (an unusually large request's);
  /// the next reserve() allocates anew. Only while nothing is queued. May block (a CUDA free
  /// synchronizes the device): call it off the io threads.
  virtual void shrink(std::size_t n) = 0;

  // --- /busy --------------------------------------------------------------------------------
  /// Enqueues the busy kernel and the copy of its answer. Same contract as enqueue().
  virtual void enqueue_busy(const busy::spec& s) = 0;
  virtual std::uint32_t busy_result() const noexcept = 0;  ///< valid once the work is done

  // --- /mlp ---------------------------------------------------------------------------------
  /// Makes the /mlp buffers hold at least `rows` rows. Only while nothing is queued.
  virtual void reserve_rows(std::size_t rows) = 0;
  /// Host input: rows x model.in floats (after reserve_rows) for the caller to fill.
  virtual float* mlp_input() noexcept = 0;
  /// Enqueues the forward pass of the first `rows` input rows: copy in, the layers, copy out.
  virtual void enqueue_mlp(std::size_t rows) = 0;
  /// Host output: rows x model.out floats, valid once the work is done.
  virtual const float* mlp_output() const noexcept = 0;

  /// Blocks the calling thread until the work queued so far is done (the blocking modes).
  std::error_code wait_blocking(sync_kind how) noexcept;

  /// Records the lane's own event (created on first use, without timing) behind the work queued
  /// so far and returns it in `out` (the poll mode queries it). The event is the lane's: valid
  /// until the lane is destroyed, recorded again by the next piece of work.
  std::error_code record_done_event(evr::device::native_event& out) noexcept;

  // --- device-signalled waits (evr mode, server_config::busy_signal) -------------------------
  /// From now on the /busy kernel signals `slot` (from the reactor's pools, of the lane's device).
  /// Only while nothing is queued.
  virtual void use_signal(evr::signal_slot slot) noexcept { slot_ = std::move(slot); }
  /// What an evr wait for the work queued so far names: the /busy kernel's signal when that was
  /// the last work enqueued and the lane has a slot; else the stream.
  virtual evr::wait_target wait_target() const noexcept {
    return ticket_.value != 0 ? evr::wait_target(stream(), ticket_) : evr::wait_target(stream());
  }

 protected:
  /// enqueue_busy: the signal the kernel is to give (armed for it), or nullptr when the lane has
  /// no slot. Every other enqueue calls no_signal().
  const evr::signal_ref* arm_signal() noexcept {
    if (!slot_) return nullptr;
    ticket_ = slot_.arm();
    return &slot_.ref();
  }
  void no_signal() noexcept { ticket_ = {}; }
  /// The lane has a slot (use_signal): work can end in its signal.
  bool has_signal_slot() const noexcept { return static_cast<bool>(slot_); }
  /// Queues (or, while `stream` is captured into a graph, records) evr's signal of the lane's
  /// slot: for work whose kernels cannot signal (cuBLAS). arm_signal() once per signal given.
  void enqueue_slot_signal(evr::device::native_stream stream) { slot_.enqueue_signal(stream); }

 private:
  evr::signal_slot slot_;
  evr::signal_ticket ticket_;  // of the last /busy kernel, while it is the last work
  evr::event blocking_event_;  // created on first use with event_flags::blocking_sync
  evr::event done_event_;      // created on first use, no flags
};

/// How long the simulated device's kernels take (threaded mode sleeps that long; the body then
/// computes the answer on the CPU).
struct sim_costs {
  std::chrono::nanoseconds per_element{1};      ///< /saxpy, /sum: n elements
  std::chrono::nanoseconds mlp_base{300'000};   ///< /mlp: a pass reads all the weights...
  std::chrono::nanoseconds mlp_per_row{5'000};  ///< ... and adds a little per row
};

/// A lane on simulated GPU `device_index` of `device`. The /mlp body computes each row with
/// `model.forward` (the reference itself: the simulator models timing and ordering, not
/// arithmetic). `stream_backend`: the backend the lane's stream is created through (default: the
/// device itself; a test may pass a wrapper of it, which the reactor must then be given too).
std::unique_ptr<lane> make_sim_lane(evr::sim::device& device, int device_index,
                                    const mlp::model& model, const sim_costs& costs = {},
                                    evr::device::backend* stream_backend = nullptr);

#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
/// The /mlp weights on one CUDA device, materialized once and shared by the lanes of that device
/// (read-only).
class cuda_mlp_weights {
 public:
  /// Uploads every layer of `model` to `device` (synchronous; throws std::runtime_error).
  cuda_mlp_weights(const mlp::model& model, int device);
  ~cuda_mlp_weights();
  cuda_mlp_weights(const cuda_mlp_weights&) = delete;
  cuda_mlp_weights& operator=(const cuda_mlp_weights&) = delete;
  const mlp::shape& dims() const noexcept { return shape_; }
  const std::vector<server_kernels::mlp_layer>& layers() const noexcept { return layers_; }
  int device() const noexcept { return device_; }

 private:
  mlp::shape shape_;
  int device_;
  std::vector<server_kernels::mlp_layer> layers_;
};

/// A lane on the weights' CUDA device: pinned host buffers, device buffers, a cuBLAS handle on its
/// stream. Its calls make that device current on the calling thread first (kernels and cuBLAS
/// must be launched with their stream's device current), so any thread may use any device's lane.
struct cuda_lane_options {
  /// /mlp's forward pass runs as a CUDA graph per batch-size bucket (the rows rounded up to a power
  /// of two; the extra rows are computed and ignored), captured on first use, ending in evr's
  /// signal when the lane has a slot: one launch per batch instead of ten calls, and, in the evr
  /// mode, a wait that reads a word rather than puts a marker on the stream.
  bool mlp_graphs = true;
  /// /busy's kernel, which then does not signal itself, runs as a CUDA graph captured on the
  /// lane's first /busy, ending in evr's signal when the lane has a slot; each request sets the
  /// kernel node's arguments and launches the graph. Work the server did not write (library
  /// work) waited on through a graph's signal node, at a route whose own CPU cost is small.
  bool busy_graph = false;
};
std::unique_ptr<lane> make_cuda_lane(const cuda_mlp_weights& weights, cuda_lane_options options);
#endif

class lane_pool {
 public:
  /// A lane taken from the pool; goes back when destroyed. If work may still be queued on it
  /// (marked busy and never marked idle: an error or exception between enqueue and completion),
  /// it is synchronized first, so the next user never shares buffers with unfinished work.
  /// That blocking call is on failure paths only.
  class lease {
   public:
    lease() = default;
    lease(lane_pool* pool, std::uint32_t index) noexcept
        : pool_(pool), lane_(pool->lanes_[index]), index_(index) {}
    lease(lease&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)),
          lane_(std::exchange(o.lane_, nullptr)),
          index_(o.index_),
          busy_(o.busy_) {}
    lease& operator=(lease&& o) noexcept {
      if (this != &o) {
        give_back();
        pool_ = std::exchange(o.pool_, nullptr);
        lane_ = std::exchange(o.lane_, nullptr);
        index_ = o.index_;
        busy_ = o.busy_;
      }
      return *this;
    }
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() { give_back(); }

    lane& operator*() const noexcept { return *lane_; }
    lane* operator->() const noexcept { return lane_; }
    void mark_busy() noexcept { busy_ = true; }   ///< before enqueueing
    void mark_idle() noexcept { busy_ = false; }  ///< once the work is known to be done
    bool busy() const noexcept { return busy_; }
    explicit operator bool() const noexcept { return lane_ != nullptr; }

   private:
    void give_back() noexcept;
    lane_pool* pool_ = nullptr;
    lane* lane_ = nullptr;
    std::uint32_t index_ = 0;
    bool busy_ = false;
  };

  /// The lanes are not owned: they outlive the pool (one set of lanes serves every server the
  /// process runs in turn). At most 65534 lanes.
  explicit lane_pool(std::vector<lane*> lanes);
  lane_pool(const lane_pool&) = delete;
  lane_pool& operator=(const lane_pool&) = delete;

  /// A free lane, or an empty lease when every lane is taken. Lock-free; thread-safe.
  lease try_acquire() noexcept;
  /// A free lane, waiting (suspended, not blocking) while all are taken. Thread-safe. The waiters
  /// are served first come, first served; the coroutine resumes on its own executor.
  asio::awaitable<lease> acquire();
  /// Only the waiting part of acquire(), for a caller whose try_acquire() came back empty (saves
  /// a coroutine frame on the path where a lane is free). A signal emitted on `cancel` (on the
  /// caller's executor) ends the wait with an empty lease.
  asio::awaitable<lease> acquire_waiting(asio::cancellation_slot cancel = {});
  /// The waiting part as an Asio operation, completing with void(std::uint32_t lane index) on the
  /// handler's executor; `adopt` turns the index into the lease (an empty one when the wait was
  /// cancelled through the handler's cancellation slot: index_pool says how). For a coroutine that
  /// must not pay for a frame of acquire_waiting's own:
  /// lanes_.adopt(co_await lanes_.async_wait_lane(tok)).
  template <typename CompletionToken>
  auto async_wait_lane(CompletionToken&& token) {
    return slots_.async_take(std::forward<CompletionToken>(token));
  }
  lease adopt(std::uint32_t index) noexcept {
    return index == index_pool::cancelled ? lease() : lease(this, index);
  }
  std::size_t size() const noexcept { return lanes_.size(); }
  /// Lane `i` (< size()), for set-up while nothing runs.
  lane& lane_at(std::size_t i) const noexcept { return *lanes_[i]; }
  /// Lanes currently leased (a statistic; exact once no request is in flight).
  std::size_t leased() const noexcept { return slots_.taken(); }

 private:
  std::vector<lane*> lanes_;
  index_pool slots_;  // lane indices: the free list and the requests waiting for a lane
};

inline asio::awaitable<lane_pool::lease> lane_pool::acquire_waiting(
    asio::cancellation_slot cancel) {
  co_return adopt(
      co_await async_wait_lane(asio::bind_cancellation_slot(cancel, asio::use_awaitable)));
}
