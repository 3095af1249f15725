// evr/reactor/detail/wait_op.hpp — the type-erased operation the reactor completes. Not public:
// only the in-repo front ends (callbacks/) derive from it, and they reach reactor::submit /
// cancel / cancel_owner through detail::reactor_access (evr/reactor/reactor.hpp).
//
// A front end (the Asio I/O object in callbacks/, the plain-callback API) derives from wait_op,
// allocates it with the handler's allocator and hands it to reactor_access::submit. The reactor
// owns the pointer until it calls complete_ exactly once; complete_ frees the operation.
//
// Threads and memory order:
//   * state_ is the exactly-once handshake between completion (reactor thread) and per-operation
//     cancellation (any thread): whoever moves it away from `pending` decides the outcome. See
//     reactor::cancel for the protocol.
//   * Fields marked (reactor) are touched only under the reactor's pass lock after submission
//     (its thread, or a host's pass: reactor/src/pass_lock.hpp).
//   * next_ and cancel_next_ are links of the reactor's lock-free submission and control stacks;
//     the push (release) / exchange (acquire) pair publishes every field written before submit.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <system_error>
#include <type_traits>

#include <evr/device/backend.hpp>
#include <evr/reactor/delivery.hpp>

namespace evr {
namespace detail {
struct stream_state;
class poll_host;

class wait_op {
 public:
  /// Called exactly once by the reactor with the outcome. Must free the operation. Runs on the
  /// reactor thread (or, for a wait refused at submission, on the submitting thread, which must
  /// then not invoke the user's handler inline: front ends post).
  using complete_fn = void (*)(wait_op* op, std::error_code ec) noexcept;

  explicit wait_op(complete_fn fn) noexcept : complete_(fn) {}
  wait_op(const wait_op&) = delete;
  wait_op& operator=(const wait_op&) = delete;

  void complete(std::error_code ec) noexcept { complete_(this, ec); }

  /// The reactor is done with the fields from owner_ to submitted_at_ once it calls complete()
  /// (and a refused wait never reached it): from then on the front end may reuse these bytes, for
  /// what it posts, say, instead of carrying a buffer of its own. Aligned as a pointer.
  static constexpr std::size_t reusable_size = 64;
  unsigned char* reusable_after_complete() noexcept {
    return reinterpret_cast<unsigned char*>(&owner_);
  }

  // Layout (docs/architecture.md, "Where a wait's bytes and time go"): the small fields share
  // the first 8 bytes; 96 bytes in all on a 64-bit target. Every member is public, so that the
  // class is standard-layout and the reusable bytes' place can be checked (below).
  enum : std::uint8_t { pending = 0, cancel_requested = 1, done = 2 };
  std::atomic<std::uint8_t> state_{pending};

  delivery how_ = delivery::post;
  /// (reactor) set before complete() when the wait's execution context shut down: the front end
  /// must destroy the operation without running (or posting) its handler.
  bool detached_ = false;
  // (reactor) where the operation is
  enum class phase : unsigned char {
    queued,
    pending,
    retired_awaiting_cancel
  } phase_ = phase::queued;
  std::int16_t device_ = -1;  ///< set by reactor::submit (devices are < pool_set::max_devices)
  /// The front end's: never read or written by the reactor (it survives complete()).
  bool front_end_flag_ = false;
  /// (set by reactor::submit) A device-signalled wait (a wait_target of a signal_ticket): no
  /// marker on the stream; event_ holds the slot's word (signal_word()) and signal_value_ the
  /// count that completes it.
  bool signalled_ : 1 = false;
  /// (set by reactor::submit) wait_target::unhurried(): while it is its stream's oldest wait, the
  /// reactor looks at the stream on the poll tick through its window instead of spinning.
  bool unhurried_ : 1 = false;
  /// (set by reactor::submit) wait_target::probed() with a fence marker or a signal: the caller
  /// reads the word itself until its window closes, when the reactor first looks (for a fence
  /// marker covered_until_ns_ holds that time; a signalled wait's count holds those bytes, and
  /// the time is its stream's: detail::probed_until in reactor/src/stream_state.hpp).
  bool probed_ : 1 = false;

  std::uintptr_t owner_ = 0;  ///< the I/O object that started it (for cancel-all); 0: none
  std::uintptr_t group_ = 0;  ///< its execution context (for detach_group); 0: none

  // --- set by reactor::submit on the submitting thread, then (reactor) -----------------------
  wait_op* next_ = nullptr;         ///< submission stack link
  wait_op* cancel_next_ = nullptr;  ///< control stack link (per-operation cancellation)
  stream_state* stream_ = nullptr;  ///< null for a wait on a user event
  /// The marker: for a wait on a stream, a pooled event (poll, or a fence overflow; it goes back
  /// to its stream's pool, stream_state::marker_pool) or nullptr (a fence word or host function);
  /// for a wait on a user event, that event; for a device-signalled wait, the slot's word.
  device::native_event event_ = nullptr;
  std::uint64_t seq_ = 0;  ///< position in its stream (marker order)
  std::chrono::steady_clock::time_point submitted_at_{};

  complete_fn complete_;  ///< called through complete(), exactly once
  /// Set by the front end before submit, never written by the reactor: the thread this wait is
  /// delivered to, when it lends itself to the reactor near the wait's predicted completion
  /// (poll_host.hpp); nullptr: a plain delivery. It outlives the wait.
  poll_host* host_ = nullptr;
  union {
    /// A device-signalled wait (signalled_): done when *signal_word() reaches this count.
    std::uint64_t signal_value_ = 0;
    /// (set by reactor::submit) A probed wait (probed_, wait_target::probed) on a fence word:
    /// its caller reads the word itself until then (steady clock, ns), and the reactor does not
    /// look before.
    std::int64_t covered_until_ns_;
  };

  /// The word a device-signalled wait (signalled_) reads.
  const std::uint64_t* signal_word() const noexcept {
    return static_cast<const std::uint64_t*>(event_);
  }
  /// The pooled or user's event this wait holds (none for a device-signalled wait).
  device::native_event marker_event() const noexcept { return signalled_ ? nullptr : event_; }
};

static_assert(std::is_standard_layout_v<wait_op>);
static_assert(offsetof(wait_op, submitted_at_) + sizeof(wait_op::submitted_at_) -
                      offsetof(wait_op, owner_) ==
                  wait_op::reusable_size,
              "the reusable bytes are the fields from owner_ to submitted_at_, contiguous");

}  // namespace detail
}  // namespace evr
