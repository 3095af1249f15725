// python/src/loop_sink.hpp — what evr keeps per asyncio event loop: the completion queue and its
// eventfd (completion_sink.hpp), the loop_waker with its timerfd (loop_waker.hpp), and the
// probed waits' settling. Loop thread only, GIL held. Bound to Python as evr._evr.LoopSink
// (module.cpp); python/evr/__init__.py drives it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include <pybind11/pybind11.h>

#include "completion_sink.hpp"
#include "conversions.hpp"
#include "loop_waker.hpp"

namespace evr_py {

namespace py = pybind11;

/// One per asyncio event loop: the completion queue and its eventfd, and the loop_waker with its
/// timerfd (both watched with loop.add_reader). Loop thread only, GIL held.
struct loop_sink {
  explicit loop_sink(double max_spin_s) {
    waker.set_max_spin_ns(seconds_to_ns(max_spin_s, "evr: max_spin").count());
  }

  std::shared_ptr<completion_sink> sink = std::make_shared<completion_sink>();
  loop_waker waker;
  bool closed = false;

  int fd() const { return sink->fd(); }
  int timer_fd() const { return waker.fd(); }
  /// The eventfd's reader (and the timer's, first): resolves every completion that arrived, and
  /// the probed waits whose word is written (none is pushed before its window has ended).
  void drain() {
    resolve(sink->take());
    if (waker.probing()) settle_probed();
  }
  void resolve(completion* list) {
    const std::int64_t now = monotonic_ns();
    for (completion* c = list; c != nullptr; c = c->next) {
      if (!settled_by_loop(c)) waker.on_drained(c, now);  // else it left flight when settled
    }
    if (list != nullptr) resolve_all(list);
    waker.rearm(monotonic_ns());
  }
  /// The poller's check between its yields: resolves what arrived, and the probed waits whose
  /// fence word is written, without a system call (the resumed coroutine should not wait for
  /// one). Returns whether something was resolved.
  bool poll() {
    bool any = false;
    if (sink->has_pending()) {
      resolve(sink->take_nodes());  // the eventfd is left to its reader: no system call here
      any = true;
    }
    if (waker.probing()) any |= settle_probed();
    return any;
  }
  /// Resolves the probed waits whose probe says done (loop_waker::take_reached).
  bool settle_probed() {
    bool any = false;
    // The clock is read before each round of looks: settling a wait runs Python, and a look
    // after it must not note the time of the looks before it.
    while (completion* c = waker.take_reached(monotonic_ns())) {
      (void)settle_from_probe(c);  // true: pushed meanwhile, the drain frees it
      any = true;
    }
    if (any) waker.rearm(monotonic_ns());
    return any;
  }
  /// The timerfd's reader: a predicted completion is near. Drains what came, then opens the
  /// window of the earliest due wait: its future's `_open_window(until_ns)` wakes the coroutine
  /// awaiting it, which polls (poll()) until its completion or `until`, then calls
  /// window_closed(). A future nobody awaits declines (returns False): the window closes at once.
  void on_timer() {
    waker.on_timer_fired();
    drain();
    std::int64_t until = 0;
    std::uint64_t window = 0;
    const std::int64_t now = monotonic_ns();
    completion* c = waker.open_next(now, until, window);
    if (c == nullptr) return;
    static PyObject* s_open_window = PyUnicode_InternFromString("_open_window");  // leaked
    bool taken = false;
    PyObject* probed = c->probe ? Py_True : Py_False;
    if (PyObject* r = PyObject_CallMethodObjArgs(c->obj, s_open_window, py::int_(until).ptr(),
                                                 py::int_(window).ptr(), probed, nullptr)) {
      taken = PyObject_IsTrue(r) == 1;
      Py_DECREF(r);
    }
    PyErr_Clear();
    if (!taken) waker.window_closed(window, false, false, now, monotonic_ns());
  }
  /// The poller's window `window` ended (see on_timer): `hit` when its wait completed, polled
  /// from `opened_ns` to `closed_ns` (time.monotonic_ns()). `rearm`: False when the poller calls
  /// rearm_timer() on the loop's next round (its coroutine resumes first).
  void window_closed(std::uint64_t window, bool hit, std::int64_t opened_ns, std::int64_t closed_ns,
                     bool rearm) {
    waker.window_closed(window, true, hit, opened_ns, closed_ns, rearm);
  }
  void rearm_timer() { waker.rearm(monotonic_ns()); }
  /// The loop is closed: drop what is left without resolving; later completions go to the
  /// resolver, which drops them.
  void close() {
    if (closed) return;
    closed = true;
    waker.clear();
    discard_all(sink->close());
  }

  py::dict stats() const {
    const loop_stats& s = waker.stats();
    py::dict d;
    d["completions"] = s.completions;
    d["probe_hits"] = s.probe_hits;
    d["late_looks"] = s.late_looks;
    d["model_restarts"] = s.model_restarts;
    d["predicted"] = s.predicted;
    d["timer_fires"] = s.timer_fires;
    d["spins"] = s.spins;
    d["spin_hits"] = s.spin_hits;
    d["spin_misses"] = s.spin_misses;
    d["not_polled"] = s.not_polled;
    d["window_open"] = waker.window_open();
    d["in_flight"] = waker.in_flight();
    d["spin_seconds"] = static_cast<double>(s.spin_ns) * 1e-9;
    d["lead_seconds"] = static_cast<double>(s.lead_ns) * 1e-9;
    d["models"] = waker.models();
    d["hop_log2_ns"] = to_list(s.hop_log2_ns);
    const last_completion& l = waker.last();
    d["last_completion_ns"] = py::make_tuple(l.submitted_ns, l.pushed_ns, l.drained_ns);
    return d;
  }
};

}  // namespace evr_py
