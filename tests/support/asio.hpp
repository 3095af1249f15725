// The Asio flavour of the front end this test binary is built with (EVR_ASIO: standalone links
// evr::evr, boost links evr::evr_boost), under the name `asio` in both cases, so that one test
// source serves both flavours. Handlers of gpu_waiter take evr::asio_error_code (std::error_code,
// or boost::system::error_code); on_complete callbacks take std::error_code.
#pragma once

#include <evr/callbacks/asio_compat.hpp>
#include <evr/callbacks/gpu_waiter.hpp>

#if defined(EVR_ASIO_BOOST)
#include <boost/asio.hpp>
#include <boost/system/system_error.hpp>
namespace asio = boost::asio;
#else
#include <asio.hpp>
#endif

namespace evr::test {

/// What use_future and use_awaitable throw for an error of the flavour.
#if defined(EVR_ASIO_BOOST)
using asio_system_error = boost::system::system_error;
#else
using asio_system_error = std::system_error;
#endif

/// True when `ec` says "aborted", from either side: the flavour's asio::error::operation_aborted
/// (gpu_waiter) or evr::errc::operation_aborted (on_complete, the reactor). Not simply
/// `ec == std::errc::operation_canceled`: standalone Asio before 1.38 does not map its
/// operation_aborted to that condition.
inline bool aborted(const std::error_code& ec) {
  return ec == evr::errc::operation_aborted ||
         ec == evr::asio_error_code(asio::error::operation_aborted);
}

/// True when this flavour's operation_aborted compares equal to std::errc::operation_canceled:
/// Boost.Asio, and standalone Asio from 1.38 (earlier ones lack the mapping in their category).
inline constexpr bool asio_aborted_is_canceled_condition =
#if defined(EVR_ASIO_BOOST) || EVR_ASIO_VERSION >= 103800
    true;
#else
    false;
#endif

}  // namespace evr::test
