// evr/reactor/wait_target.hpp — what a wait waits for: "the work queued so far on this stream",
// "this event" (recorded by the user), or "the signal a kernel on this stream gives a slot"
// (evr/pool/signal_pool.hpp). A value type: construct it from an evr::stream, evr::event, a raw
// cudaStream_t / cudaEvent_t (CUDA backend), a stream and a signal_ticket, or of_stream /
// of_event / of_signal; what it holds is read only by the reactor (private, friend access).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include <evr/device/backend.hpp>
#include <evr/device/event.hpp>
#include <evr/device/stream.hpp>
#include <evr/pool/signal_pool.hpp>

namespace evr {
namespace detail {
class submitter;
struct reactor_access;
}  // namespace detail

/// What wait_target::probed() gives its caller: a word the GPU writes when the wait's work is done,
/// and the value it then reaches (at least). Empty when the wait's marker is not such a word.
struct wait_probe {
  const std::uint64_t* word = nullptr;  ///< the fence word or signal word (pinned host memory)
  std::uint64_t value = 0;              ///< the wait is done once *word >= value
  std::atomic<std::int64_t>* seen = nullptr;  ///< the reactor's note of it (saw_reached)

  /// The wait got a fence word (else the probe is empty).
  explicit operator bool() const noexcept { return word != nullptr; }
  /// The work is done (acquire: what the work wrote is visible after a true result). Only while
  /// the reactor that filled the probe lives; on an empty probe, false.
  bool reached() const noexcept {
    return word != nullptr && __atomic_load_n(word, __ATOMIC_ACQUIRE) >= value;
  }
  /// Tells the reactor that reached() just said true: it learns the stream's work from it, since
  /// it did not look itself. `done_before`: how long before now the caller estimates the work
  /// ended (0: just now). A caller whose look may come long after the end passes its estimate
  /// (the Python loop: the midpoint since its last look that found the word short), else the
  /// reactor learns that the work took that long. Any thread, while the reactor lives.
  void saw_reached(std::chrono::nanoseconds done_before = {}) const noexcept {
    if (seen != nullptr)
      seen->store((std::chrono::steady_clock::now() - done_before).time_since_epoch().count(),
                  std::memory_order_relaxed);
  }
};

/// What a wait waits for: the work queued so far on a stream (at the moment the wait starts), or
/// an event as last recorded. A cheap value type that does not own what it names, built
/// implicitly from an evr::stream, an evr::event or (CUDA backend) a cudaStream_t / cudaEvent_t;
/// waits on an empty target are refused with errc::empty_handle.
class wait_target {
 public:
  /// An empty target: waits on it are refused with errc::empty_handle.
  wait_target() = default;
  /// The work queued on `s` so far.
  wait_target(const stream& s) noexcept  // NOLINT(google-explicit-constructor): a wait target
      : backend_(s.backend()), what_(kind::stream), native_(s.native()) {}
  /// The work `e` captured when it was last recorded. Waiting on an evr::event that was never
  /// recorded is refused with errc::event_never_recorded (CUDA would report such an event as
  /// complete, which hides bugs); it must not be re-recorded while the wait is pending.
  wait_target(const event& e) noexcept  // NOLINT(google-explicit-constructor)
      : backend_(e.backend()),
        what_(kind::event),
        native_(e.native()),
        device_(e.device().value_or(-1)),
        never_recorded_(!e.recorded()) {}
  /// The signal `t` names (signal_slot::arm), given by work queued on `s` before the wait
  /// starts (a kernel that calls evr::signal): the wait completes when the slot's word reaches
  /// t.value, a memory read with no operation added to `s`. `s` is what the reactor probes for
  /// faults, and when `s` is idle and the signal never came, the wait fails with
  /// errc::not_signalled. An empty ticket is refused with errc::empty_handle. Strategies fence
  /// and adaptive (the default); poll and host_func refuse it with errc::unsupported.
  wait_target(const stream& s, signal_ticket t) noexcept
      : backend_(s.backend()),
        what_(kind::signal),
        native_(s.native()),
        signal_word_(t.word),
        signal_value_(t.value) {}
#if defined(EVR_WITH_CUDA)
  /// The signal `t` names, given by work queued on the user's cudaStream_t `s` (CUDA backend).
  wait_target(CUstream_st* s, signal_ticket t)
      : backend_(&device::cuda_backend()),
        what_(kind::signal),
        native_(s),
        signal_word_(t.word),
        signal_value_(t.value) {}
  /// A user's cudaStream_t (CUDA backend).
  wait_target(CUstream_st* s)  // NOLINT(google-explicit-constructor)
      : backend_(&device::cuda_backend()), what_(kind::stream), native_(s) {}
  /// A user's cudaEvent_t (CUDA backend) of the submitting thread's current device. As in CUDA,
  /// an event that was never recorded counts as complete.
  wait_target(CUevent_st* e)  // NOLINT(google-explicit-constructor)
      : backend_(&device::cuda_backend()), what_(kind::event), native_(e) {}
#endif

