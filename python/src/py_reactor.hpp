// python/src/py_reactor.hpp — evr._evr.Reactor: an evr::reactor (on the CUDA backend or a
// simulated device) and the Python waits on it: asyncio futures resolved through their loop's
// sink, concurrent futures and releases through the resolver thread (completion_sink.hpp).
//
// Threads: every member runs with the GIL held unless it says it releases it. The reactor thread
// runs only the inline callbacks of submit, which touch no Python object.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <pybind11/pybind11.h>

#include <evr/callbacks/wait_handle.hpp>
#include <evr/reactor/reactor.hpp>
#include <evr/reactor/wait_target.hpp>
#include <evr/sim/device.hpp>

#include "completion_sink.hpp"
#include "loop_waker.hpp"
#include "py_signal.hpp"

namespace evr_py {

/// What cancels the C++ wait when its future is cancelled (an asyncio task cancelled while
/// awaiting evr.wait, or Future.cancel()). Any thread; at most one cancel.
struct wait_canceller {
  evr::wait_handle handle;
  bool cancelled = false;  ///< set when cancel() moved the wait to cancelled (for tests)
  /// evr.wait's future calls this from its cancel() once it is cancelled: cancels the C++ wait.
  bool cancel();
  /// A concurrent future's done callback (evr.wait_future): cancels the wait if the future was.
  void operator()(pybind11::handle fut);
};

class py_reactor {
 public:
  /// `strategy`: None or a strategy's name; `sim`: None (the CUDA backend) or an
  /// evr._evr.SimDevice; `options`: reactor_options fields by name (durations in seconds).
  /// ValueError / TypeError naming what was wrong.
  py_reactor(std::optional<std::string> strategy, pybind11::object sim, pybind11::dict options);
  /// Stops and joins the reactor (GIL released meanwhile).
  ~py_reactor();

  /// What a wait on a stream (kind 0) or an event (kind 1) of this reactor's backend names.
  evr::wait_target target(int kind, std::uintptr_t handle, int device) const;
  /// What a wait on a signal ticket names; EvrValueError (backend_mismatch) when the ticket's
  /// slot is of another reactor (its word is of that reactor's pool).
  evr::wait_target target(const py_signal_ticket& t) const;

  /// An asyncio future's wait. `key`: what the loop predicts the wait's work by (its stream or
  /// event handle). Returns the wait's wake-up time (see loop_waker), 0 when it has none.
  std::int64_t wait_async(const std::shared_ptr<completion_sink>& sink, loop_waker& waker,
                          pybind11::handle fut, const evr::wait_target& t, std::uintptr_t key);
  void wait_future(pybind11::handle fut, const evr::wait_target& t);
  /// Drops the reference to `obj` once the GPU is past the work; never early (see release_after
  /// in python/evr/__init__.py): if the wait is refused, synchronizes the stream (kind 0) or the
  /// event (kind 1) `handle` first.
  void release_after(pybind11::handle obj, const evr::wait_target& t, int kind,
                     std::uintptr_t handle);
  /// A slot of this reactor's signal pool of `device` (-1: the calling thread's current device).
  /// `self` is this object as Python holds it and `owner` the evr.Reactor over it: the slot
  /// keeps both alive.
  py_signal_slot signal_slot(pybind11::object self, pybind11::object owner, int device);
  /// evr::reactor::prepare_device on `device` (-1: the calling thread's current device), the GIL
  /// released meanwhile; raises what it returned.
  void prepare_device(int device);
  void stop();  // GIL released while the reactor drains
  pybind11::dict metrics() const;

  std::string strategy() const { return evr::to_string(r_->options().strategy); }
  std::string backend_name() const { return std::string(r_->backend().name()); }
  std::string describe() const { return r_->backend().describe(); }

 private:
  std::int64_t submit(const std::shared_ptr<completion_sink>& sink, pybind11::handle fut,
                      completion::kind what, const evr::wait_target& t, loop_waker* waker = nullptr,
                      std::uintptr_t key = 0);

  std::shared_ptr<evr::sim::device> sim_;  // destroyed after the reactor (declared first)
  std::unique_ptr<evr::reactor> r_;
  /// The reactor's fence words are readable (GIL): probed waits' nodes share it (completion).
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace evr_py
