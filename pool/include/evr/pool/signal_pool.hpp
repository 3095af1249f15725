// evr/pool/signal_pool.hpp — signal slots: what a kernel signals when its work is done, so that a
// wait on it is a memory read for the reactor, with no operation added to the stream.
//
// Why: a wait on a stream puts a marker behind the work (a fence write or an event record). A
// fence write holds its hardware queue until the work before it is done, so with more streams
// than hardware queues it holds up other streams' work, and an event costs a driver query per
// look. A kernel that writes a word in host memory itself (the slot's) adds nothing to the stream
// and couples no streams; the reactor, and an io_context thread near the predicted end, find it
// with a memory read, however many streams are busy. It works in CUDA graphs: what the kernel is
// given (signal_ref) never changes.
//
//   evr::signal_slot slot = reactor.pools().signals(device).acquire();  // once, per lane
//   evr::signal_ticket t = slot.arm();                                 // per launch
//   work<<<grid, block, 0, stream>>>(..., slot.ref());  // calls evr::signal (signal.cuh)
//   waiter.async_wait(evr::wait_target(stream, t), token);
//
// A slot counts its signals: the kernel adds one to a counter in device memory and writes the
// count to the word; arm() says how many signals a wait needs (one more than the last armed),
// and the wait completes when the word reaches it. The reactor's fault probe covers the stream:
// a sticky fault fails the wait, and a stream that went idle without the signal fails it with
// errc::not_signalled.
//
// Pool: slots are made in batches (backend::allocate_signal_block: mapped host words and device
// counters, zeroed) on the acquiring thread, or ahead of need (reserve), and reused. A slot given
// back while signals it was armed for have not all landed is not handed out again until they have
// (a late signal would complete the next owner's wait). The free list is under a mutex: a slot is
// taken once per lane or stream, not per wait, so this is off the hot path (arm() is a plain
// increment).
//
// Thread safety: signal_pool: every member is thread-safe. signal_slot: distinct objects are
// independent; one slot's arm() must not race with itself (the thread that launches the work
// arms it), signalled() may be called from any thread. Lifetime: the backend must outlive the
// pool and its slots; slots keep the pool's memory alive. Memory whose signals never all landed
// (a kernel that was armed for and never ran) is kept for the process rather than freed under it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <system_error>

#include <evr/device/backend.hpp>

namespace evr {

/// The host side of one expected signal: a wait on it (wait_target(stream, ticket)) completes
/// when the slot's word reaches `value`.
struct signal_ticket {
  const std::uint64_t* word = nullptr;  ///< the slot's word in host memory
  std::uint64_t value = 0;              ///< the count that means "signalled"; 0: empty ticket
};

namespace detail {
struct signal_pool_state;
}  // namespace detail

/// One signal slot, taken from a signal_pool: move-only, given back on destruction or release().
/// Thread safety and lifetime: see the file comment.
class signal_slot {
 public:
  signal_slot() noexcept = default;  ///< an empty slot (ref() and arm() must not be called)
  signal_slot(signal_slot&& other) noexcept;  ///< takes other's slot; other is left empty
  signal_slot& operator=(signal_slot&& other) noexcept;  ///< gives back the slot held before
  signal_slot(const signal_slot&) = delete;
  signal_slot& operator=(const signal_slot&) = delete;
  ~signal_slot() { release(); }

  explicit operator bool() const noexcept { return state_ != nullptr; }  ///< holds a slot
  int device() const noexcept;  ///< the device whose kernels may signal it (-1: empty)

