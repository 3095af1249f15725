// evr/callbacks/asio_compat.hpp — Asio names that moved between the versions evr supports, under
// one spelling for the flavour evr's front end uses (see detail/asio_forward.hpp).
//
//   auto [ec] = co_await waiter.async_wait(s, evr::compat::as_tuple(asio::use_awaitable));
//   auto op = waiter.async_wait(s, evr::compat::deferred);
//
// as_tuple, deferred, append and prepend left asio::experimental in Asio 1.23 (Boost 1.80); the
// experimental spellings were removed in 1.33 (Asio 1.38 has none). Here they name whichever the
// found Asio has, and the right header is included, so that code written against evr builds from
// Asio 1.22 (Debian 12's libasio-dev, Boost 1.78) to the newest release without including a
// header that this Asio lacks (which would pick up another Asio's copy from the system include
// path and mix two versions; evr's build turns such an include into an error).
// make_parallel_group, parallel_group and the wait_for_* conditions are in asio::experimental in
// every supported version; they are spelled here once, so that their move is one edit.
//
// asio_compat_names.txt, beside this header, lists every such name with the version it moved in;
// scripts/ci/check-asio-names.sh (run by .ci/run) fails when code outside this header names one of
// them in asio::experimental.
#pragma once

#include <evr/callbacks/detail/asio_forward.hpp>

#if defined(EVR_ASIO_BOOST)
#if EVR_ASIO_VERSION >= 102300
#include <boost/asio/append.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/prepend.hpp>
#else
#include <boost/asio/experimental/append.hpp>
#include <boost/asio/experimental/as_tuple.hpp>
#include <boost/asio/experimental/deferred.hpp>
#include <boost/asio/experimental/prepend.hpp>
#endif
#include <boost/asio/experimental/parallel_group.hpp>
#else
#if EVR_ASIO_VERSION >= 102300
#include <asio/append.hpp>
#include <asio/as_tuple.hpp>
#include <asio/deferred.hpp>
#include <asio/prepend.hpp>
#else
#include <asio/experimental/append.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/experimental/prepend.hpp>
#endif
#include <asio/experimental/parallel_group.hpp>
#endif

namespace evr {
inline namespace EVR_ASIO_FLAVOUR_NAMESPACE {
namespace compat {

#if EVR_ASIO_VERSION >= 102300
using asio::append;
using asio::append_t;
using asio::as_tuple;
using asio::as_tuple_t;
using asio::deferred;
using asio::deferred_t;
using asio::prepend;
using asio::prepend_t;
#else
using asio::experimental::append;
using asio::experimental::append_t;
using asio::experimental::as_tuple;
using asio::experimental::as_tuple_t;
using asio::experimental::deferred;
using asio::experimental::deferred_t;
using asio::experimental::prepend;
using asio::experimental::prepend_t;
#endif
using asio::experimental::make_parallel_group;
using asio::experimental::parallel_group;
using asio::experimental::wait_for_all;
using asio::experimental::wait_for_one;
using asio::experimental::wait_for_one_error;
using asio::experimental::wait_for_one_success;

}  // namespace compat
}  // namespace EVR_ASIO_FLAVOUR_NAMESPACE
}  // namespace evr
