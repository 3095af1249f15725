// python/src/module.cpp — evr._evr: the reactor, the completion path and the simulated device for
// Python. The public Python API is python/evr/__init__.py; this module is its engine and is not
// meant to be used directly.
//
// Threads: every function here runs with the GIL held unless it says it releases it. The reactor
// thread runs only the inline callbacks below, which touch no Python object (completion_sink.hpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <evr/callbacks/on_complete.hpp>
#include <evr/callbacks/wait_handle.hpp>
#include <evr/device/backend.hpp>
#include <evr/device/cuda_status.hpp>
#include <evr/device/error.hpp>
#include <evr/device/event.hpp>
#include <evr/device/stream.hpp>
#include <evr/reactor/options.hpp>
#include <evr/reactor/reactor.hpp>
#include <evr/sim/device.hpp>

#include "completion_sink.hpp"
#include "conversions.hpp"
#include "loop_sink.hpp"
#include "loop_waker.hpp"

namespace py = pybind11;

#ifndef EVR_PYTHON_VERSION
#error "EVR_PYTHON_VERSION (evr's version) is set by python/CMakeLists.txt"
#endif

namespace evr_py {
namespace {

[[noreturn]] void raise(const std::error_code& ec) {
  set_python_error(ec);
  throw py::error_already_set();
}

/// A query's answer: true when done, false when not ready; raises any other error.
bool done_or_raise(const std::error_code& ec) {
  if (!ec) return true;
  if (evr::is_not_ready(ec)) return false;
  raise(ec);
}

// --- the simulated device ----------------------------------------------------------------------
struct sim_device {
  explicit sim_device(int devices, evr::sim::run_mode mode)
      : dev(std::make_shared<evr::sim::device>(evr::sim::options{devices, mode})) {}
  std::shared_ptr<evr::sim::device> dev;
};

struct sim_stream {
  std::shared_ptr<evr::sim::device> dev;  // outlives the stream (declared first)
  evr::stream s;
  std::uintptr_t handle() const { return reinterpret_cast<std::uintptr_t>(s.native()); }
};

struct sim_event {
  std::shared_ptr<evr::sim::device> dev;
  evr::event e;
};

std::error_code cuda_code(int value) {
  return value == 0 ? std::error_code{} : evr::make_cuda_error(value);
}

// --- cancellation ------------------------------------------------------------------------------
/// A future's done callback: cancels the evr wait when the future was cancelled (an asyncio task
/// cancelled while awaiting evr.wait, or Future.cancel()). Any thread; at most one cancel.
struct wait_canceller {
  evr::wait_handle handle;
  bool cancelled = false;  ///< set when cancel() moved the wait to cancelled (for tests)
  /// evr.wait's future calls this from its cancel() once it is cancelled: cancels the C++ wait.
  bool cancel() {
    cancelled = handle.cancel();
    handle.reset();  // the future is done: nothing left to cancel
    return cancelled;
  }
  /// A concurrent future's done callback (evr.wait_future): cancels the wait if the future was.
  void operator()(py::handle fut) {
    PyObject* r = PyObject_CallMethod(fut.ptr(), "cancelled", nullptr);
    if (r == nullptr) throw py::error_already_set();
    bool was = PyObject_IsTrue(r) == 1;
    Py_DECREF(r);
    if (was) cancelled = handle.cancel();
    handle.reset();
  }
};

// --- the reactor -------------------------------------------------------------------------------
class py_reactor {
 public:
  py_reactor(std::optional<std::string> strategy, py::object sim, py::dict options) {
    evr::reactor_options o;
    if (strategy) {
      auto s = evr::strategy_from_string(*strategy);
      if (!s) {
        throw py::value_error("evr.Reactor: unknown strategy '" + *strategy +
                              "' (expected 'adaptive', 'fence', 'poll' or 'host_func')");
      }
      o.strategy = *s;
    }
    for (auto item : options) {
      std::string key = py::str(item.first);
      py::handle v = item.second;
      auto dur = [&](std::chrono::nanoseconds& field) {
        field = seconds_to_ns(v.cast<double>(), ("evr.Reactor: " + key).c_str());
      };
      auto count = [&](std::size_t& field) {
        long long n = v.cast<long long>();
        if (n < 0) throw py::value_error("evr.Reactor: " + key + " must be >= 0");
        field = static_cast<std::size_t>(n);
      };
      if (key == "idle") {
        std::string m = py::str(v);
        auto mode = evr::idle_mode_from_string(m);
        if (!mode) {
          throw py::value_error("evr.Reactor: unknown idle mode '" + m +
                                "' (expected 'predictive', 'ladder' or 'spin')");
        }
        o.idle = *mode;
      } else if (key == "spin_window") {
        dur(o.spin_window);
      } else if (key == "yield_window") {
        dur(o.yield_window);
      } else if (key == "max_sleep") {
        dur(o.max_sleep);
      } else if (key == "poll_period") {
        dur(o.poll_period);
      } else if (key == "prespin") {
        dur(o.prespin);
      } else if (key == "final_sleep") {
        dur(o.final_sleep);
      } else if (key == "coalesce") {
        dur(o.coalesce);
      } else if (key == "doorbell_after") {
        dur(o.doorbell_after);
      } else if (key == "fault_probe_interval") {
        dur(o.fault_probe_interval);
      } else if (key == "shutdown_drain") {
        dur(o.shutdown_drain);
      } else if (key == "spin_fraction") {
        o.spin_fraction = v.cast<double>();
      } else if (key == "poll_budget") {
        o.poll_budget = v.cast<double>();
      } else if (key == "poll_looks_per_second") {
        count(o.poll_looks_per_second);
      } else if (key == "loose_query_budget") {
        count(o.loose_query_budget);
      } else if (key == "max_streams") {
        count(o.max_streams);
      } else if (key == "max_pending_fences") {
        count(o.max_pending_fences);
      } else if (key == "max_fence_streams") {
        count(o.max_fence_streams);
      } else if (key == "pool_batch") {
        count(o.pool_batch);
      } else {
        throw py::type_error("evr.Reactor: unknown option '" + key + "'");
      }
    }
    evr::device::backend* backend = nullptr;
    if (!sim.is_none()) {
      sim_ = sim.cast<sim_device&>().dev;
      backend = sim_.get();
    } else {
      if (!evr::device::cuda_compiled_in()) {
        raise(evr::make_error_code(evr::errc::unsupported));
      }
      backend = &evr::device::cuda_backend();
    }
    try {
      r_ = std::make_unique<evr::reactor>(*backend, o);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(std::string("evr.Reactor: ") + e.what());
    }
  }

