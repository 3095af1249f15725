// tests/support/sim_device_helpers.hpp — what the tests of the simulated device itself share
// (sim_device_test.cpp, sim_device_controls_test.cpp): handles that exist or the test fails, a
// gate kernel, a log of host-function calls.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include <evr/device/error.hpp>
#include <evr/sim/device.hpp>

namespace evr::test::sim_helpers {

using evr::device::event_flags;
using evr::device::fence_block;
using evr::device::ipc_event_handle;
using evr::device::native_event;
using evr::device::native_stream;
using namespace std::chrono_literals;

namespace cuda_value = evr::cuda_value;

inline evr::sim::options manual(int devices = 1) {
  return {.devices = devices, .mode = evr::sim::run_mode::manual};
}
inline evr::sim::options threaded(int devices = 1) {
  return {.devices = devices, .mode = evr::sim::run_mode::threaded};
}

inline native_stream make_stream(evr::sim::device& d, int device = 0) {
  native_stream s = nullptr;
  REQUIRE_FALSE(d.create_stream(device, 0, s));
  REQUIRE(s != nullptr);
  return s;
}

inline native_event make_event(evr::sim::device& d, int device = 0,
                               event_flags flags = event_flags::none) {
  native_event e = nullptr;
  REQUIRE_FALSE(d.create_event(device, flags, e));
  REQUIRE(e != nullptr);
  return e;
}

inline const std::error_code not_ready = evr::make_cuda_error(cuda_value::not_ready);
inline const std::error_code illegal_address = evr::make_cuda_error(cuda_value::illegal_address);

// A kernel body that holds its stream until open() (as the gate kernel of the GPU tests).
struct gate {
  std::shared_ptr<std::atomic<bool>> flag = std::make_shared<std::atomic<bool>>(false);
  ~gate() { open(); }
  void launch(evr::sim::device& d, native_stream s) const {
    auto f = flag;
    REQUIRE_FALSE(d.launch_kernel(s, {}, [f] {
      while (!f->load(std::memory_order_acquire)) std::this_thread::sleep_for(50us);
    }));
  }
  void open() const { flag->store(true, std::memory_order_release); }
};

// A host function that appends its tag to a shared log (and notes whether in_host_func held).
struct log_entry {
  int tag;
  bool in_host_func;
  std::thread::id thread;
};
struct host_log {
  evr::sim::device* device = nullptr;
  std::mutex mutex;
  std::vector<log_entry> entries;
  std::vector<int> tags() {
    std::lock_guard lock(mutex);
    std::vector<int> out;
    for (const auto& e : entries) out.push_back(e.tag);
    return out;
  }
};
struct host_call {
  host_log* log;
  int tag;
};
inline void append_tag(void* p) {
  auto* call = static_cast<host_call*>(p);
  std::lock_guard lock(call->log->mutex);
  call->log->entries.push_back(
      {call->tag, call->log->device->in_host_func(), std::this_thread::get_id()});
}

inline void count_call(void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }

}  // namespace evr::test::sim_helpers
