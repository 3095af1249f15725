// Lanes: a stream and the buffers of one request in flight on it, and the pool requests take
// them from.
//
// Why a pool and not a stream per request or per connection: GPU streams and pinned buffers are
// a bounded resource, and wrk opens hundreds of connections. A request holds a lane from filling
// its inputs to checking its output (the buffers are the lane's, so two requests must never share
// one at the same time); when all lanes are busy, a request waits for one without blocking its
// thread (an Asio channel pre-filled with the lanes).
#pragma once

#include <cstddef>
#include <memory>
#include <system_error>
#include <utility>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/experimental/concurrent_channel.hpp>

#include <evr/evr.hpp>

#include "job.hpp"

/// One stream and its buffers. Host buffers hold the inputs the request writes and the output the
/// device copies back; device buffers (CUDA) hold the copies. Not thread-safe: one request at a
/// time.
class lane {
 public:
  virtual ~lane() = default;
  virtual const evr::stream& stream() const noexcept = 0;
  /// Makes every buffer hold at least n elements. Only called while nothing is queued on the lane.
  virtual void reserve(std::size_t n) = 0;
  virtual float* x() noexcept = 0;  ///< host input x (n floats after reserve)
  virtual float* y() noexcept = 0;  ///< host input y
  /// Enqueues the request's work on the stream: copy in, kernel, copy out. Returns at once; the
  /// results are valid once the work queued so far on stream() is done. Throws evr::error when the
  /// device refuses a step (some steps may already be queued then).
  virtual void enqueue(const job::spec& s) = 0;
  virtual const float* out() const noexcept = 0;  ///< saxpy's result, on the host
  virtual double sum() const noexcept = 0;        ///< sum's result, on the host
  /// Blocks until the work queued so far is done (cudaStreamSynchronize / the simulator's).
  std::error_code synchronize() noexcept {
    return stream().backend()->synchronize_stream(stream().native());
  }
};

/// A lane on the simulated device: the "kernel" occupies the stream for ~1 ns per element and its
/// body computes the result on the stream's worker thread (copies are not modelled separately).
std::unique_ptr<lane> make_sim_lane(evr::sim::device& device);

#if defined(EVR_ASYNC_SERVER_HAVE_KERNELS)
/// A lane on CUDA device 0: pinned host buffers, device buffers, the kernels of kernels.cu.
std::unique_ptr<lane> make_cuda_lane();
#endif

class lane_pool {
 public:
  /// A lane taken from the pool; goes back when destroyed. If work may still be queued on it
  /// (marked busy and never marked idle: an error or exception between enqueue and completion),
  /// it is synchronized first, so the next request never shares buffers with unfinished work.
  /// That blocking call is on failure paths only.
  class lease {
   public:
    lease() = default;
    lease(lane_pool* pool, lane* l) noexcept : pool_(pool), lane_(l) {}
    lease(lease&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)),
          lane_(std::exchange(o.lane_, nullptr)),
          busy_(o.busy_) {}
    lease& operator=(lease&& o) noexcept {
      if (this != &o) {
        give_back();
        pool_ = std::exchange(o.pool_, nullptr);
        lane_ = std::exchange(o.lane_, nullptr);
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

   private:
    void give_back() noexcept;
    lane_pool* pool_ = nullptr;
    lane* lane_ = nullptr;
    bool busy_ = false;
  };

  lane_pool(const asio::any_io_executor& ex, std::vector<std::unique_ptr<lane>> lanes);
  lane_pool(const lane_pool&) = delete;
  lane_pool& operator=(const lane_pool&) = delete;

  /// A free lane, waiting (suspended, not blocking) while all are taken. Thread-safe.
  asio::awaitable<lease> acquire();
  std::size_t size() const noexcept { return lanes_.size(); }

 private:
  void release(lane* l) noexcept;
  std::vector<std::unique_ptr<lane>> lanes_;
  // Capacity == number of lanes, so giving one back (try_send) never fails or waits.
  asio::experimental::concurrent_channel<void(std::error_code, lane*)> free_;
};