  ~py_reactor() {
    // Stops and joins; the reactor's callbacks take no GIL, so releasing it is only for the
    // other Python threads' sake.
    // Under the GIL, before the fence words can go: no loop reads a probe from now on.
    *alive_ = false;
    py::gil_scoped_release nogil;
    r_.reset();
  }

  evr::wait_target target(int kind, std::uintptr_t handle, int device) const {
    void* native = reinterpret_cast<void*>(handle);
    return kind == 0 ? evr::wait_target::of_stream(r_->backend(), native)
                     : evr::wait_target::of_event(r_->backend(), native, device);
  }

  /// Starts a wait whose completion resolves `fut` through `sink`, and makes cancelling `fut`
  /// cancel the C++ wait (evr::wait_handle; it then completes once with operation_aborted, which
  /// the drain skips for a cancelled future). Raises on refusal.
  std::int64_t submit(const std::shared_ptr<completion_sink>& sink, py::handle fut,
                      completion::kind what, const evr::wait_target& t, loop_waker* waker = nullptr,
                      std::uintptr_t key = 0) {
    auto* c = new completion;
    c->what = what;
    c->obj = fut.inc_ref().ptr();
    // Before the reactor can see the node (it may be drained and freed right after on_complete).
    const std::int64_t wake_at = waker != nullptr ? waker->on_submit(c, key) : 0;
    // A wait without a wake-up time reaches its loop (or the resolver thread) through an
    // eventfd: that wake-up (tens of us) dwarfs what the reactor's spinning would save. A wait
    // with one is polled through its window: it is probed (a fence word its pollers read, and the
    // reactor sleeps until the window ends), or, with an event marker, the reactor spins for it.
    evr::wait_probe probe;
    evr::wait_target target = t.unhurried();
    if (wake_at != 0) {
      // The earliest its window can end (loop_waker::open_next): the reactor looks from then
      // on, spinning (the target as given) if the work has not ended, so that a missed window
      // is found at once and the loop's model learns the right time.
      const std::int64_t window_end = std::min(c->spin_until, wake_at + waker->max_spin_ns());
      target = t.probed(probe, std::chrono::steady_clock::now() +
                                   std::chrono::nanoseconds(window_end - monotonic_ns()));
    }
    auto canceller = std::make_unique<wait_canceller>();
    std::shared_ptr<completion_sink> keep = sink;  // the sink outlives the pending wait
    std::error_code ec = evr::on_complete(
        *r_, target,
        [c, keep = std::move(keep)](std::error_code e) {
          c->ec = e;
          c->pushed_ns = monotonic_ns();
          // The loop settled it from its probe first: nobody waits for the node but its free.
          if (c->settled.exchange(completion::the_reactor, std::memory_order_acq_rel) ==
              completion::the_loop) {
            delete c;
            return;
          }
          keep->push(c);
        },
        canceller->handle);
    if (ec) {
      if (waker != nullptr) waker->on_refused(c);
      Py_DECREF(c->obj);
      delete c;
      raise(ec);
    }
    if (probe && waker != nullptr) {
      // After the submission: the node is this loop's to free (drain), pushed or not.
      c->probe = probe;
      c->reactor_alive = alive_;
      waker->on_probed(c);
    }
    // How cancelling the future cancels the wait; the canceller holds the handle (memory-safe
    // whenever it is used). An asyncio future (evr._Wait) keeps it in a slot and calls it from its
    // cancel(): no done callback, so a completion costs the loop one callback (the awaiting
    // task's step), not two. A concurrent future gets a done callback (run inside set_result).
    if (what == completion::kind::asyncio_future) {
      fut.attr("_canceller") = py::cast(std::move(canceller));
    } else {
      fut.attr("add_done_callback")(py::cast(std::move(canceller)));
    }
    return wake_at;
  }

