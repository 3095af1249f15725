// reactor/src/submitter.hpp — the submitting threads' side of the reactor: find (or create) the
// stream's state, put a marker on the stream, push the wait onto the lock-free submission stack
// and wake the reactor when the idle governor's rule says it must be woken.
//
// Owns: the stream table (and the stream states: freed, or kept for the process where a host
// function may still touch one, when the submitter is destroyed), the fence words, the
// submission stack. Uses the marker budget (which marker), the control inbox (a sticky fault
// met here; whether the reactor is stopping), the idle governor (its wake-up rule, a host's
// window).
//
// Threads: submit() on any thread (lock-free but for the per-stream marker lock, held for one
// driver call); take_all() / close() by the holder of the pass lock (the reactor thread, or a
// host's pass); the rest on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <system_error>

#include <evr/device/backend.hpp>
#include <evr/pool/pool_set.hpp>
#include <evr/reactor/detail/poll_host.hpp>
#include <evr/reactor/detail/wait_op.hpp>
#include <evr/reactor/options.hpp>
#include <evr/reactor/wait_target.hpp>

#include "control_inbox.hpp"
#include "counters.hpp"
#include "idle_governor.hpp"
#include "intrusive_stack.hpp"
#include "marker_budget.hpp"
#include "strategy_traits.hpp"
#include "stream_state.hpp"
#include "wakeup.hpp"

namespace evr::detail {

class submitter {
 public:
  using stack = intrusive_stack<wait_op, &wait_op::next_>;
  struct parts {
    device::backend& backend;
    const reactor_options& options;
    const strategy_traits& traits;
    pool_set& pools;
    std::shared_ptr<wakeup> wake;
    reactor_counters& counters;
    marker_budget& markers;
    control_inbox& inbox;
    const idle_governor& idle;
  };
  explicit submitter(parts p);
  ~submitter();
  submitter(const submitter&) = delete;
  submitter& operator=(const submitter&) = delete;

  /// reactor::submit (`window`: for a hosted wait, reactor_access::submit_hosted). Any thread.
  std::error_code submit(wait_op* op, const wait_target& target, host_window* window) noexcept;

  /// (reactor) The submitted waits, oldest first, linked through next_ (stack::for_each).
  wait_op* take_all() noexcept { return submissions_.take_all(); }
  /// (reactor) The same, and every later push fails (the reactor is stopping).
  wait_op* close() noexcept { return submissions_.close(); }
  /// Something was pushed (seq_cst: the reactor's last look before it sleeps).
  bool pending() const noexcept { return !submissions_.empty_or_closed(); }
  std::size_t stream_count() const noexcept { return streams_.size(); }
  /// Fence writes may still land after the reactor: keep the fence words for the process.
  void keep_fence_words() noexcept { fences_.leak_on_destruction(); }

 private:
  std::error_code refuse(std::error_code ec) noexcept;
  std::error_code prepare(wait_op& op, const wait_target& target) noexcept;
  std::error_code prepare_event(wait_op& op, const wait_target& target) noexcept;
  std::error_code prepare_stream(wait_op& op, const wait_target& target) noexcept;
  std::error_code prepare_signal(wait_op& op, const wait_target& target) noexcept;
  std::error_code push(wait_op& op, host_window* window) noexcept;
  std::error_code find_stream(const wait_target& target, stream_state*& out) noexcept;
  std::error_code take_event(stream_state& st, event_pool*& pool,
                             device::native_event& ev) noexcept;
  std::error_code put_marker(stream_state& st, wait_op& op) noexcept;
  /// wait_target::probed(): gives the caller the fence word `op` was given, if it was.
  void give_probe(stream_state& st, wait_op& op, const wait_target& target) noexcept;
  static void host_func_done(void* state) noexcept;  // host_func strategy marker

  parts p_;
  int device_count_ = 0;  // at construction; names the device of a fault when only one exists
  stream_table streams_;
  fence_allocator fences_;
  stack submissions_;
};

}  // namespace evr::detail
