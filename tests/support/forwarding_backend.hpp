// A backend that forwards every call to another one. Test backends derive from it and override
// only the calls they count or break.
#pragma once

#include <cstdint>
#include <string>

#include <evr/device/backend.hpp>

namespace evr::test {

class forwarding_backend : public device::backend {
 public:
  explicit forwarding_backend(device::backend& inner) : inner_(inner) {}

  std::string_view name() const noexcept override { return inner_.name(); }
  bool is_simulated() const noexcept override { return inner_.is_simulated(); }
  std::string describe() const override { return inner_.describe(); }
  std::error_code device_count(int& count) noexcept override { return inner_.device_count(count); }
  std::error_code create_event(int d, device::event_flags f,
                               device::native_event& out) noexcept override {
    return inner_.create_event(d, f, out);
  }
  void destroy_event(device::native_event e) noexcept override { inner_.destroy_event(e); }
  std::error_code record_event(device::native_event e, device::native_stream s) noexcept override {
    return inner_.record_event(e, s);
  }
  std::error_code query_event(device::native_event e) noexcept override {
    return inner_.query_event(e);
  }
  std::error_code synchronize_event(device::native_event e) noexcept override {
    return inner_.synchronize_event(e);
  }
  std::error_code elapsed_ms(device::native_event a, device::native_event b,
                             float& ms) noexcept override {
    return inner_.elapsed_ms(a, b, ms);
  }
  std::error_code export_event(device::native_event e,
                               device::ipc_event_handle& out) noexcept override {
    return inner_.export_event(e, out);
  }
  std::error_code import_event(const device::ipc_event_handle& h,
                               device::native_event& out) noexcept override {
    return inner_.import_event(h, out);
  }
  std::error_code create_stream(int d, int p, device::native_stream& out) noexcept override {
    return inner_.create_stream(d, p, out);
  }
  void destroy_stream(device::native_stream s) noexcept override { inner_.destroy_stream(s); }
  std::error_code stream_device(device::native_stream s, int& d) noexcept override {
    return inner_.stream_device(s, d);
  }
  std::error_code stream_priority(device::native_stream s, int& p) noexcept override {
    return inner_.stream_priority(s, p);
  }
  std::error_code query_stream(device::native_stream s) noexcept override {
    return inner_.query_stream(s);
  }
  std::error_code synchronize_stream(device::native_stream s) noexcept override {
    return inner_.synchronize_stream(s);
  }
  std::error_code stream_wait_event(device::native_stream s,
                                    device::native_event e) noexcept override {
    return inner_.stream_wait_event(s, e);
  }
  std::error_code launch_host_func(device::native_stream s, void (*fn)(void*),
                                   void* arg) noexcept override {
    return inner_.launch_host_func(s, fn, arg);
  }
  bool stream_is_capturing(device::native_stream s) noexcept override {
    return inner_.stream_is_capturing(s);
  }
  std::error_code allocate_fence_block(int d, std::size_t w,
                                       device::fence_block& out) noexcept override {
    return inner_.allocate_fence_block(d, w, out);
  }
  void free_fence_block(device::fence_block& b) noexcept override { inner_.free_fence_block(b); }
  std::error_code allocate_signal_block(int d, std::size_t n,
                                        device::signal_block& out) noexcept override {
    return inner_.allocate_signal_block(d, n, out);
  }
  void free_signal_block(device::signal_block& b) noexcept override { inner_.free_signal_block(b); }
  std::error_code write_fence(device::native_stream s, std::uint64_t address,
                              std::uint64_t value) noexcept override {
    return inner_.write_fence(s, address, value);
  }
  std::error_code set_current_device(int d) noexcept override {
    return inner_.set_current_device(d);
  }
  std::error_code current_device(int& d) noexcept override { return inner_.current_device(d); }
  void prepare_polling_thread() noexcept override { inner_.prepare_polling_thread(); }
  int begin_borrowed_polling() noexcept override { return inner_.begin_borrowed_polling(); }
  void end_borrowed_polling(int mode) noexcept override { inner_.end_borrowed_polling(mode); }
  bool in_host_func() const noexcept override { return inner_.in_host_func(); }
  std::error_code load_fence_kernels(int d) noexcept override {
    return inner_.load_fence_kernels(d);
  }
  std::error_code enqueue_signal(int d, device::native_stream s,
                                 const signal_ref& ref) noexcept override {
    return inner_.enqueue_signal(d, s, ref);
  }
  std::error_code load_signal_kernel(int d) noexcept override {
    return inner_.load_signal_kernel(d);
  }
  std::vector<int> devices_in_use() noexcept override { return inner_.devices_in_use(); }
  bool fence_kernels(int d) noexcept override { return inner_.fence_kernels(d); }
  std::error_code write_fence_by_kernel(int d, device::native_stream s, std::uint64_t address,
                                        std::uint64_t value) noexcept override {
    return inner_.write_fence_by_kernel(d, s, address, value);
  }

 protected:
  device::backend& inner_;
};

}  // namespace evr::test