  /// Returns the wait's wake-up time (see loop_waker), 0 when it has none.
  std::int64_t wait_async(const std::shared_ptr<completion_sink>& sink, loop_waker& waker,
                          py::handle fut, int kind, std::uintptr_t handle, int device) {
    return submit(sink, fut, completion::kind::asyncio_future, target(kind, handle, device), &waker,
                  handle);
  }

  void wait_future(py::handle fut, int kind, std::uintptr_t handle, int device) {
    start_resolver();
    (void)submit(resolver_ptr(), fut, completion::kind::concurrent_future,
                 target(kind, handle, device));
  }

  void release_after(py::handle obj, int kind, std::uintptr_t handle, int device) {
    start_resolver();
    evr::wait_target t = target(kind, handle, device);
    auto* c = new completion;
    c->what = completion::kind::release;
    c->obj = obj.inc_ref().ptr();
    // Only references are dropped: nobody waits for it.
    std::error_code ec = evr::on_complete(*r_, t.unhurried(), [c](std::error_code e) {
      c->ec = e;
      resolver_sink().push(c);
    });
    if (!ec) return;
    // Refused: never release early. Wait for the GPU here (GIL released), then drop the
    // reference and report the refusal.
    {
      py::gil_scoped_release nogil;
      evr::device::backend& b = r_->backend();
      void* native = reinterpret_cast<void*>(handle);
      if (kind == 0) {
        (void)b.synchronize_stream(native);
      } else if (native != nullptr) {
        (void)b.synchronize_event(native);
      }
    }
    Py_DECREF(c->obj);
    delete c;
    raise(ec);
  }

  void stop() {
    py::gil_scoped_release nogil;
    r_->stop();
  }

