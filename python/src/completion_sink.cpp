// python/src/completion_sink.cpp — see completion_sink.hpp.
#include "completion_sink.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include <evr/device/error.hpp>

namespace evr_py {
namespace {

// The value of head_ once a sink is closed. Never dereferenced.
completion closed_marker;
completion* const closed = &closed_marker;

PyObject* error_factory = nullptr;  // leaked on purpose: used until the process ends

// Interned method names (created on first use, under the GIL; leaked).
PyObject* name(const char* s) noexcept { return PyUnicode_InternFromString(s); }
PyObject* s_cancelled = nullptr;
PyObject* s_set_result = nullptr;
PyObject* s_set_exception = nullptr;
PyObject* s_set_running = nullptr;
PyObject* s_wake_sleeper = nullptr;

void intern_names() noexcept {
  if (s_cancelled != nullptr) return;
  s_cancelled = name("cancelled");
  s_set_result = name("set_result");
  s_set_exception = name("set_exception");
  s_set_running = name("set_running_or_notify_cancel");
  s_wake_sleeper = name("_wake_sleeper");
}

// Calls obj.<method>(arg) (or without argument when arg is nullptr); returns true when it ran
// without raising. Any Python error is cleared.
bool call(PyObject* obj, PyObject* method, PyObject* arg) noexcept {
  PyObject* r = arg != nullptr ? PyObject_CallMethodObjArgs(obj, method, arg, nullptr)
                               : PyObject_CallMethodObjArgs(obj, method, nullptr);
  if (r == nullptr) {
    PyErr_Clear();
    return false;
  }
  Py_DECREF(r);
  return true;
}

// obj.<method>() is truthy; false on error (cleared).
bool call_truthy(PyObject* obj, PyObject* method) noexcept {
  PyObject* r = PyObject_CallMethodObjArgs(obj, method, nullptr);
  if (r == nullptr) {
    PyErr_Clear();
    return false;
  }
  int t = PyObject_IsTrue(r);
  Py_DECREF(r);
  if (t < 0) PyErr_Clear();
  return t == 1;
}

void settle(PyObject* fut, const std::error_code& ec) noexcept {
  if (!ec) {
    call(fut, s_set_result, Py_None);
    return;
  }
  PyObject* exc = make_exception(ec);
  if (exc == nullptr) {
    PyErr_Clear();
    return;
  }
  call(fut, s_set_exception, exc);
  Py_DECREF(exc);
}

// --- the resolver thread ---------------------------------------------------------------------
std::thread resolver_thread;
std::atomic<bool> resolver_stop{false};
bool resolver_started = false;  // GIL

void resolver_main() noexcept {
  completion_sink& sink = resolver_sink();
  for (;;) {
    // take() before sleeping: a take that consumed the stop request's eventfd write together
    // with a batch comes back here, finds nothing, and sees the flag.
    if (completion* list = sink.take()) {
      PyGILState_STATE g = PyGILState_Ensure();  // once per batch
      resolve_all(list);
      PyGILState_Release(g);
      continue;
    }
    // acquire: pairs with the release store in stop_resolver, which writes the eventfd after it;
    // a stop requested after this load makes the poll below return at once.
    if (resolver_stop.load(std::memory_order_acquire)) {
      if (completion* late = sink.take()) {  // pushed between the take and the flag
        PyGILState_STATE g = PyGILState_Ensure();
        resolve_all(late);
        PyGILState_Release(g);
      }
      return;
    }
    sink.wait_readable(-1);
  }
}

}  // namespace

completion_sink::completion_sink() {
  fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

completion_sink::~completion_sink() {
  if (fd_ >= 0) ::close(fd_);
}

void completion_sink::push(completion* c) noexcept {
  // relaxed load: the CAS below re-reads it; release on success publishes c's fields (ec, next)
  // to the consumer's acquire exchange.
  completion* prev = head_.load(std::memory_order_relaxed);
  do {
    if (prev == closed) {
      if (this != &resolver_sink()) resolver_sink().push(c);
      // else: the resolver sink is never closed; nothing to do
      return;
    }
    c->next = prev;
  } while (
      !head_.compare_exchange_weak(prev, c, std::memory_order_release, std::memory_order_relaxed));
  if (prev == nullptr) notify();  // only the push that makes the stack non-empty pays
}

void completion_sink::notify() const noexcept {
  std::uint64_t one = 1;
  ssize_t n;
  do {
    n = ::write(fd_, &one, sizeof one);
  } while (n < 0 && errno == EINTR);
  // EAGAIN (counter saturated) cannot happen with one write per empty->non-empty transition.
}

completion* completion_sink::reverse(completion* list) noexcept {
  completion* out = nullptr;
  while (list != nullptr) {
    completion* next = list->next;
    list->next = out;
    out = list;
    list = next;
  }
  return out;
}

completion* completion_sink::take() noexcept {
  std::uint64_t count;
  while (::read(fd_, &count, sizeof count) < 0 && errno == EINTR) {
  }
  return take_nodes();
}

completion* completion_sink::take_nodes() noexcept {
  // acquire: pairs with push()'s release CAS. A closed sink stays closed.
  completion* list = head_.load(std::memory_order_relaxed);
  if (list == closed || list == nullptr) return nullptr;
  list = head_.exchange(nullptr, std::memory_order_acquire);
  if (list == closed) {  // closed meanwhile (only the consumer closes: cannot happen)
    head_.store(closed, std::memory_order_relaxed);
    return nullptr;
  }
  return reverse(list);
}

completion* completion_sink::close() noexcept {
  completion* list = head_.exchange(closed, std::memory_order_acquire);
  if (list == closed) return nullptr;
  return reverse(list);
}

bool completion_sink::has_pending() const noexcept {
  completion* h = head_.load(std::memory_order_acquire);
  return h != nullptr && h != closed;
}

void completion_sink::wait_readable(int timeout_ms) const noexcept {
  pollfd p{fd_, POLLIN, 0};
  while (::poll(&p, 1, timeout_ms) < 0 && errno == EINTR) {
  }
}

completion_sink& resolver_sink() noexcept {
  static completion_sink* sink = new completion_sink();  // never destroyed (file comment)
  return *sink;
}

void start_resolver() {
  if (resolver_started) return;
  (void)resolver_sink();
  resolver_stop.store(false, std::memory_order_relaxed);
  resolver_thread = std::thread(resolver_main);
  resolver_started = true;
}

void stop_resolver() {
  if (!resolver_started) return;
  resolver_started = false;
  // release: see resolver_main.
  resolver_stop.store(true, std::memory_order_release);
  resolver_sink().notify();
  Py_BEGIN_ALLOW_THREADS  // the resolver needs the GIL for its last batch
      resolver_thread.join();
  Py_END_ALLOW_THREADS
}

bool resolver_running() noexcept { return resolver_started; }

namespace {

void settle_asyncio(const completion* c, const std::error_code& ec) noexcept {
  if (!call_truthy(c->obj, s_cancelled)) settle(c->obj, ec);
  // A wait that got a wake-up time: its coroutine may sleep on the window future
  // (python/evr/__init__.py, _GpuWait), which the completion ends.
  if (c->wake_at != 0) call(c->obj, s_wake_sleeper, nullptr);
}

}  // namespace

bool settle_from_probe(completion* c) noexcept {
  intern_names();
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  settle_asyncio(c, std::error_code{});  // the fence word is written only after the work
  PyErr_Restore(type, value, tb);
  Py_DECREF(c->obj);
  c->obj = nullptr;  // settled_by_loop(c) from now on
  return c->settled.exchange(completion::the_loop, std::memory_order_acq_rel) ==
         completion::the_reactor;
}

void resolve_all(completion* list) noexcept {
  intern_names();
  // Keep the error indicator of whoever called us (a reader callback has none, but be safe).
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  while (list != nullptr) {
    completion* c = list;
    list = list->next;
    if (settled_by_loop(c)) {  // its future was resolved from its probe
      delete c;
      continue;
    }
    switch (c->what) {
      case completion::kind::asyncio_future: settle_asyncio(c, c->ec); break;
      case completion::kind::concurrent_future:
        if (call_truthy(c->obj, s_set_running)) settle(c->obj, c->ec);
        break;
      case completion::kind::release:
        // A signal that never came (a ticket's release_after started before the launch that
        // signals was queued): the work may still be queued and use the object. Keep it for the
        // process rather than free it under the GPU.
        if (c->ec == evr::errc::not_signalled) {
          delete c;
          continue;
        }
        break;
    }
    Py_DECREF(c->obj);
    delete c;
  }
  PyErr_Restore(type, value, tb);
}

void discard_all(completion* list) noexcept {
  while (list != nullptr) {
    completion* c = list;
    list = list->next;
    Py_XDECREF(c->obj);  // null: settled from its probe
    delete c;
  }
}

void set_error_factory(PyObject* factory) noexcept {
  Py_XINCREF(factory);
  Py_XDECREF(error_factory);
  error_factory = factory;
}

PyObject* make_exception(const std::error_code& ec) noexcept {
  std::string message;
  try {
    message = ec.message();
  } catch (...) {
  }
  if (error_factory == nullptr) {
    return PyObject_CallFunction(PyExc_RuntimeError, "s", message.c_str());
  }
  return PyObject_CallFunction(error_factory, "sis", ec.category().name(), ec.value(),
                               message.c_str());
}

void set_python_error(const std::error_code& ec) noexcept {
  PyObject* exc = make_exception(ec);
  if (exc == nullptr) return;  // the factory raised: that error stays set
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
  Py_DECREF(exc);
}

}  // namespace evr_py
