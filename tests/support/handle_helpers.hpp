// tests/support/handle_helpers.hpp — what the tests of evr::stream, evr::event and the backend
// calls share (generic_stream_test.cpp, generic_event_test.cpp): the device under test's backend,
// and a backend that counts what evr's handles create and destroy.
#pragma once

#include <chrono>
#include <system_error>
#include <thread>

#include <doctest/doctest.h>

#include <evr/device/backend.hpp>

#include "support/device_under_test.hpp"
#include "support/forwarding_backend.hpp"

namespace evr::test::handles {

using device::event_flags;

inline device::backend& be() { return dut().backend(); }

inline int device_count() {
  int n = 0;
  REQUIRE_FALSE(be().device_count(n));
  REQUIRE(n >= 1);
  return n;
}

/// Long enough for a device to pass anything not held back (so "still pending" means held back).
inline void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

/// Forwards to the device under test and counts what evr's handles create and destroy.
class counting_backend final : public forwarding_backend {
 public:
  using forwarding_backend::forwarding_backend;

  int events_created = 0, events_destroyed = 0, streams_created = 0, streams_destroyed = 0;
  device::native_event last_destroyed_event = nullptr;
  device::native_stream last_destroyed_stream = nullptr;

  std::error_code create_event(int d, event_flags f, device::native_event& out) noexcept override {
    auto ec = inner_.create_event(d, f, out);
    if (!ec) ++events_created;
    return ec;
  }
  void destroy_event(device::native_event e) noexcept override {
    ++events_destroyed;
    last_destroyed_event = e;
    inner_.destroy_event(e);
  }
  std::error_code import_event(const device::ipc_event_handle& h,
                               device::native_event& out) noexcept override {
    auto ec = inner_.import_event(h, out);
    if (!ec) ++events_created;
    return ec;
  }
  std::error_code create_stream(int d, int p, device::native_stream& out) noexcept override {
    auto ec = inner_.create_stream(d, p, out);
    if (!ec) ++streams_created;
    return ec;
  }
  void destroy_stream(device::native_stream s) noexcept override {
    ++streams_destroyed;
    last_destroyed_stream = s;
    inner_.destroy_stream(s);
  }
};

}  // namespace evr::test::handles