  py::dict metrics() const {
    evr::reactor_metrics m = r_->metrics();
    py::dict d;
    d["submitted"] = m.submitted;
    d["completed"] = m.completed;
    d["cancelled"] = m.cancelled;
    d["failed"] = m.failed;
    d["rejected"] = m.rejected;
    d["in_flight"] = m.in_flight;
    d["sweeps"] = m.sweeps;
    d["event_queries"] = m.event_queries;
    d["host_event_queries"] = m.host_event_queries;
    d["stream_queries"] = m.stream_queries;
    d["doorbells"] = m.doorbells;
    d["parks"] = m.parks;
    d["wakeups"] = m.wakeups;
    d["prediction_misses"] = m.prediction_misses;
    d["busy_seconds"] = std::chrono::duration<double>(m.busy_time).count();
    d["reactor_cpu_seconds"] = std::chrono::duration<double>(r_->cpu_time()).count();
    // log2 histograms (bucket i: [2^i, 2^(i+1)) ns)
    d["nap_overshoot_log2_ns"] = to_list(m.nap_overshoot.counts);
    d["detect_to_deliver_log2_ns"] = to_list(m.detect_to_deliver.counts);
    return d;
  }

  std::string strategy() const { return evr::to_string(r_->options().strategy); }
  std::string backend_name() const { return std::string(r_->backend().name()); }
  std::string describe() const { return r_->backend().describe(); }

 private:
  static std::shared_ptr<completion_sink> resolver_ptr() {
    // A non-owning shared_ptr to the immortal resolver sink.
    static std::shared_ptr<completion_sink> p(&resolver_sink(), [](completion_sink*) {});
    return p;
  }

