// dut() for evr_tests: a threaded simulated device with two devices.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <evr/sim/device.hpp>

#include "support/device_under_test.hpp"

namespace evr::test {
namespace {

class sim_gate final : public gate {
 public:
  explicit sim_gate(sim::device& d) : device_(d) {}
  ~sim_gate() override { open(); }
  void launch(device::native_stream stream) override {
    auto flag = flag_;
    device_.launch_kernel(stream, {}, [flag] {
      while (!flag->load(std::memory_order_acquire))
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    });
  }
  void open() override { flag_->store(true, std::memory_order_release); }

 private:
  sim::device& device_;
  std::shared_ptr<std::atomic<bool>> flag_ = std::make_shared<std::atomic<bool>>(false);
};

class sim_under_test final : public device_under_test {
 public:
  device::backend& backend() override { return device_; }
  const char* name() const override { return "sim"; }
  std::unique_ptr<gate> make_gate() override { return std::make_unique<sim_gate>(device_); }
  void launch_fault(device::native_stream stream) override {
    device_.launch_faulting_kernel(stream);
  }
  void launch_busy(device::native_stream stream, unsigned microseconds) override {
    device_.launch_kernel(stream, std::chrono::microseconds(microseconds));
  }
  void launch_signal(device::native_stream stream, const signal_ref& done, unsigned microseconds,
                     unsigned /*blocks*/) override {
    device_.launch_kernel(stream, std::chrono::microseconds(microseconds),
                          [done] { sim::signal(done); });
  }

 private:
  sim::device device_{sim::options{.devices = 2, .mode = sim::run_mode::threaded}};
};

}  // namespace

device_under_test& dut() {
  static sim_under_test instance;
  return instance;
}

std::string skip_reason() { return {}; }

}  // namespace evr::test
