// evr/reactor/delivery.hpp — how a completed wait reaches its handler (gpu_waiter::set_delivery).
#pragma once

namespace evr {

/// How a completed wait reaches its handler. Every posted kind runs the handler on its associated
/// executor, never inside async_wait; they differ in what keeps that executor's thread ready.
enum class delivery : unsigned char {
  /// The default. Posted; when the executor runs on an io_context, a thread of that context
  /// wakes itself (a timer it arms) shortly before the wait's predicted completion and looks for
  /// it in place of the reactor, so the handler runs within microseconds of the GPU finishing
  /// instead of after the wake-up of a parked thread (tens of us). Costs that thread the polling
  /// through the prediction's window (docs/architecture.md, "The last hop").
  post,
  /// Posted; the reactor wakes the executor's thread shortly before the predicted completion and
  /// the thread spins until the completion arrives (io_context executors). The reactor still
  /// finds the completion, so two threads spin through the window: more CPU than `post`.
  post_woken,
  /// Posted, nothing else: the thread is woken when the completion is posted. No CPU on the
  /// executor's thread beyond the handler; the hop costs a wake-up of a parked thread.
  post_plain,
  /// Run on the reactor thread: lowest latency; the handler must be short and must never block
  /// (it delays every other completion).
  inline_on_reactor,
};

}  // namespace evr