  std::shared_ptr<evr::sim::device> sim_;  // destroyed after the reactor (declared first)
  std::unique_ptr<evr::reactor> r_;
  /// The reactor's fence words are readable (GIL): probed waits' nodes share it (completion).
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace
}  // namespace evr_py

PYBIND11_MODULE(_evr, m) {
  using namespace evr_py;
  m.doc() = "evr's engine (use the evr package, not this module)";
  // The C++ library's version (project(evr VERSION) of the top CMakeLists.txt, passed by
  // python/CMakeLists.txt): evr.__version__, and the wheel's version through setup.py.
  m.attr("__version__") = EVR_PYTHON_VERSION;

  m.def("_set_error_factory", [](py::object f) { set_error_factory(f.ptr()); });
  m.def("cuda_compiled_in", &evr::device::cuda_compiled_in,
        "True when this build has the CUDA backend.");
  m.def("cuda_device_available", &evr::device::cuda_device_available,
        "True when the CUDA backend is compiled in and a GPU is usable.",
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "cuda_status",
      [] {
        evr::device::cuda_status s;
        {
          py::gil_scoped_release unlocked;  // the first CUDA call loads the driver
          s = evr::device::probe_cuda();
        }
        py::dict d;
        d["compiled_in"] = s.compiled_in;
        d["usable"] = s.usable;
        d["runtime_version"] = s.runtime_version;
        d["driver_version"] = s.driver_version;
        d["device_count"] = s.device_count;
        d["reason"] = s.reason;
        return d;
      },
      "What evr::device::probe_cuda() found: whether the CUDA backend can run here, and why not.");
  m.def("stop_resolver", &stop_resolver,
        "Stops the resolver thread after it has served what is pending (interpreter exit).");
  m.def("resolver_running", &resolver_running);
  m.def("error_message", [](const std::string& category, int value) {
    if (category == "cuda") return evr::make_cuda_error(value).message();
    return evr::make_error_code(static_cast<evr::errc>(value)).message();
  });
  {
    py::dict errc;
    errc["reactor_stopped"] = static_cast<int>(evr::errc::reactor_stopped);
    errc["backend_mismatch"] = static_cast<int>(evr::errc::backend_mismatch);
    errc["device_mismatch"] = static_cast<int>(evr::errc::device_mismatch);
    errc["event_never_recorded"] = static_cast<int>(evr::errc::event_never_recorded);
    errc["empty_handle"] = static_cast<int>(evr::errc::empty_handle);
    errc["per_thread_default_stream"] = static_cast<int>(evr::errc::per_thread_default_stream);
    errc["stream_table_full"] = static_cast<int>(evr::errc::stream_table_full);
    errc["invalid_argument"] = static_cast<int>(evr::errc::invalid_argument);
    errc["no_device"] = static_cast<int>(evr::errc::no_device);
    errc["unsupported"] = static_cast<int>(evr::errc::unsupported);
    errc["operation_aborted"] = static_cast<int>(evr::errc::operation_aborted);
    m.attr("ERRC") = errc;
    m.attr("CUDA_CATEGORY") = evr::cuda_category().name();
    m.attr("EVR_CATEGORY") = evr::evr_category().name();
  }

  py::class_<wait_canceller>(m, "WaitCanceller")
      .def("__call__", &wait_canceller::operator())
      .def("cancel", &wait_canceller::cancel)
      .def_readonly("cancelled", &wait_canceller::cancelled);

  py::class_<loop_sink>(m, "LoopSink")
      .def(py::init<double>(), py::arg("max_spin"))
      .def_property_readonly("fd", &loop_sink::fd)
      .def_property_readonly("timer_fd", &loop_sink::timer_fd)
      .def("drain", &loop_sink::drain)
      .def("on_timer", &loop_sink::on_timer)
      .def("poll", &loop_sink::poll)
      .def(
          "predictable",
          [](const loop_sink& s, std::uintptr_t key) { return s.waker.predictable(key); },
          py::arg("key"))
      .def("window_closed", &loop_sink::window_closed, py::arg("window"), py::arg("hit"),
           py::arg("opened_ns"), py::arg("closed_ns"), py::arg("rearm"))
      .def("rearm_timer", &loop_sink::rearm_timer)
      .def("close", &loop_sink::close)
      .def("stats", &loop_sink::stats)
      .def_property(
          "max_spin", [](const loop_sink& s) { return s.waker.max_spin_ns() * 1e-9; },
          [](loop_sink& s, double v) {
            s.waker.set_max_spin_ns(seconds_to_ns(v, "evr: max_spin").count());
          })
      .def_property(
          "max_waits", [](const loop_sink& s) { return s.waker.max_waits(); },
          [](loop_sink& s, std::size_t n) { s.waker.set_max_waits(n); })
      .def_readonly("closed", &loop_sink::closed);

  py::class_<py_reactor>(m, "Reactor")
      .def(py::init<std::optional<std::string>, py::object, py::dict>(), py::arg("strategy"),
           py::arg("sim"), py::arg("options"))
      .def("wait_async", [](py_reactor& r, loop_sink& s, py::handle fut, int kind, std::uintptr_t h,
                            int dev) { return r.wait_async(s.sink, s.waker, fut, kind, h, dev); })
      .def("wait_future", &py_reactor::wait_future)
      .def("release_after", &py_reactor::release_after)
      .def("stop", &py_reactor::stop)
      .def("metrics", &py_reactor::metrics)
      .def_property_readonly("strategy", &py_reactor::strategy)
      .def_property_readonly("backend", &py_reactor::backend_name)
      .def("describe", &py_reactor::describe);

  // --- evr.sim -----------------------------------------------------------------------------
  py::class_<sim_device>(m, "SimDevice")
      .def(py::init([](int devices, const std::string& mode) {
             if (devices < 1) throw py::value_error("evr.sim.Device: devices must be >= 1");
             evr::sim::run_mode rm;
             if (mode == "threaded") {
               rm = evr::sim::run_mode::threaded;
             } else if (mode == "manual") {
               rm = evr::sim::run_mode::manual;
             } else {
               throw py::value_error("evr.sim.Device: mode must be 'threaded' or 'manual', got '" +
                                     mode + "'");
             }
             return std::make_unique<sim_device>(devices, rm);
           }),
           py::arg("devices"), py::arg("mode"))
      .def("launch_kernel",
           [](sim_device& d, sim_stream& s, double seconds) {
             std::error_code ec =
                 d.dev->launch_kernel(s.s.native(), seconds_to_ns(seconds, "launch_kernel"));
             if (ec) raise(ec);
           })
      .def("launch_faulting_kernel",
           [](sim_device& d, sim_stream& s, int code) {
             std::error_code ec = d.dev->launch_faulting_kernel(s.s.native(), cuda_code(code));
             if (ec) raise(ec);
           })
      .def("inject_fault", [](sim_device& d, int device,
                              int code) { d.dev->inject_fault(device, cuda_code(code)); })
      .def("inject_fault_after",
           [](sim_device& d, int device, std::uint64_t ops, int code) {
             d.dev->inject_fault_after(device, ops, cuda_code(code));
           })
      .def("fault",
           [](sim_device& d, int device) -> int {
             std::error_code ec = d.dev->fault(device);
             return ec ? ec.value() : 0;
           })
      .def("stall", [](sim_device& d, sim_stream& s) { d.dev->stall(s.s.native()); })
      .def("resume", [](sim_device& d, sim_stream& s) { d.dev->resume(s.s.native()); })
      .def("step",
           [](sim_device& d, sim_stream& s, std::size_t n) { return d.dev->step(s.s.native(), n); })
      .def(
          "run_until_blocked", [](sim_device& d) { return d.dev->run_until_blocked(); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "wait_idle", [](sim_device& d) { d.dev->wait_idle(); },
          py::call_guard<py::gil_scoped_release>())
      .def("describe", [](sim_device& d) { return d.dev->describe(); })
      .def("counters", [](sim_device& d) {
        evr::sim::call_counters c = d.dev->counters();
        py::dict out;
        out["event_queries"] = c.event_queries;
        out["stream_queries"] = c.stream_queries;
        out["event_records"] = c.event_records;
        out["host_funcs_launched"] = c.host_funcs_launched;
        out["host_funcs_run"] = c.host_funcs_run;
        out["fence_writes_enqueued"] = c.fence_writes_enqueued;
        out["fence_writes_landed"] = c.fence_writes_landed;
        out["events_created"] = c.events_created;
        out["events_destroyed"] = c.events_destroyed;
        return out;
      });

  py::class_<sim_stream>(m, "SimStream")
      .def(py::init([](sim_device& d, int device, int priority) {
             auto s = std::make_unique<sim_stream>();
             s->dev = d.dev;
             try {
               s->s = evr::stream(*d.dev, device, priority);
             } catch (const evr::error& e) {
               raise(e.code());
             }
             return s;
           }),
           py::arg("device"), py::arg("index"), py::arg("priority"))
      .def_property_readonly("handle", &sim_stream::handle)
      .def("query",
           [](sim_stream& s) {
             std::error_code ec;
             s.s.query(ec);
             return done_or_raise(ec);
           })
      .def("synchronize", [](sim_stream& s) {
        std::error_code ec;
        {
          py::gil_scoped_release nogil;
          s.s.synchronize(ec);
        }
        if (ec) raise(ec);
      });

  py::class_<sim_event>(m, "SimEvent")
      .def(py::init([](sim_device& d) {
             auto e = std::make_unique<sim_event>();
             e->dev = d.dev;
             e->e = evr::event(*d.dev);
             return e;
           }),
           py::arg("device"))
      .def_property_readonly(
          "handle", [](sim_event& e) { return reinterpret_cast<std::uintptr_t>(e.e.native()); })
      .def_property_readonly("recorded", [](sim_event& e) { return e.e.recorded(); })
      .def_property_readonly("device_index", [](sim_event& e) { return e.e.device().value_or(-1); })
      .def("record",
           [](sim_event& e, sim_stream& s) {
             std::error_code ec;
             e.e.record(s.s, ec);
             if (ec) raise(ec);
           })
      .def("query",
           [](sim_event& e) {
             std::error_code ec;
             e.e.query(ec);
             return done_or_raise(ec);
           })
      .def("synchronize", [](sim_event& e) {
        std::error_code ec;
        {
          py::gil_scoped_release nogil;
          ec = e.dev->synchronize_event(e.e.native());
        }
        if (ec) raise(ec);
      });

  m.def("_same_device", [](const sim_device& a, const sim_device& b) { return a.dev == b.dev; });
  m.def("_stream_device_is",
        [](const sim_stream& s, const sim_device& d) { return s.dev == d.dev; });
  m.def("_event_device_is", [](const sim_event& e, const sim_device& d) { return e.dev == d.dev; });
}
