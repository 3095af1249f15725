// evr/callbacks/asio_compat.hpp — Asio names that moved between the versions evr supports, under
// one spelling for the flavour evr's front end uses (see detail/asio_forward.hpp).
//
//   auto [ec] = co_await waiter.async_wait(s, evr::compat::as_tuple(asio::use_awaitable));
//   auto op = waiter.async_wait(s, evr::compat::deferred);
//
// as_tuple and deferred left asio::experimental in Asio 1.23 (Boost 1.80); the experimental
// spellings were removed later (Asio 1.38 has none). Here they name whichever the found Asio has,
// and the right header is included, so that code written against evr builds from Asio 1.22
// (Debian 12's libasio-dev, Boost 1.78) to the newest release without including a header that
// this Asio lacks (which would pick up another Asio's copy from the system include path and mix
// two versions; evr's build turns such an include into an error).
// make_parallel_group and wait_for_one are still in asio::experimental everywhere; the header is
// included here for convenience.
#pragma once

#include <evr/callbacks/detail/asio_forward.hpp>

#if defined(EVR_ASIO_BOOST)
#if EVR_ASIO_VERSION >= 102300
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/deferred.hpp>
#else
#include <boost/asio/experimental/as_tuple.hpp>
#include <boost/asio/experimental/deferred.hpp>
#endif
#include <boost/asio/experimental/parallel_group.hpp>
#else
#if EVR_ASIO_VERSION >= 102300
#include <asio/as_tuple.hpp>
#include <asio/deferred.hpp>
#else
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/deferred.hpp>
#endif
#include <asio/experimental/parallel_group.hpp>
#endif

namespace evr {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {
namespace compat {

#if EVR_ASIO_VERSION >= 102300
using asio::as_tuple;
using asio::deferred;
#else
using asio::experimental::as_tuple;
using asio::experimental::deferred;
#endif
using asio::experimental::make_parallel_group;
using asio::experimental::wait_for_all;
using asio::experimental::wait_for_one;

}  // namespace compat
}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE
}  // namespace evr
