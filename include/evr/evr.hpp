// evr/evr.hpp — the whole public API, and the one place that says what is public.
//
// Public (stable names, documented contracts), all in namespace evr:
//   device/    evr::stream, evr::event (RAII handles), the backend interface
//              (evr::device::backend, evr::device::cuda_backend()), whether CUDA can run here
//              and why not (evr::device::probe_cuda(), evr::device::cuda_status), errors:
//              evr::error, evr::errc, evr::cuda_category(), evr::evr_category(), evr::throw_if
//   pool/      evr::event_pool, evr::pool_set, evr::event_registry, evr::signal_pool,
//              evr::signal_slot, evr::signal_ticket (device-signalled waits; the kernel side,
//              evr::signal_ref, is <evr/device/signal_ref.h>, its functions
//              <evr/device/signal.cuh>)
//   reactor/   evr::reactor (construction, stop, metrics, accessors), evr::reactor_options,
//              evr::reactor_metrics, evr::strategy, evr::idle_mode, evr::delivery,
//              evr::wait_target (what a wait waits for: built from a stream, an event, or a
//              stream and a signal_ticket)
//   callbacks/ evr::gpu_waiter / basic_gpu_waiter (Asio), evr::reactor_service and
//              evr::use_reactor, evr::on_complete, evr::wait_handle, evr::release_after,
//              evr::async_wait / evr::gpu_sender / basic_gpu_sender (a std::execution sender, no
//              Asio) and the sender protocol's vocabulary, namespace evr::exec
//
// Everything in namespace evr::detail (and every header under a detail/ folder) is internal and
// may change at any time: the operation type the reactor completes (detail::wait_op), the
// operation-level calls reactor::submit / cancel / cancel_owner (private, reached by the in-repo
// front ends through detail::reactor_access), the Asio operation and forwarding headers.
// Start waits through the front ends; cancel them through Asio cancellation slots,
// gpu_waiter::cancel() or evr::wait_handle.
//
// The Asio parts use the flavour of the CMake target linked: evr::evr (standalone Asio) or
// evr::evr_boost (Boost.Asio); see evr/callbacks/detail/asio_forward.hpp. Names that moved between
// Asio versions (as_tuple, deferred) are in <evr/callbacks/asio_compat.hpp>, not included here.
//
// Not included here: the simulated device (<evr/sim/device.hpp>, target evr::sim), the device
// functions of <evr/device/signal.cuh> (CUDA sources include it), and
// <evr/callbacks/stdexec.hpp> (evr::stdexec_protocol: the sender in NVIDIA stdexec's vocabulary;
// it includes stdexec).
#pragma once

#include <evr/callbacks/exec.hpp>
#include <evr/callbacks/gpu_waiter.hpp>
#include <evr/callbacks/on_complete.hpp>
#include <evr/callbacks/reactor_service.hpp>
#include <evr/callbacks/release_after.hpp>
#include <evr/callbacks/sender.hpp>
#include <evr/callbacks/wait_handle.hpp>
#include <evr/device/backend.hpp>
#include <evr/device/cuda_status.hpp>
#include <evr/device/error.hpp>
#include <evr/device/event.hpp>
#include <evr/device/stream.hpp>
#include <evr/pool/event_pool.hpp>
#include <evr/pool/event_registry.hpp>
#include <evr/pool/pool_set.hpp>
#include <evr/pool/signal_pool.hpp>
#include <evr/reactor/delivery.hpp>
#include <evr/reactor/metrics.hpp>
#include <evr/reactor/options.hpp>
#include <evr/reactor/reactor.hpp>
#include <evr/reactor/wait_target.hpp>
