// sim::device as an evr::device::backend: events, streams, fences and the per-thread current
// device, with the CUDA runtime's semantics as the model (model.hpp) states them.
//
// Errors: misuse is reported with evr::errc, device behaviour with the cudaError_t values CUDA
// uses (not ready 600, invalid resource handle 400, the sticky fault of a faulted device).
//
// Thread safety: every function may be called from any thread (impl.hpp, scheduler.hpp).
// synchronize_stream/synchronize_event refuse to run inside one of this device's host functions
// (errc::called_from_host_func), as CUDA forbids it.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>

#include "impl.hpp"

namespace evr::sim {
namespace {

using detail::event_state;
using detail::op_kind;
using detail::operation;
using detail::record_state;
using detail::stream_state;
using evr::device::event_flags;
using evr::device::fence_block;
using evr::device::ipc_event_handle;
using evr::device::native_event;
using evr::device::native_stream;

// The bytes that mark an IPC handle made by this simulator.
constexpr char ipc_magic[8] = {'e', 'v', 'r', 's', 'i', 'm', 'v', '1'};
constexpr unsigned all_event_flags = 7;

// cudaSetDevice is per host thread; one slot shared by all sim::device objects.
thread_local int tl_current_device = 0;

}  // namespace

std::error_code device::device_count(int& count) noexcept {
  count = static_cast<int>(impl_->gpus);
  if (count == 0) return make_cuda_error(cuda_value::no_device);
  return {};
}

// --- events --------------------------------------------------------------------------------------
std::error_code device::create_event(int device, event_flags flags, native_event& out) noexcept {
  out = nullptr;
  if ((static_cast<unsigned>(flags) & ~all_event_flags) != 0) {
    return make_error_code(errc::invalid_argument);
  }
  if (has_flag(flags, event_flags::interprocess) && has_flag(flags, event_flags::timing)) {
    return make_error_code(errc::interprocess_requires_no_timing);
  }
  if (auto ec = impl_->check_device(device)) return ec;
  if (auto ec = impl_->fault_of(device)) return ec;
  event_state e;
  e.device = device;
  e.flags = flags;
  e.core = std::make_shared<detail::event_core>(device);
  out = impl_->reg.add_event(std::move(e));
  impl_->count.events_created.bump();
  return {};
}

void device::destroy_event(native_event event) noexcept {
  impl_->reg.remove_event(event, [this] { impl_->count.events_destroyed.bump(); });
}

std::error_code device::record_event(native_event event, native_stream stream) noexcept {
  impl_->count.event_records.bump();
  event_state e;
  std::shared_ptr<stream_state> s;
  if (auto ec = impl_->reg.find_event(event, e)) return ec;
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  if (e.device != s->device) return make_error_code(errc::device_mismatch);
  if (auto ec = impl_->fault_of(s->device)) return ec;
  operation op;
  op.kind = op_kind::record;
  op.record = std::make_shared<record_state>(s);
  bool wake = false;
  {
    // The event points at the new record in the same critical section that enqueues it, so that
    // concurrent re-records leave the event on the record enqueued last.
    std::lock_guard core_lock(e.core->mutex);
    std::lock_guard lock(s->mutex);
    e.core->record = op.record;  // re-recording overwrites; enqueued waits keep the old record
    wake = impl_->sched.push_locked(*s, std::move(op));
  }
  if (wake) impl_->sched.hand_to_runner(s);
  return {};
}

std::error_code device::query_event(native_event event) noexcept {
  impl_->count.event_queries.bump();
  impl_->spend_query_cost();
  event_state e;
  if (auto ec = impl_->reg.find_event(event, e)) return ec;
  if (auto ec = impl_->fault_of(e.device)) return ec;
  return e.core->complete() ? std::error_code{} : detail::not_ready();
}

std::error_code device::synchronize_event(native_event event) noexcept {
  event_state e;
  if (auto ec = impl_->reg.find_event(event, e)) return ec;
  if (detail::scheduler::in_host_func(impl_->sched.owner())) {
    return make_error_code(errc::called_from_host_func);
  }
  const int dev = e.device;
  // Waits for the record current now; a re-record meanwhile does not move the goal.
  const std::shared_ptr<record_state> record = e.core->current();
  if (impl_->threaded()) {
    std::error_code result;
    impl_->sched.progress().wait([&] {
      result = impl_->fault_of(dev);
      return result || !record || record->is_done();
    });
    return result;
  }
  for (;;) {
    if (auto ec = impl_->fault_of(dev)) return ec;
    if (!record || record->is_done()) return {};
    const std::shared_ptr<stream_state> s = record->stream.lock();
    if (s != nullptr && impl_->sched.step(*s, 1) == 1) continue;
    const bool waited = impl_->sched.manual_wait_or_give_up([&] {
      if (impl_->fault_of(dev) || record->is_done()) return true;
      if (s == nullptr) return false;
      std::lock_guard lock(s->mutex);
      return impl_->sched.can_start(*s);
    });
    if (!waited) return detail::would_deadlock();
  }
}

std::error_code device::elapsed_ms(native_event start, native_event end, float& ms) noexcept {
  ms = 0.0f;
  event_state a;
  event_state b;
  if (auto ec = impl_->reg.find_event(start, a)) return ec;
  if (auto ec = impl_->reg.find_event(end, b)) return ec;
  if (auto ec = impl_->fault_of(a.device)) return ec;
  if (auto ec = impl_->fault_of(b.device)) return ec;
  if (!has_flag(a.flags, event_flags::timing) || !has_flag(b.flags, event_flags::timing)) {
    return make_error_code(errc::timing_disabled);
  }
  if (a.device != b.device) return make_error_code(errc::device_mismatch);
  const std::shared_ptr<record_state> ra = a.core->current();
  const std::shared_ptr<record_state> rb = b.core->current();
  if (!ra || !rb) return make_error_code(errc::event_never_recorded);
  if (!ra->is_done() || !rb->is_done()) return detail::not_ready();
  ms = std::chrono::duration<float, std::milli>(rb->done_at - ra->done_at).count();
  return {};
}

// Handle layout: magic (8 bytes), sim::device instance id (8), token (8), pid (4), zeros.
std::error_code device::export_event(native_event event, ipc_event_handle& out) noexcept {
  out = {};
  event_state e;
  if (auto ec = impl_->reg.find_event(event, e)) return ec;
  if (auto ec = impl_->fault_of(e.device)) return ec;
  // What cudaIpcGetEventHandle reports for an event made without cudaEventInterprocess.
  if (!has_flag(e.flags, event_flags::interprocess)) return detail::bad_handle();
  const std::uint64_t token = impl_->reg.export_token(event);
  if (token == 0) return detail::bad_handle();  // destroyed meanwhile
  const auto pid = static_cast<std::int32_t>(::getpid());
  std::memcpy(out.bytes, ipc_magic, 8);
  std::memcpy(out.bytes + 8, &impl_->instance_id, 8);
  std::memcpy(out.bytes + 16, &token, 8);
  std::memcpy(out.bytes + 24, &pid, 4);
  return {};
}

std::error_code device::import_event(const ipc_event_handle& handle, native_event& out) noexcept {
  out = nullptr;
  std::uint64_t instance = 0;
  std::uint64_t token = 0;
  std::memcpy(&instance, handle.bytes + 8, 8);
  std::memcpy(&token, handle.bytes + 16, 8);
  if (std::memcmp(handle.bytes, ipc_magic, 8) != 0 || instance != impl_->instance_id) {
    return make_error_code(errc::invalid_ipc_handle);
  }
  std::shared_ptr<detail::event_core> core = impl_->reg.exported(token);
  if (core == nullptr) return make_error_code(errc::invalid_ipc_handle);
  if (auto ec = impl_->fault_of(core->device)) return ec;
  event_state e;
  e.device = core->device;
  e.flags = event_flags::interprocess;  // an imported event behaves as non-timing
  e.imported = true;
  e.core = std::move(core);
  out = impl_->reg.add_event(std::move(e));
  impl_->count.events_created.bump();
  return {};
}

// --- streams -------------------------------------------------------------------------------------
std::error_code device::create_stream(int device, int priority, native_stream& out) noexcept {
  out = nullptr;
  impl_->sched.reap();
  if (auto ec = impl_->check_device(device)) return ec;
  if (auto ec = impl_->fault_of(device)) return ec;
  std::shared_ptr<stream_state> s = impl_->reg.new_stream(
      device, std::clamp(priority, detail::greatest_priority, detail::least_priority));
  if (impl_->threaded()) {
    try {
      impl_->sched.start_worker(*s);
    } catch (const std::system_error& e) {
      return e.code();
    }
  }
  out = s.get();
  impl_->reg.add_stream(std::move(s));
  return {};
}

void device::destroy_stream(native_stream stream) noexcept {
  // Enqueued work still runs (cudaStreamDestroy does not wait and does not cancel).
  if (std::shared_ptr<stream_state> s = impl_->reg.retire_stream(stream)) {
    {
      std::lock_guard lock(s->mutex);
      s->retired = true;
    }
    s->cv.notify_all();
    impl_->sched.progress().notify();
  }
  impl_->sched.reap();
}

std::error_code device::stream_device(native_stream stream, int& device) noexcept {
  std::shared_ptr<stream_state> s;
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  device = s->device;
  return {};
}

std::error_code device::stream_priority(native_stream stream, int& priority) noexcept {
  std::shared_ptr<stream_state> s;
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  priority = s->priority;
  return {};
}

std::error_code device::query_stream(native_stream stream) noexcept {
  impl_->count.stream_queries.bump();
  impl_->spend_query_cost();
  std::shared_ptr<stream_state> s;
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  if (auto ec = impl_->fault_of(s->device)) return ec;
  std::lock_guard lock(s->mutex);
  return (s->queue.empty() && !s->busy) ? std::error_code{} : detail::not_ready();
}

std::error_code device::synchronize_stream(native_stream stream) noexcept {
  std::shared_ptr<stream_state> s;  // survives a destroy meanwhile
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  if (detail::scheduler::in_host_func(impl_->sched.owner())) {
    return make_error_code(errc::called_from_host_func);
  }
  auto drained = [&] {
    std::lock_guard lock(s->mutex);
    return s->queue.empty() && !s->busy;
  };
  if (impl_->threaded()) {
    std::error_code result;
    impl_->sched.progress().wait([&] {
      result = impl_->fault_of(s->device);
      return result || drained();
    });
    return result;
  }
  for (;;) {
    if (auto ec = impl_->fault_of(s->device)) return ec;
    if (drained()) return {};
    if (impl_->sched.step(*s, 1) == 1) continue;
    const bool waited = impl_->sched.manual_wait_or_give_up([&] {
      if (impl_->fault_of(s->device)) return true;
      std::lock_guard lock(s->mutex);
      return (s->queue.empty() && !s->busy) || impl_->sched.can_start(*s);
    });
    if (!waited) return detail::would_deadlock();
  }
}

std::error_code device::stream_wait_event(native_stream stream, native_event event) noexcept {
  std::shared_ptr<stream_state> s;
  event_state e;
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  if (auto ec = impl_->reg.find_event(event, e)) return ec;
  if (auto ec = impl_->fault_of(s->device)) return ec;
  // Waiting on a never-recorded event is a no-op (CUDA); otherwise the wait captures the current
  // record, which a later re-record does not change. Cross-device waits are allowed, as in CUDA.
  std::shared_ptr<record_state> record = e.core->current();
  if (!record) return {};
  operation op;
  op.kind = op_kind::wait;
  op.record = std::move(record);
  return impl_->sched.enqueue(s, std::move(op));
}

std::error_code device::launch_host_func(native_stream stream, void (*fn)(void*),
                                         void* arg) noexcept {
  if (fn == nullptr) return make_error_code(errc::invalid_argument);
  std::shared_ptr<stream_state> s;
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  operation op;
  op.kind = op_kind::host_func;
  op.fn = fn;
  op.target = arg;
  auto ec = impl_->sched.enqueue(s, std::move(op));
  if (!ec) impl_->count.host_funcs_launched.bump();
  return ec;
}

// --- fences --------------------------------------------------------------------------------------
std::error_code device::allocate_fence_block(int device, std::size_t words,
                                             fence_block& out) noexcept {
  out = {};
  constexpr std::size_t line = fence_block::stride_words * sizeof(std::uint64_t);  // 64 bytes
  if (words == 0 || words > SIZE_MAX / line) return make_error_code(errc::invalid_argument);
  if (auto ec = impl_->check_device(device)) return ec;
  if (auto ec = impl_->fault_of(device)) return ec;
  const std::size_t bytes = words * line;
  void* p = std::aligned_alloc(line, bytes);
  if (p == nullptr) return make_cuda_error(2);  // cudaErrorMemoryAllocation
  std::memset(p, 0, bytes);
  impl_->reg.add_fence_block(reinterpret_cast<std::uintptr_t>(p), bytes);
  out.host = static_cast<std::uint64_t*>(p);
  out.device_address = reinterpret_cast<std::uintptr_t>(p);  // the sim maps host memory 1:1
  out.words = words;
  out.allocation = p;
  return {};
}

void device::free_fence_block(fence_block& block) noexcept {
  if (block.allocation == nullptr) return;
  // Unregistered, then retired: a fence write still queued never lands in freed memory.
  if (detail::fence_block_state* b =
          impl_->reg.remove_fence_block(reinterpret_cast<std::uintptr_t>(block.allocation))) {
    b->retire();
  }
  std::free(block.allocation);
  block = {};
}

std::error_code device::allocate_signal_block(int device, std::size_t slots,
                                              evr::device::signal_block& out) noexcept {
  using evr::device::signal_block;
  out = {};
  constexpr std::size_t line = signal_block::word_stride * sizeof(std::uint64_t);  // 64 bytes
  if (slots == 0 || slots > SIZE_MAX / line) return make_error_code(errc::invalid_argument);
  if (auto ec = impl_->check_device(device)) return ec;
  if (auto ec = impl_->fault_of(device)) return ec;
  void* words = std::aligned_alloc(line, slots * line);
  void* counters =
      std::aligned_alloc(line, (slots * signal_block::counter_bytes + line - 1) / line * line);
  if (words == nullptr || counters == nullptr) {
    std::free(words);
    std::free(counters);
    return make_cuda_error(2);  // cudaErrorMemoryAllocation
  }
  std::memset(words, 0, slots * line);
  std::memset(counters, 0, slots * signal_block::counter_bytes);
  out.host = static_cast<std::uint64_t*>(words);
  out.device_words = reinterpret_cast<std::uintptr_t>(words);  // the sim maps host memory 1:1
  out.device_counters = reinterpret_cast<std::uintptr_t>(counters);
  out.slots = slots;
  out.host_allocation = words;
  out.device_allocation = counters;
  return {};
}

void device::free_signal_block(evr::device::signal_block& block) noexcept {
  std::free(block.host_allocation);
  std::free(block.device_allocation);
  block = {};
}

void signal(const evr::signal_ref& s) noexcept {
  const unsigned long long n =
      std::atomic_ref<unsigned long long>(*s.counter).fetch_add(1, std::memory_order_relaxed) + 1;
  std::atomic_ref<unsigned long long>(*s.word).store(n, std::memory_order_release);
}

std::error_code device::impl::enqueue_fence(const std::shared_ptr<stream_state>& s,
                                            std::uint64_t device_address, std::uint64_t value) {
  if (auto ec = fault_of(s->device)) return ec;
  // Only words of a live fence block: a bad address is a bug to report, not memory to scribble.
  const auto address = static_cast<std::uintptr_t>(device_address);
  detail::fence_block_state* block = reg.find_fence_block(address);
  if (block == nullptr) return make_error_code(errc::invalid_argument);
  operation op;
  op.kind = op_kind::fence;
  op.target = reinterpret_cast<std::uint64_t*>(address);
  op.value = value;
  op.block = block;
  return sched.enqueue(s, std::move(op));
}

std::error_code device::write_fence(native_stream stream, std::uint64_t device_address,
                                    std::uint64_t value) noexcept {
  std::shared_ptr<stream_state> s;
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  auto ec = impl_->enqueue_fence(s, device_address, value);
  if (!ec) impl_->count.fence_writes_enqueued.bump();
  return ec;
}

std::error_code device::load_fence_kernels(int device) noexcept {
  impl_->count.fence_kernel_loads.bump();
  if (auto ec = impl_->check_device(device)) return ec;
  if (!impl_->opts.fence_kernels) return make_error_code(errc::unsupported);
  impl_->fence_kernel_ready[static_cast<std::size_t>(device)].store(true,
                                                                    std::memory_order_release);
  return {};
}

std::vector<int> device::devices_in_use() noexcept {
  const int all = static_cast<int>(impl_->gpus);
  const int n = impl_->opts.devices_in_use < 0 ? all : std::min(impl_->opts.devices_in_use, all);
  std::vector<int> out;
  for (int d = 0; d < n; ++d) out.push_back(d);
  return out;
}

bool device::fence_kernels(int device) noexcept {
  if (!impl_->opts.fence_kernels || impl_->check_device(device)) return false;
  return !impl_->opts.fence_kernels_after_load ||
         impl_->fence_kernel_ready[static_cast<std::size_t>(device)].load(
             std::memory_order_acquire);
}

std::error_code device::write_fence_by_kernel(int device, native_stream stream,
                                              std::uint64_t device_address,
                                              std::uint64_t value) noexcept {
  if (!impl_->opts.fence_kernels) return make_error_code(errc::unsupported);
  if (auto ec = impl_->check_device(device)) return ec;
  if (!fence_kernels(device)) return make_error_code(errc::unsupported);  // not loaded yet
  std::shared_ptr<stream_state> s;
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  if (s->device != device) return make_error_code(errc::device_mismatch);
  auto ec = impl_->enqueue_fence(s, device_address, value);
  if (!ec) impl_->count.fence_kernels_enqueued.bump();
  return ec;
}

// --- threads -------------------------------------------------------------------------------------
std::error_code device::set_current_device(int device) noexcept {
  if (auto ec = impl_->check_device(device)) return ec;
  tl_current_device = device;
  return {};
}

std::error_code device::current_device(int& device) noexcept {
  device = tl_current_device;
  if (impl_->gpus == 0) return make_error_code(errc::no_device);
  return {};
}

void device::prepare_polling_thread() noexcept {}

bool device::in_host_func() const noexcept {
  return detail::scheduler::in_host_func(impl_->sched.owner());
}

}  // namespace evr::sim
