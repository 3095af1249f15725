// evr/reactor/wait_target.hpp — what a wait waits for: "the work queued so far on this stream",
// or "this event" (recorded by the user).
#pragma once

#include <evr/device/backend.hpp>
#include <evr/device/event.hpp>
#include <evr/device/stream.hpp>

namespace evr {

struct wait_target {
  enum class kind : unsigned char { stream, event };

  device::backend* backend = nullptr;
  kind what = kind::stream;
  void* native = nullptr;       ///< native stream or native event
  int device = -1;              ///< event's device; -1: the submitting thread's current device
  bool never_recorded = false;  ///< an evr::event that was never recorded (refused: see below)

  wait_target() = default;
  /// The work queued on `s` so far.
  wait_target(const stream& s) noexcept  // NOLINT(google-explicit-constructor): a wait target
      : backend(s.backend()), what(kind::stream), native(s.native()) {}
  /// The work `e` captured when it was last recorded. Waiting on an evr::event that was never
  /// recorded is refused with errc::event_never_recorded (CUDA would report such an event as
  /// complete, which hides bugs); it must not be re-recorded while the wait is pending.
  wait_target(const event& e) noexcept  // NOLINT(google-explicit-constructor)
      : backend(e.backend()),
        what(kind::event),
        native(e.native()),
        device(e.device().value_or(-1)),
        never_recorded(!e.recorded()) {}
#if defined(EVR_WITH_CUDA)
  /// A user's cudaStream_t (CUDA backend).
  wait_target(CUstream_st* s)  // NOLINT(google-explicit-constructor)
      : backend(&device::cuda_backend()), what(kind::stream), native(s) {}
  /// A user's cudaEvent_t (CUDA backend) of the submitting thread's current device. As in CUDA,
  /// an event that was never recorded counts as complete.
  wait_target(CUevent_st* e)  // NOLINT(google-explicit-constructor)
      : backend(&device::cuda_backend()), what(kind::event), native(e) {}
#endif

  static wait_target of_stream(device::backend& b, device::native_stream s) noexcept {
    wait_target t;
    t.backend = &b;
    t.what = kind::stream;
    t.native = s;
    return t;
  }
  static wait_target of_event(device::backend& b, device::native_event e, int dev) noexcept {
    wait_target t;
    t.backend = &b;
    t.what = kind::event;
    t.native = e;
    t.device = dev;
    return t;
  }
};

}  // namespace evr