  /// What a kernel needs to signal this slot (evr::signal, evr::signal_from_last_block): the
  /// same for the slot's whole life, so a CUDA graph may capture it.
  const signal_ref& ref() const noexcept { return ref_; }
  /// One more signal expected: the ticket a wait on that signal names. Call it once per launch
  /// that signals, in launch order. Never blocks, never allocates.
  signal_ticket arm() noexcept { return signal_ticket{word_, ++armed_}; }
  /// The signals armed so far (over the slot's life in the pool, not only this owner's).
  std::uint64_t armed() const noexcept { return armed_; }
  /// The signals that have landed so far (the word: acquire load). Any thread.
  std::uint64_t signalled() const noexcept;
  /// Queues a signal of this slot on `stream`, behind the work queued there: evr's own
  /// one-thread kernel, for work whose kernels cannot call evr::signal (cuBLAS, cuDNN, torch).
  /// Like a signalling kernel of the user's, it needs one arm() per launch. Meant for a CUDA
  /// graph: called while the graph's work is captured, as its last node, it signals on every
  /// replay, and inside a graph it holds no hardware queue. On a stream outside a capture it is
  /// a kernel that waits for the work before it, which holds a shared hardware queue the way a
  /// fence write does (docs/architecture.md, "Markers and hardware queues"): there, wait on the
  /// stream instead. A graph names the slot's memory: keep the slot while the graph may run.
  /// While `stream` is captured the kernel goes to the calling thread's current device (CUDA
  /// does not name a capturing stream's device), which must be the slot's.
  /// Throws evr::error: errc::empty_handle (no slot), errc::device_mismatch (`stream` is of
  /// another device than the slot), errc::unsupported (a backend without it),
  /// errc::invalid_argument (a device numbered 64 or more), a CUDA error (a driver that cannot
  /// load or launch the kernel; cudaErrorStreamCaptureImplicit for the legacy default stream
  /// while another thread captures).
  void enqueue_signal(device::native_stream stream);
  /// Same, never throws: `ec` set on failure.
  void enqueue_signal(device::native_stream stream, std::error_code& ec) noexcept;
  /// Whether work queued on `stream` can signal this slot, as enqueue_signal checks it before it
  /// launches: `stream`'s device (while it is captured, the calling thread's current device) must
  /// be the slot's. `ec`: cleared, or errc::empty_handle, errc::device_mismatch, the backend's
  /// error. For a front end that takes the stream a ticket's wait will watch (Python's arm).
  void check_stream(device::native_stream stream, std::error_code& ec) const noexcept;

  /// Gives the slot back to its pool (held back from reuse until every armed signal landed).
  void release() noexcept;

 private:
  friend class signal_pool;
  std::shared_ptr<detail::signal_pool_state> state_;
  std::size_t index_ = 0;
  std::uint64_t* word_ = nullptr;
  std::uint64_t armed_ = 0;
  signal_ref ref_{};
};

/// How many slots a pool has made, and where they are.
struct signal_pool_stats {
  std::size_t slots = 0;    ///< made so far
  std::size_t in_use = 0;   ///< handed out
  std::size_t waiting = 0;  ///< given back with signals still to land (not reused until they do)
};

/// The signal slots of one device: made in batches on first need or ahead (reserve), reused.
/// Thread-safe.
/// Errors: evr::error, or std::error_code with the non-throwing acquire().
class signal_pool {
 public:
  /// Slots of `device` of `backend` (which must outlive the pool and its slots), made `batch` at
  /// a time (0 is taken as 1).
  signal_pool(device::backend& backend, int device, std::size_t batch = 64);
  ~signal_pool();
  signal_pool(const signal_pool&) = delete;
  signal_pool& operator=(const signal_pool&) = delete;

  /// A free slot, making a batch when none is free. Throws evr::error with the backend's error
  /// (errc::unsupported for a backend without signal slots; a CUDA allocation error).
  signal_slot acquire();
  /// Same, never throws: an empty slot and `ec` set on failure.
  signal_slot acquire(std::error_code& ec) noexcept;
  /// Makes batches until the pool has made at least `slots` slots (handed out, free, or given
  /// back with signals still to land), so that taking that many from a fresh pool makes nothing.
  /// On CUDA the first batch of a device also loads evr's signal kernel there; a load waits for
  /// the device's running kernels to end and holds up other threads' CUDA calls meanwhile, and
  /// the batch's zeroing may queue behind them. So make the slots (or call
  /// reactor::prepare_device) before launching kernels that wait for the host. A batch is made
  /// without the lock that acquire() and release() take for the free list: only other growth
  /// waits for it. Throws evr::error as acquire() does; the batches made before a failure stay.
  void reserve(std::size_t slots);
  /// Same, never throws: `ec` set on failure.
  void reserve(std::size_t slots, std::error_code& ec) noexcept;

  int device() const noexcept;               ///< its device
  signal_pool_stats stats() const noexcept;  ///< a snapshot

 private:
  /// A free slot whose signals all landed, into `s`; false when there is none.
  bool take_free_slot(signal_slot& s) noexcept;
  std::shared_ptr<detail::signal_pool_state> state_;
};

}  // namespace evr
