// The first GPU wait a user writes by hand, without evr (wait_mode::hostfunc): behind the
// request's work, a host function (cudaLaunchHostFunc, through the backend) posts the request's
// resumption to its io_context. No thread of the server's own and no polling: the driver runs the
// host function on a thread of its own once the work queued before it is done.
//
// Contract: the host function only posts -- no CUDA call (CUDA forbids them in a host function),
// nothing slow (the driver runs the process's host functions one after another). start() runs on
// the thread of the handler's io_context (a coroutine's initiation); the handler runs there too.
//
// What it costs and where it stops (docs/notebook.md, "The async HTTP server", measures it against
// evr):
//   * every completion crosses threads twice: the driver's thread runs the host function, the
//     post wakes the io thread (the io_context's lock, an eventfd write when it sleeps in epoll);
//   * the post from the driver's thread allocates (Asio has no cache on a thread it does not run);
//   * CUDA never calls a host function once the device has faulted: a fault leaves the request
//     waiting until the server is stopped by force (evr, and the poll mode, report the fault);
//   * a failure to enqueue the host function is reported at once (posted, as a completion must
//     not run inside its initiation).
#pragma once

#include <system_error>

#include <evr/evr.hpp>

#include "wait_op.hpp"

namespace host_func_wait {

/// The host function: posts the waiting operation's completion to its io_context, nothing else.
inline void on_done(void* op) { static_cast<wait_op*>(op)->post_complete({}); }

/// Completes `handler` (void(std::error_code)) on its executor once the work queued so far on `s`
/// is done.
template <typename Handler>
void start(const evr::stream& s, Handler handler) {
  wait_op* op = wait_op::create(std::move(handler));
  if (std::error_code ec = s.backend()->launch_host_func(s.native(), &on_done, op))
    op->post_complete(ec);
}

}  // namespace host_func_wait
