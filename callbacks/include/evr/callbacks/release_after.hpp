// evr/callbacks/release_after.hpp — keep a resource alive until the GPU is past this point.
//
//   evr::release_after(reactor, stream, std::move(buffer));            // freed on the reactor
//   evr::release_after(reactor, stream, std::move(buffer), io.get_executor());  // freed there
//
// The resource is destroyed once the work queued on the stream so far is done — or failed, or the
// reactor shut down (then after the shutdown drain: the device may still use it if it had not
// finished; see docs/architecture.md). Never early: if the reactor refuses the wait (it is stopped,
// or the marker could not be enqueued) release_after synchronizes the stream or event on the
// calling thread and then destroys the resource, and returns the refusal.
//
// On the reactor thread the destructor must be cheap and must not synchronize with the device
// (cudaFree does!): for device memory pass an executor, so the destructor runs there.
//
// There is no user callback: the resource's destructor is the only code evr runs for it, on every
// outcome of the wait ({}, a device error, or errc::operation_aborted at shutdown), and evr does
// not tell which. Wait with gpu_waiter or on_complete as well when the outcome matters.
// The executor overload takes an Asio executor of the front end's flavour
// (detail/asio_forward.hpp), so this header needs Asio; without Asio, capture the resource in an
// on_complete callback instead.
// Thread safety: callable from any thread except inside a CUDA host function.
#pragma once

#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>

#include <evr/callbacks/detail/asio_forward.hpp>
#include <evr/callbacks/on_complete.hpp>

namespace evr {
namespace detail {

template <typename Resource>
struct resource_holder {
  Resource resource;
};

}  // namespace detail

/// Destroys `resource` on the reactor thread once the GPU is past `target`.
template <typename Resource>
std::error_code release_after(reactor& r, const wait_target& target, Resource&& resource) {
  using holder = detail::resource_holder<std::decay_t<Resource>>;
  auto keep = std::make_unique<holder>(holder{std::forward<Resource>(resource)});
  holder* raw = keep.get();
  std::error_code ec = on_complete(r, target, [raw](std::error_code) { delete raw; });
  if (ec) {
    detail::reactor_access::synchronize(target);
    return ec;  // `keep` destroys the resource now that the device is done
  }
  keep.release();
  return {};
}

/// Destroys `resource` on `ex` once the GPU is past `target`.
template <typename Resource, typename Executor>
std::error_code release_after(reactor& r, const wait_target& target, Resource&& resource,
                              const Executor& ex) {
  using holder = detail::resource_holder<std::decay_t<Resource>>;
  auto keep = std::make_unique<holder>(holder{std::forward<Resource>(resource)});
  holder* raw = keep.get();
  // Outstanding work on `ex` until the resource is freed there: run() does not return while a
  // release is still to come.
  auto work = asio::prefer(ex, asio::execution::outstanding_work.tracked);
  std::error_code ec = on_complete(r, target, [raw, work](std::error_code) {
    try {
      asio::post(work, [raw] { delete raw; });
    } catch (...) {
      delete raw;  // posting failed (out of memory): free it here rather than leak it
    }
  });
  if (ec) {
    detail::reactor_access::synchronize(target);
    return ec;
  }
  keep.release();
  return {};
}

}  // namespace evr
