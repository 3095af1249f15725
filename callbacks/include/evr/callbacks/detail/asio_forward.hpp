// evr/callbacks/detail/asio_forward.hpp — the one place that picks the Asio flavour of evr's front
// end (gpu_waiter, reactor_service, release_after's executor overload).
//
// evr's compiled library uses no Asio; only these headers do. The flavour is chosen by a macro
// that the CMake target sets (pkg-config: the .pc file's Cflags):
//   EVR_ASIO_STANDALONE  standalone Asio, namespace ::asio           (evr::evr, evr.pc)
//   EVR_ASIO_BOOST       Boost.Asio, namespace ::boost::asio         (evr::evr_boost, evr-boost.pc)
// Neither: standalone (what evr's headers used before there was a choice). Both: an error.
//
// Inside namespace evr, `asio` names the flavour's namespace, and `evr::asio_error_code` is the
// error type of its completion signatures: std::error_code (standalone; the same as
// asio::error_code) or boost::system::error_code (Boost), so that use_awaitable throws,
// use_future stores an exception, and redirect_error / as_tuple hand out the type the flavour's
// own operations use. A boost::system::error_code made from one of evr's std::error_codes keeps
// its category and compares equal to evr::errc values and to std::errc conditions.
//
// Declarations that depend on the flavour live in an inline namespace named after it (asio_s or
// asio_b, as asio-grpc does: evr::asio_s::gpu_waiter, evr::detail::asio_s::asio_wait_op), so that
// a program whose parts use different flavours does not break the one-definition rule. Asio 1.22
// (Boost 1.78) is the oldest supported: it brought per-operation cancellation and the
// completion-token machinery evr builds on.
#pragma once

#include <system_error>

#include <evr/device/error.hpp>

#if defined(EVR_ASIO_STANDALONE) && defined(EVR_ASIO_BOOST)
#error \
    "evr: both EVR_ASIO_STANDALONE and EVR_ASIO_BOOST are defined; pick one Asio flavour (link evr::evr or evr::evr_boost, not both, into one target)"
#endif

#if defined(EVR_ASIO_BOOST)

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/execution.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/recycling_allocator.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/version.hpp>
#include <boost/system/error_code.hpp>

/// The flavour's version, in Asio's numbering (102200 is Asio 1.22.0, i.e. Boost 1.78).
#define EVR_ASIO_VERSION BOOST_ASIO_VERSION
#define EVR_ASIO_FLAVOUR_NAMESPACE asio_b

#else  // standalone Asio

#include <asio/any_io_executor.hpp>
#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/error.hpp>
#include <asio/execution.hpp>
#include <asio/execution_context.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/query.hpp>
#include <asio/recycling_allocator.hpp>
#include <asio/strand.hpp>
#include <asio/version.hpp>

#define EVR_ASIO_VERSION ASIO_VERSION
#define EVR_ASIO_FLAVOUR_NAMESPACE asio_s

#endif

#if EVR_ASIO_VERSION < 102200
#error \
    "evr needs Asio 1.22 or newer (Boost 1.78 or newer for Boost.Asio): older ones lack per-operation cancellation. Debian 12: libasio-dev (1.22.1) or libboost1.81-dev; Boost 1.74's Asio is 1.18."
#endif

namespace evr {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {

#if defined(EVR_ASIO_BOOST)
namespace asio = ::boost::asio;
/// The error type of the front end's completion signature void(asio_error_code).
using asio_error_code = ::boost::system::error_code;
#else
namespace asio = ::asio;
/// The error type of the front end's completion signature void(asio_error_code).
using asio_error_code = std::error_code;
#endif

}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE

// Not evr::<flavour>::detail: a second `detail` visible in evr would make `detail::` ambiguous.
namespace detail {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {

/// The error a front-end handler receives for a core outcome: the flavour's
/// asio::error::operation_aborted for errc::operation_aborted, `ec` itself otherwise (wrapped in a
/// boost::system::error_code for Boost, keeping its category). Never allocates.
inline asio_error_code to_asio_error(const std::error_code& ec) noexcept {
  if (ec.category() == evr_category() && ec.value() == static_cast<int>(errc::operation_aborted))
    return asio_error_code(asio::error::operation_aborted);
  return asio_error_code(ec);
}

}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE
}  // namespace detail
}  // namespace evr
