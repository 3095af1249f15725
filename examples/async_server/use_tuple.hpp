// The completion token of the server's coroutines: `co_await op(..., use_tuple)` gives the
// error_code (and the results) as a tuple instead of throwing, so that a client's reset or a
// cancelled wait is a value to test, not an exception.
#pragma once

#include <asio/use_awaitable.hpp>

#include <evr/callbacks/asio_compat.hpp>

inline constexpr auto use_tuple = evr::compat::as_tuple(asio::use_awaitable);
