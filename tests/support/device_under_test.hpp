// The device a test binary runs its device-generic tests on: the simulated device (evr_tests) or
// the CUDA backend with real kernels (evr_gpu_tests). Test files ask for it with dut().
#pragma once

#include <memory>
#include <system_error>

#include <evr/device/backend.hpp>

namespace evr::test {

/// Holds a stream back until opened: a kernel that spins on a host-visible flag.
class gate {
 public:
  virtual ~gate() = default;  ///< opens the gate if still closed (no test may hang on it)
  /// Enqueues the spinning kernel on `stream`. A gate may be launched on several streams.
  virtual void launch(device::native_stream stream) = 0;
  /// Lets every kernel of this gate finish.
  virtual void open() = 0;
};

class device_under_test {
 public:
  virtual ~device_under_test() = default;
  virtual device::backend& backend() = 0;
  /// "sim" or "cuda".
  virtual const char* name() const = 0;
  virtual std::unique_ptr<gate> make_gate() = 0;
  /// Enqueues a kernel that faults (sim: an injected fault; cuda: an out-of-bounds write). Sticky:
  /// the device is unusable afterwards, so only tests that end the device's life use it.
  virtual void launch_fault(device::native_stream stream) = 0;
  /// Enqueues a short kernel (about `microseconds` long) so streams have real work in them.
  virtual void launch_busy(device::native_stream stream, unsigned microseconds) = 0;
  /// Enqueues a kernel of `blocks` blocks (about `microseconds` long) that signals `done` as it
  /// ends: evr::signal_from_last_block from every thread (sim: one signal at the end).
  virtual void launch_signal(device::native_stream stream, const signal_ref& done,
                             unsigned microseconds, unsigned blocks = 1) = 0;
};

/// The device of this test binary (defined by sim_under_test.cpp or cuda_under_test.cpp).
device_under_test& dut();

}  // namespace evr::test
