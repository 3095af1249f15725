// evr::event — a move-only RAII event on any backend, created lazily on its first record.
//
// What an event knows about itself:
//   * evr's own events (constructed, or opened from an IPC handle) know their flags and whether
//     they were recorded, so misuse (elapsed_time without timing or before a record, ipc_handle
//     without interprocess) is reported as an evr error before the device is asked.
//   * wrapped events (wrap(): a user's native event, not owned) have an unknown history and
//     unknown flags: those checks are skipped and the device decides (CUDA reports its own error).
//   * an opened event (open()) is owned, behaves as non-timing (as CUDA documents) and counts as
//     recorded: it watches the exporter's last record.
//
// Cost per record: one stream_device call (cudaStreamGetDevice, host-side only) to find the
// stream's device, on top of the record itself: it is what lets record() refuse a stream of
// another device with a clear error instead of CUDA's generic "invalid resource handle".
#include <evr/device/event.hpp>
#include <evr/device/stream.hpp>

#include <utility>

#include "handle_text.hpp"

namespace evr {
namespace {

using detail::call_text;
using detail::device_text;
using detail::handle_text;

[[noreturn]] void fail(std::error_code ec, const std::string& context) { throw error(ec, context); }

std::string event_text(const event& e) {
  std::string text = handle_text("event", e.native());
  if (auto d = e.device()) text += " of device " + std::to_string(*d);
  return text;
}

/// "stream 0x.. of device N" (the device asked of the backend; omitted if that fails).
std::string stream_text(const stream& s) {
  std::string text = handle_text("stream", s.native());
  int device = -1;
  if (s.backend() != nullptr && !s.backend()->stream_device(s.native(), device)) {
    text += " of device " + std::to_string(device);
  }
  return text;
}

}  // namespace

event::event(device::backend& backend, device::event_flags flags)
    : backend_(&backend), flags_(flags) {
  if (has_flag(flags, device::event_flags::interprocess) &&
      has_flag(flags, device::event_flags::timing)) {
    backend_ = nullptr;
    fail(make_error_code(errc::interprocess_requires_no_timing),
         "evr::event(flags interprocess|timing)");
  }
}

event event::open(device::backend& backend, const device::ipc_event_handle& handle, int device) {
  const auto context = [&] {
    return call_text("evr::event::open", {"ipc handle", device_text(device)});
  };
  if (device < 0) fail(make_error_code(errc::invalid_argument), context());
  // The imported event belongs to the current device's context: make `device` current for the
  // import and give the caller's device back afterwards.
  int previous = -1;
  if (backend.current_device(previous)) previous = -1;
  if (auto ec = backend.set_current_device(device)) fail(ec, context());
  device::native_event native = nullptr;
  const std::error_code ec = backend.import_event(handle, native);
  if (previous >= 0 && previous != device) (void)backend.set_current_device(previous);
  if (ec == make_cuda_error(201) && !backend.is_simulated()) {
    // cudaErrorDeviceUninitialized: what cudaIpcOpenEventHandle returns for a handle exported by
    // the calling process itself (seen on the H100, driver 580, CUDA 13.0).
    fail(ec, context() +
                 " (CUDA reports this when the handle was exported by this same process: "
                 "IPC events can only be opened in another process)");
  }
  if (ec) fail(ec, context());

  event e;
  e.backend_ = &backend;
  e.native_ = native;
  e.flags_ = device::event_flags::interprocess;  // an imported event behaves as non-timing
  e.device_ = device;
  e.recorded_ = true;  // it watches the exporter's last record
  e.owned_ = true;
  return e;
}

event event::wrap(device::backend& backend, device::native_event native, int device) noexcept {
  event e;
  e.backend_ = &backend;
  e.native_ = native;
  e.device_ = device;
  e.owned_ = false;
  return e;
}

event::event(event&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      native_(std::exchange(other.native_, nullptr)),
      flags_(std::exchange(other.flags_, device::event_flags::none)),
      device_(std::exchange(other.device_, -1)),
      recorded_(std::exchange(other.recorded_, false)),
      owned_(std::exchange(other.owned_, true)) {}

event& event::operator=(event&& other) noexcept {
  if (this != &other) {
    reset();
    backend_ = std::exchange(other.backend_, nullptr);
    native_ = std::exchange(other.native_, nullptr);
    flags_ = std::exchange(other.flags_, device::event_flags::none);
    device_ = std::exchange(other.device_, -1);
    recorded_ = std::exchange(other.recorded_, false);
    owned_ = std::exchange(other.owned_, true);
  }
  return *this;
}

event::~event() { reset(); }

void event::reset() noexcept {
  if (backend_ != nullptr && native_ != nullptr && owned_) backend_->destroy_event(native_);
  backend_ = nullptr;
  native_ = nullptr;
  flags_ = device::event_flags::none;
  device_ = -1;
  recorded_ = false;
  owned_ = true;
}

device::native_event event::release() noexcept {
  device::native_event native = std::exchange(native_, nullptr);
  owned_ = false;  // nothing left to destroy
  reset();
  return native;
}

std::optional<int> event::device() const noexcept {
  if (device_ < 0) return std::nullopt;
  return device_;
}

void event::record(const stream& s, std::error_code& ec) noexcept {
  ec.clear();
  if (backend_ == nullptr || !s) {
    ec = make_error_code(errc::empty_handle);
    return;
  }
  if (s.backend() != backend_) {
    ec = make_error_code(errc::backend_mismatch);
    return;
  }
  int stream_device = -1;
  if ((ec = backend_->stream_device(s.native(), stream_device))) return;
  if (native_ == nullptr) {
    device::native_event created = nullptr;
    if ((ec = backend_->create_event(stream_device, flags_, created))) return;
    native_ = created;
    device_ = stream_device;
  } else if (device_ >= 0 && stream_device != device_) {
    ec = make_error_code(errc::device_mismatch);
    return;
  }
  if ((ec = backend_->record_event(native_, s.native()))) return;
  recorded_ = true;
}

void event::record(const stream& s) {
  std::error_code ec;
  record(s, ec);
  if (ec) fail(ec, call_text("evr::event::record", {event_text(*this), stream_text(s)}));
}

bool event::record_once(const stream& s) {
  if (recorded_) return false;  // (an empty event is never recorded: record() reports it)
  std::error_code ec;
  record(s, ec);
  if (ec) fail(ec, call_text("evr::event::record_once", {event_text(*this), stream_text(s)}));
  return true;
}

void event::block(const stream& s) const {
  const auto context = [&] {
    return call_text("evr::event::block", {event_text(*this), stream_text(s)});
  };
  if (backend_ == nullptr || !s) fail(make_error_code(errc::empty_handle), context());
  if (s.backend() != backend_) fail(make_error_code(errc::backend_mismatch), context());
  if (native_ == nullptr) return;  // never recorded: nothing to wait for
  // Waiting on an event of another device is allowed (CUDA supports cross-device waits).
  if (auto ec = backend_->stream_wait_event(s.native(), native_)) fail(ec, context());
}

std::error_code event::query(std::error_code& ec) const noexcept {
  if (backend_ == nullptr) {
    ec = make_error_code(errc::empty_handle);
  } else if (native_ == nullptr) {
    ec.clear();  // never recorded: complete, as in CUDA
  } else {
    ec = backend_->query_event(native_);
  }
  return ec;
}

bool event::query() const {
  std::error_code ec;
  query(ec);
  if (!ec) return true;
  if (is_not_ready(ec)) return false;
  fail(ec, call_text("evr::event::query", {event_text(*this)}));
}

void event::synchronize() const {
  if (backend_ == nullptr)
    fail(make_error_code(errc::empty_handle), "evr::event::synchronize(empty event)");
  if (native_ == nullptr) return;
  if (auto ec = backend_->synchronize_event(native_)) {
    fail(ec, call_text("evr::event::synchronize", {event_text(*this)}));
  }
}

float event::elapsed_time(const event& end) const {
  const auto context = [&] {
    return call_text("evr::event::elapsed_time",
                     {"start " + event_text(*this), "end " + event_text(end)});
  };
  if (backend_ == nullptr || end.backend_ == nullptr)
    fail(make_error_code(errc::empty_handle), context());
  if (end.backend_ != backend_) fail(make_error_code(errc::backend_mismatch), context());
  // Checks evr can make itself; a wrapped event's flags and history are unknown (owned_ false).
  for (const event* e : {this, &end}) {
    if (e->owned_ && !has_flag(e->flags_, device::event_flags::timing)) {
      fail(make_error_code(errc::timing_disabled), context());
    }
  }
  for (const event* e : {this, &end}) {
    if (e->native_ == nullptr || (e->owned_ && !e->recorded_)) {
      fail(make_error_code(errc::event_never_recorded), context());
    }
  }
  float ms = 0.0f;
  if (auto ec = backend_->elapsed_ms(native_, end.native_, ms)) fail(ec, context());
  return ms;
}

device::ipc_event_handle event::ipc_handle() const {
  const auto context = [&] { return call_text("evr::event::ipc_handle", {event_text(*this)}); };
  if (backend_ == nullptr) fail(make_error_code(errc::empty_handle), context());
  if (owned_ && !has_flag(flags_, device::event_flags::interprocess)) {
    fail(make_error_code(errc::invalid_argument),
         context() + ": the event was created without event_flags::interprocess");
  }
  // The native event exists only after the first record (lazy creation).
  if (native_ == nullptr || (owned_ && !recorded_)) {
    fail(make_error_code(errc::event_never_recorded),
         context() + ": record the event before exporting it (it is created on its first record)");
  }
  device::ipc_event_handle handle;
  if (auto ec = backend_->export_event(native_, handle)) fail(ec, context());
  return handle;
}

}  // namespace evr