  /// The work queued so far on the native stream `s` of backend `b`.
  static wait_target of_stream(device::backend& b, device::native_stream s) noexcept {
    wait_target t;
    t.backend_ = &b;
    t.what_ = kind::stream;
    t.native_ = s;
    return t;
  }
  /// The signal `t` names, given by work queued on the native stream `s` of backend `b`.
  static wait_target of_signal(device::backend& b, device::native_stream s,
                               signal_ticket t) noexcept {
    wait_target w;
    w.backend_ = &b;
    w.what_ = kind::signal;
    w.native_ = s;
    w.signal_word_ = t.word;
    w.signal_value_ = t.value;
    return w;
  }
  /// The native event `e` of backend `b`, filed under device `dev` (-1: the submitting thread's
  /// current device). As in CUDA, an event that was never recorded counts as complete.
  static wait_target of_event(device::backend& b, device::native_event e, int dev) noexcept {
    wait_target t;
    t.backend_ = &b;
    t.what_ = kind::event;
    t.native_ = e;
    t.device_ = dev;
    return t;
  }

  /// This target, for a wait whose completion is taken some time after it is handed over anyway
  /// (an event loop that wakes from epoll for it: tens of microseconds): the reactor need not spin
  /// for it. Through the window in which its work is predicted to end it is looked at on the poll
  /// tick (reactor_options::poll_period apart, stretched by poll_looks_per_second), as irregular
  /// work is, instead of on every sweep: a few looks per wait instead of a spinning core, at up
  /// to a poll period of latency. Matters for waits the reactor delivers itself; a polling host
  /// (an io_context's thread) looks through its own waits' windows either way.
  [[nodiscard]] wait_target unhurried() const noexcept {
    wait_target t = *this;
    t.unhurried_ = true;
    return t;
  }

  /// This target, for a caller that polls through a window of its own until `until` (Python's
  /// event loop between its other callbacks). When the wait's marker is a fence word (strategies
  /// fence and adaptive, within the fence budget) or the wait is on a signal, the submission
  /// writes the word and the value that completes the wait to `probe`: the caller sees the work
  /// done with a memory read (wait_probe::reached; wait_probe::saw_reached then tells the
  /// reactor, which learns the stream's work from it). The reactor does not look at the wait
  /// before `until` (it sleeps rather than spin beside the caller), and after it as the target
  /// says (spun for, or unhurried()): the caller's window missed the work, so it is found at
  /// once. (Waits on signals of one stream share the newest one's `until`.) It still completes
  /// the wait exactly once, as every wait; its callback may come well after the caller saw the
  /// word. With any other marker (an event, a host function, a wait on an event) `probe` is left
  /// empty and the wait is as without this call. `probe` must stay valid during the submission;
  /// its word stays readable while the reactor lives (a signal's, while its slot's pool does).
  [[nodiscard]] wait_target probed(wait_probe& probe,
                                   std::chrono::steady_clock::time_point until) const noexcept {
    wait_target t = *this;
    t.probe_ = &probe;
    t.probe_until_ = until;
    return t;
  }

 private:
  friend class detail::submitter;
  friend struct detail::reactor_access;
  enum class kind : unsigned char { stream, event, signal };

  device::backend* backend_ = nullptr;
  kind what_ = kind::stream;
  void* native_ = nullptr;       ///< native stream or native event
  int device_ = -1;              ///< event's device; -1: the submitting thread's current device
  bool never_recorded_ = false;  ///< an evr::event that was never recorded (refused)
  bool unhurried_ = false;       ///< unhurried(): looked at on the poll tick, not spun for
  wait_probe* probe_ = nullptr;  ///< probed(): written by the submission (fence markers only)
  std::chrono::steady_clock::time_point probe_until_{};  ///< probed(): the caller's window end
  const std::uint64_t* signal_word_ = nullptr;           ///< kind::signal: the slot's word
  std::uint64_t signal_value_ = 0;                       ///< kind::signal: the count to reach
};

}  // namespace evr
