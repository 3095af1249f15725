// What evr posts to an io_context from a thread of that context (a host's pass delivering its
// batch: the last hop) runs before what another thread posts after it
// (callbacks/include/evr/callbacks/detail/io_context_posts.hpp). Posted as continuations, the
// host's completions went to the thread's private queue, which Asio appends to the shared queue
// only when the running handler returns: a later completion of the same stream that the reactor
// thread posted meanwhile ran first (a GPU test of stream order failed that way with host-function
// markers on an H200). No device: a delivery batch is filled and delivered by hand.
#include <doctest/doctest.h>

#include <chrono>
#include <system_error>
#include <thread>
#include <vector>

#include <evr/callbacks/detail/io_context_posts.hpp>
#include <evr/reactor/detail/wait_op.hpp>

#include "counters.hpp"
#include "delivery_batch.hpp"
#include "support/asio.hpp"

namespace {

using evr::detail::io_context_posts;

/// A posted wait whose completion appends `id` to `order` on `io` (as a gpu_waiter's does:
/// through io_context_posts).
struct posting_wait final : evr::detail::wait_op {
  posting_wait(asio::io_context& io, std::vector<int>& order, int id) noexcept
      : wait_op(&finish), io(io), order(order), id(id) {
    how_ = evr::delivery::post;
  }
  static void finish(wait_op* op, std::error_code) noexcept {
    auto* self = static_cast<posting_wait*>(op);
    io_context_posts::this_thread().post(self->io, [self] { self->order.push_back(self->id); });
  }
  asio::io_context& io;
  std::vector<int>& order;
  int id;
};

/// On `io`'s thread, inside a handler: `deliver_here` posts completion 1 the way the pass under
/// test does; then another thread (the reactor's, in the library) posts completion 2, and the
/// handler returns only after that. Returns the order in which they ran.
template <typename DeliverHere>
std::vector<int> order_of(asio::io_context& io, DeliverHere deliver_here) {
  std::vector<int> order;
  asio::post(io, [&] {
    deliver_here(order);
    std::thread reactor(
        [&] { io_context_posts::this_thread().post(io, [&] { order.push_back(2); }); });
    reactor.join();
  });
  io.run();
  return order;
}

}  // namespace

TEST_CASE("io_context posts: a batch delivered on the context's thread runs before later posts") {
  for (const int hint : {-1, 1}) {  // the default, and a context that says one thread runs it
    CAPTURE(hint);
    asio::io_context io(hint);
    const std::vector<int> order = order_of(io, [&](std::vector<int>& out) {
      evr::detail::reactor_counters counters;
      evr::detail::delivery_batch batch(counters);
      posting_wait w(io, out, 1);
      batch.add(&w, {});
      batch.deliver(std::chrono::steady_clock::now());  // held, then queued at the batch's end
    });
    CHECK(order == std::vector<int>{1, 2});
  }
}

TEST_CASE(
    "io_context posts: a post outside a batch on the context's thread runs before later ones") {
  // An immediate completion (a wait on an idle stream) is posted on the caller's thread, which
  // may be the context's own: with a context that says one thread runs it, Asio put it in the
  // thread's private queue too.
  for (const int hint : {-1, 1}) {
    CAPTURE(hint);
    asio::io_context io(hint);
    const std::vector<int> order = order_of(io, [&](std::vector<int>& out) {
      io_context_posts::this_thread().post(io, [&] { out.push_back(1); });
    });
    CHECK(order == std::vector<int>{1, 2});
  }
}
