// evr/evr.hpp — the whole public API.
//
//   device/   evr::stream, evr::event, the device backend interface and the CUDA backend
//   pool/     evr::event_pool, evr::pool_set, evr::event_registry
//   reactor/  evr::reactor (the background thread), options, metrics
//   callbacks/ evr::gpu_waiter (Asio), evr::reactor_service, evr::on_complete, evr::wait_handle,
//              evr::release_after
//
// The Asio parts use the flavour of the CMake target linked: evr::evr (standalone Asio) or
// evr::evr_boost (Boost.Asio); see evr/callbacks/detail/asio_forward.hpp. Names that moved between
// Asio versions (as_tuple, deferred) are in <evr/callbacks/asio_compat.hpp>, not included here.
//
// The simulated device is not part of it: <evr/sim/device.hpp>, target evr::sim.
#pragma once

#include <evr/callbacks/gpu_waiter.hpp>
#include <evr/callbacks/on_complete.hpp>
#include <evr/callbacks/reactor_service.hpp>
#include <evr/callbacks/release_after.hpp>
#include <evr/callbacks/wait_handle.hpp>
#include <evr/device/backend.hpp>
#include <evr/device/error.hpp>
#include <evr/device/event.hpp>
#include <evr/device/stream.hpp>
#include <evr/pool/event_pool.hpp>
#include <evr/pool/event_registry.hpp>
#include <evr/pool/pool_set.hpp>
#include <evr/reactor/options.hpp>
#include <evr/reactor/reactor.hpp>
