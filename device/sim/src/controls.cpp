// sim::device's test controls: the work a test enqueues (kernels, faulting kernels), fault
// injection, stalls, manual stepping, waiting for idleness, and the call counters.
//
// Thread safety: every function may be called from any thread (see scheduler.hpp for what runs
// where and impl.hpp for the parts). Controls given a handle this device does not know, or a bad
// device index, do nothing (stall, resume, inject_*) or return 0 (step, pending_operations).
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

#include "impl.hpp"

namespace evr::sim {

using detail::kernel_extra;
using detail::op_kind;
using detail::operation;
using detail::stream_state;
using evr::device::native_stream;

// --- work a test enqueues ------------------------------------------------------------------------
std::error_code device::launch_kernel(native_stream stream, std::chrono::nanoseconds duration,
                                      std::function<void()> body) {
  std::shared_ptr<stream_state> s;
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  operation op;
  op.kind = op_kind::kernel;
  op.value =
      static_cast<std::uint64_t>(std::max(duration, std::chrono::nanoseconds::zero()).count());
  if (body) op.extra = std::make_unique<kernel_extra>(kernel_extra{std::move(body), {}});
  return impl_->sched.enqueue(s, std::move(op));
}

std::error_code device::enqueue_signal(int device_index, native_stream stream,
                                       const evr::signal_ref& s) noexcept {
  if (auto ec = impl_->check_device(device_index)) return ec;
  try {
    return launch_kernel(stream, {}, [s] { evr::sim::signal(s); });
  } catch (const std::bad_alloc&) {
    return evr::make_cuda_error(2);  // cudaErrorMemoryAllocation
  }
}

std::error_code device::launch_faulting_kernel(native_stream stream, std::error_code fault) {
  std::shared_ptr<stream_state> s;
  if (auto ec = impl_->reg.find_stream(stream, s)) return ec;
  operation op;
  op.kind = op_kind::faulting_kernel;
  op.extra =
      std::make_unique<kernel_extra>(kernel_extra{{}, fault ? fault : detail::default_fault()});
  return impl_->sched.enqueue(s, std::move(op));
}

// --- faults --------------------------------------------------------------------------------------
void device::inject_fault(int device_index, std::error_code fault) {
  if (impl_->check_device(device_index)) return;
  impl_->fault_now(device_index, fault);
}

void device::inject_fault_after(int device_index, std::uint64_t operations, std::error_code fault) {
  if (impl_->check_device(device_index)) return;
  if (operations == 0) {
    impl_->fault_now(device_index, fault);
    return;
  }
  impl_->faults[static_cast<std::size_t>(device_index)].arm(operations, fault);
}

std::error_code device::fault(int device_index) const {
  if (auto ec = impl_->check_device(device_index)) return ec;
  return impl_->fault_of(device_index);
}

// --- stalls --------------------------------------------------------------------------------------
void device::stall(native_stream stream) {
  std::shared_ptr<stream_state> s;
  if (impl_->reg.find_stream(stream, s)) return;
  std::lock_guard lock(s->mutex);
  s->stalled = true;
}

void device::resume(native_stream stream) {
  std::shared_ptr<stream_state> s;
  if (impl_->reg.find_stream(stream, s)) return;
  {
    std::lock_guard lock(s->mutex);
    s->stalled = false;
  }
  s->cv.notify_all();                // the worker, if it slept on the stall
  impl_->sched.progress().notify();  // a manual-mode synchronize waiting for a change
}

// --- manual mode ---------------------------------------------------------------------------------
std::size_t device::step(native_stream stream, std::size_t n) {
  if (impl_->threaded()) return 0;
  std::shared_ptr<stream_state> s;  // keeps the stream alive if it is destroyed meanwhile
  if (impl_->reg.find_stream(stream, s)) return 0;
  return impl_->sched.step(*s, n);
}

std::size_t device::run_until_blocked() {
  if (impl_->threaded()) return 0;
  const std::size_t total = impl_->sched.run_until_blocked();
  impl_->sched.reap();
  return total;
}

std::size_t device::pending_operations(native_stream stream) const {
  std::shared_ptr<stream_state> s;
  if (impl_->reg.find_stream(stream, s)) return 0;
  std::lock_guard lock(s->mutex);
  return s->queue.size();
}

void device::wait_idle() {
  impl_->sched.progress().wait([this] { return impl_->sched.quiescent(); });
}

// --- counters ------------------------------------------------------------------------------------
call_counters device::counters() const { return impl_->count.read(); }

void device::reset_counters() { impl_->count.reset(); }

}  // namespace evr::sim
