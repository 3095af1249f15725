// evr/evr.hpp — the whole public API.
//
//   device/   evr::stream, evr::event, the device backends (CUDA, simulated)
//   pool/     evr::event_pool, evr::pool_set, evr::event_registry
//   reactor/  evr::reactor (the background thread), options, metrics
//   callbacks/ evr::gpu_waiter (Asio), evr::on_complete, evr::release_after
#pragma once

#include <evr/callbacks/gpu_waiter.hpp>
#include <evr/callbacks/on_complete.hpp>
#include <evr/callbacks/release_after.hpp>
#include <evr/device/backend.hpp>
#include <evr/device/error.hpp>
#include <evr/device/event.hpp>
#include <evr/device/sim.hpp>
#include <evr/device/stream.hpp>
#include <evr/pool/event_pool.hpp>
#include <evr/pool/event_registry.hpp>
#include <evr/pool/pool_set.hpp>
#include <evr/reactor/options.hpp>
#include <evr/reactor/reactor.hpp>
