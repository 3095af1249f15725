// A device on which all work is already done: every marker completes at once. It allocates
// nothing, so a test can count the heap allocations of evr itself around it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <evr/device/backend.hpp>

namespace evr::test {

class instant_backend final : public device::backend {
 public:
  std::string_view name() const noexcept override { return "instant"; }
  bool is_simulated() const noexcept override { return true; }
  std::string describe() const override { return "instant test device"; }
  std::error_code device_count(int& count) noexcept override {
    count = 1;
    return {};
  }
  std::error_code create_event(int, device::event_flags,
                               device::native_event& out) noexcept override {
    out = new char;  // created off the measured window (pools pre-create in batches)
    return {};
  }
  void destroy_event(device::native_event e) noexcept override { delete static_cast<char*>(e); }
  std::error_code record_event(device::native_event, device::native_stream) noexcept override {
    return {};
  }
  std::error_code query_event(device::native_event) noexcept override { return {}; }
  std::error_code synchronize_event(device::native_event) noexcept override { return {}; }
  std::error_code elapsed_ms(device::native_event, device::native_event,
                             float& ms) noexcept override {
    ms = 0;
    return {};
  }
  std::error_code export_event(device::native_event, device::ipc_event_handle&) noexcept override {
    return make_error_code(errc::unsupported);
  }
  std::error_code import_event(const device::ipc_event_handle&,
                               device::native_event&) noexcept override {
    return make_error_code(errc::unsupported);
  }
  std::error_code create_stream(int, int, device::native_stream& out) noexcept override {
    out = new char;
    return {};
  }
  void destroy_stream(device::native_stream s) noexcept override { delete static_cast<char*>(s); }
  std::error_code stream_device(device::native_stream, int& d) noexcept override {
    d = 0;
    return {};
  }
  std::error_code stream_priority(device::native_stream, int& p) noexcept override {
    p = 0;
    return {};
  }
  std::error_code query_stream(device::native_stream) noexcept override { return {}; }
  std::error_code synchronize_stream(device::native_stream) noexcept override { return {}; }
  std::error_code stream_wait_event(device::native_stream, device::native_event) noexcept override {
    return {};
  }
  std::error_code launch_host_func(device::native_stream, void (*fn)(void*),
                                   void* arg) noexcept override {
    fn(arg);  // "the stream is idle": runs at once
    return {};
  }
  std::error_code allocate_fence_block(int, std::size_t words,
                                       device::fence_block& out) noexcept override {
    words_.assign(words * device::fence_block::stride_words, 0);
    out.host = words_.data();
    out.device_address = reinterpret_cast<std::uintptr_t>(words_.data());
    out.words = words;
    return {};
  }
  void free_fence_block(device::fence_block&) noexcept override {}
  std::error_code write_fence(device::native_stream, std::uint64_t address,
                              std::uint64_t value) noexcept override {
    std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(address))
        .store(value, std::memory_order_release);
    return {};
  }
  std::error_code set_current_device(int) noexcept override { return {}; }
  std::error_code current_device(int& d) noexcept override {
    d = 0;
    return {};
  }
  void prepare_polling_thread() noexcept override {}
  bool in_host_func() const noexcept override { return false; }

 private:
  std::vector<std::uint64_t> words_;  // one block is enough for the tests that use this
};

}  // namespace evr::test
