// python/src/py_signal.hpp — signal slots for Python (evr._evr.SignalSlot, SignalTicket): what
// work that cannot call evr::signal (torch, cuBLAS, captured into a CUDA graph) ends with, so that
// a wait on it is a memory read for the reactor and no operation is added to the stream per wait.
// The public API is python/evr/_signals.py (evr.SignalSlot).
//
// Threads: every member runs with the GIL held, which also keeps a slot's arm() from racing with
// itself (signal_pool.hpp's contract). Lifetime: a slot holds its reactor (the pool and the
// backend the slot's memory belongs to), a ticket holds its slot: a ticket can be waited on for as
// long as it exists.
#pragma once

#include <cstdint>

#include <pybind11/pybind11.h>

#include <evr/pool/signal_pool.hpp>

namespace evr_py {

/// One slot of a reactor's signal pool (evr/pool/signal_pool.hpp).
struct py_signal_slot {
  pybind11::object engine;  ///< the evr._evr.Reactor it was taken from: outlives the slot
  pybind11::object owner;   ///< the evr.Reactor of that engine (where evr.wait sends tickets)
  /// Declared last, so destroyed first: giving it back may free its pool's memory through the
  /// backend, which the engine keeps alive (a simulated device dies with its last reactor).
  evr::signal_slot slot;
};

/// The next signal of a slot, given by work queued on `stream` (signal_slot::arm): what a wait
/// names. Immutable.
struct py_signal_ticket {
  std::uintptr_t stream = 0;  ///< the native stream whose work gives the signal (faults, order)
  evr::signal_ticket ticket;
  pybind11::object slot;  ///< the evr._evr.SignalSlot: keeps the word's memory alive
};

/// Adds SignalSlot and SignalTicket to `m` (Reactor.signal_slot makes slots: py_reactor).
void bind_signals(pybind11::module_& m);

}  // namespace evr_py
