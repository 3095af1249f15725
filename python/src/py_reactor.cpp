// python/src/py_reactor.cpp — see py_reactor.hpp.
#include "py_reactor.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string_view>
#include <utility>

#include <evr/callbacks/on_complete.hpp>
#include <evr/device/backend.hpp>
#include <evr/device/error.hpp>
#include <evr/reactor/options.hpp>

#include "conversions.hpp"
#include "errors.hpp"
#include "sim_binding.hpp"

namespace py = pybind11;

namespace evr_py {
namespace {

// evr.Reactor(**options): the fields a Python caller may set, by kind.
using duration_field = std::chrono::nanoseconds evr::reactor_options::*;
using count_field = std::size_t evr::reactor_options::*;
using fraction_field = double evr::reactor_options::*;

constexpr std::pair<std::string_view, duration_field> duration_options[] = {
    {"spin_window", &evr::reactor_options::spin_window},
    {"yield_window", &evr::reactor_options::yield_window},
    {"max_sleep", &evr::reactor_options::max_sleep},
    {"poll_period", &evr::reactor_options::poll_period},
    {"prespin", &evr::reactor_options::prespin},
    {"final_sleep", &evr::reactor_options::final_sleep},
    {"coalesce", &evr::reactor_options::coalesce},
    {"doorbell_after", &evr::reactor_options::doorbell_after},
    {"fault_probe_interval", &evr::reactor_options::fault_probe_interval},
    {"shutdown_drain", &evr::reactor_options::shutdown_drain},
};
constexpr std::pair<std::string_view, count_field> count_options[] = {
    {"poll_looks_per_second", &evr::reactor_options::poll_looks_per_second},
    {"loose_query_budget", &evr::reactor_options::loose_query_budget},
    {"max_streams", &evr::reactor_options::max_streams},
    {"max_pending_fences", &evr::reactor_options::max_pending_fences},
    {"max_fence_streams", &evr::reactor_options::max_fence_streams},
    {"pool_batch", &evr::reactor_options::pool_batch},
};
using flag_field = bool evr::reactor_options::*;
constexpr std::pair<std::string_view, flag_field> flag_options[] = {
    {"host_event_waits", &evr::reactor_options::host_event_waits},
    {"kernel_fences", &evr::reactor_options::kernel_fences},
};
constexpr std::pair<std::string_view, fraction_field> fraction_options[] = {
    {"spin_fraction", &evr::reactor_options::spin_fraction},
    {"poll_budget", &evr::reactor_options::poll_budget},
};

template <class Field, std::size_t N>
Field field_named(const std::pair<std::string_view, Field> (&table)[N], std::string_view key) {
  for (const auto& [name, field] : table)
    if (name == key) return field;
  return nullptr;
}

/// One evr.Reactor option into `o`; ValueError or TypeError naming the option.
void set_option(evr::reactor_options& o, const std::string& key, py::handle v) {
  if (key == "idle") {
    const std::string m = py::str(v);
    const auto mode = evr::idle_mode_from_string(m);
    if (!mode) {
      throw py::value_error("evr.Reactor: unknown idle mode '" + m +
                            "' (expected 'predictive', 'ladder' or 'spin')");
    }
    o.idle = *mode;
  } else if (const duration_field d = field_named(duration_options, key)) {
    o.*d = seconds_to_ns(v.cast<double>(), ("evr.Reactor: " + key).c_str());
  } else if (const count_field c = field_named(count_options, key)) {
    const long long n = v.cast<long long>();
    if (n < 0) throw py::value_error("evr.Reactor: " + key + " must be >= 0");
    o.*c = static_cast<std::size_t>(n);
  } else if (const flag_field b = field_named(flag_options, key)) {
    if (!py::isinstance<py::bool_>(v))
      throw py::type_error("evr.Reactor: " + key + " must be True or False");
    o.*b = v.cast<bool>();
  } else if (const fraction_field f = field_named(fraction_options, key)) {
    o.*f = v.cast<double>();
  } else {
    throw py::type_error("evr.Reactor: unknown option '" + key + "'");
  }
}

evr::reactor_options options_from(const std::optional<std::string>& strategy,
                                  const py::dict& options) {
  evr::reactor_options o;
  if (strategy) {
    const auto s = evr::strategy_from_string(*strategy);
    if (!s) {
      throw py::value_error("evr.Reactor: unknown strategy '" + *strategy +
                            "' (expected 'adaptive', 'fence', 'poll' or 'host_func')");
    }
    o.strategy = *s;
  }
  for (auto item : options) set_option(o, py::str(item.first), item.second);
  return o;
}

std::shared_ptr<completion_sink> resolver_ptr() {
  // A non-owning shared_ptr to the immortal resolver sink.
  static std::shared_ptr<completion_sink> p(&resolver_sink(), [](completion_sink*) {});
  return p;
}

}  // namespace

// --- wait_canceller ----------------------------------------------------------------------------
bool wait_canceller::cancel() {
  cancelled = handle.cancel();
  handle.reset();  // the future is done: nothing left to cancel
  return cancelled;
}

void wait_canceller::operator()(py::handle fut) {
  PyObject* r = PyObject_CallMethod(fut.ptr(), "cancelled", nullptr);
  if (r == nullptr) throw py::error_already_set();
  const bool was = PyObject_IsTrue(r) == 1;
  Py_DECREF(r);
  if (was) cancelled = handle.cancel();
  handle.reset();
}

// --- py_reactor --------------------------------------------------------------------------------
py_reactor::py_reactor(std::optional<std::string> strategy, py::object sim, py::dict options) {
  const evr::reactor_options o = options_from(strategy, options);
  evr::device::backend* backend = nullptr;
  if (!sim.is_none()) {
    sim_ = sim.cast<sim_device&>().dev;
    backend = sim_.get();
  } else {
    if (!evr::device::cuda_compiled_in()) raise(evr::make_error_code(evr::errc::unsupported));
    backend = &evr::device::cuda_backend();
  }
  std::string refused;
  {
    // The constructor may load the fence kernel, which waits for the device's running kernels:
    // other Python threads run meanwhile (it calls no Python).
    py::gil_scoped_release nogil;
    try {
      r_ = std::make_unique<evr::reactor>(*backend, o);
    } catch (const std::invalid_argument& e) {
      refused = e.what();
    }
  }
  if (!refused.empty()) throw py::value_error("evr.Reactor: " + refused);
}

py_reactor::~py_reactor() {
  // Stops and joins; the reactor's callbacks take no GIL, so releasing it is only for the
  // other Python threads' sake.
  // Under the GIL, before the fence words can go: no loop reads a probe from now on.
  *alive_ = false;
  py::gil_scoped_release nogil;
  r_.reset();
}

evr::wait_target py_reactor::target(int kind, std::uintptr_t handle, int device) const {
  void* native = reinterpret_cast<void*>(handle);
  return kind == 0 ? evr::wait_target::of_stream(r_->backend(), native)
                   : evr::wait_target::of_event(r_->backend(), native, device);
}

evr::wait_target py_reactor::target(const py_signal_ticket& t) const {
  const auto& slot = t.slot.cast<const py_signal_slot&>();
  // evr.wait names the slot's reactor (python/evr/_signals.py); this guards the engine.
  if (&slot.engine.cast<const py_reactor&>() != this)
    raise(evr::make_error_code(evr::errc::backend_mismatch));
  return evr::wait_target::of_signal(r_->backend(), reinterpret_cast<void*>(t.stream), t.ticket);
}

void py_reactor::prepare_device(int device) {
  if (device < 0) {
    if (std::error_code ec = r_->backend().current_device(device)) raise(ec);
  }
  std::error_code ec;
  {
    py::gil_scoped_release nogil;  // a load waits for the device's running kernels
    ec = r_->prepare_device(device);
  }
  if (ec) raise(ec);
}

py_signal_slot py_reactor::signal_slot(py::object self, py::object owner, int device) {
  if (device < 0) {
    if (std::error_code ec = r_->backend().current_device(device)) raise(ec);
  }
  std::error_code ec;
  evr::signal_slot slot;
  {
    // A device's first batch of slots loads the signal kernel, which waits for the device's
    // running kernels: another Python thread may be the one that lets them end.
    py::gil_scoped_release nogil;
    evr::signal_pool* pool = r_->pools().signals(device, ec);
    if (pool != nullptr) slot = pool->acquire(ec);
  }
  if (ec) raise(ec);  // no pool or no slot: each says why
  return py_signal_slot{std::move(self), std::move(owner), std::move(slot)};
}

std::int64_t py_reactor::submit(const std::shared_ptr<completion_sink>& sink, py::handle fut,
                                completion::kind what, const evr::wait_target& t, loop_waker* waker,
                                std::uintptr_t key) {
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

std::int64_t py_reactor::wait_async(const std::shared_ptr<completion_sink>& sink, loop_waker& waker,
                                    py::handle fut, const evr::wait_target& t, std::uintptr_t key) {
  return submit(sink, fut, completion::kind::asyncio_future, t, &waker, key);
}

void py_reactor::wait_future(py::handle fut, const evr::wait_target& t) {
  start_resolver();
  (void)submit(resolver_ptr(), fut, completion::kind::concurrent_future, t);
}

void py_reactor::release_after(py::handle obj, const evr::wait_target& t, int kind,
                               std::uintptr_t handle) {
  start_resolver();
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

void py_reactor::stop() {
  py::gil_scoped_release nogil;
  r_->stop();
}

py::dict py_reactor::metrics() const {
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
  d["scout_looks"] = m.scout_looks;
  d["scout_finds"] = m.scout_finds;
  d["busy_seconds"] = std::chrono::duration<double>(m.busy_time).count();
  d["reactor_cpu_seconds"] = std::chrono::duration<double>(r_->cpu_time()).count();
  // log2 histograms (bucket i: [2^i, 2^(i+1)) ns)
  d["nap_overshoot_log2_ns"] = to_list(m.nap_overshoot.counts);
  d["detect_to_deliver_log2_ns"] = to_list(m.detect_to_deliver.counts);
  return d;
}

}  // namespace evr_py
