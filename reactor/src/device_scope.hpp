// reactor/src/device_scope.hpp — the current device of the thread that runs a pass, for the
// driver calls of its looks (event queries, fault probes).
//
// The reactor thread's own device is cached (a driver call only when it changes). A host's pass
// (host_pass.hpp) runs on a thread that belongs to the user: between begin_borrowed() and
// end_borrowed() the first driver call switches that thread to the relaxed capture mode (as the
// reactor thread is) and notes its device, and end_borrowed() puts both back; passes that only
// read fence words change nothing.
//
// Thread safety: under the pass lock (one pass at a time).
#pragma once

#include <system_error>

#include <evr/device/backend.hpp>

namespace evr::detail {

class device_scope {
 public:
  explicit device_scope(device::backend& backend) noexcept : backend_(backend) {}

  /// Makes `device` current for the driver calls that follow (-1: any will do).
  std::error_code select(int device) noexcept;
  /// A host's pass begins on the calling thread.
  void begin_borrowed() noexcept { borrowed_ = true; }
  /// The host's pass ends: the thread's own device and capture mode are put back.
  void end_borrowed() noexcept;

 private:
  std::error_code select_borrowed(int device) noexcept;

  device::backend& backend_;
  int current_device_ = -1;         // the reactor thread's
  bool borrowed_ = false;           // the pass under way is a host's
  bool borrowed_changed_ = false;   // ... and it changed the thread's device or capture mode
  int borrowed_device_ = -1;        // the device it made current (-1: none yet)
  int borrowed_saved_device_ = -1;  // the thread's own, to restore
  int borrowed_capture_mode_ = 0;   // the thread's own capture mode, to restore
};

}  // namespace evr::detail
