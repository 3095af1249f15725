// Cancelling one wait, or all of one waiter's waits, never touches anybody else's: waiters of
// different executor types (each basic_gpu_waiter<Executor> is a class of its own), a waiter
// cancelled or destroyed while another has waits pending on the same stream, and the other front
// ends (on_complete with a wait_handle, the sender with a stop token) beside a gpu_waiter.
// The device is stepped by hand (manual mode): every wait is pending until the test lets the GPU
// pass, so the outcome of each wait is exact, whatever the scheduling of the machine.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>
#include <vector>

#include <evr/callbacks/sender.hpp>
#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"
#include "support/test_receiver.hpp"

using evr::test::quick_options;
using evr::test::run_until;
using evr::test::wait_until;

namespace {

constexpr int waits_each = 100;

/// How many handlers of one waiter ran, and with what.
struct tally {
  int succeeded = 0;
  int aborted = 0;
  int other = 0;
  int total() const { return succeeded + aborted + other; }
};

/// A handler that counts into a tally (run on the io_context's thread: no atomics needed).
struct count_into {
  tally* t;
  void operator()(evr::asio_error_code ec) const {
    if (!ec) {
      ++t->succeeded;
    } else if (ec == asio::error::operation_aborted) {
      ++t->aborted;
    } else {
      ++t->other;
    }
  }
};

/// Executor types of io_context that no other test instantiates a waiter with: they differ
/// only in the allocator they carry. A per-class counter would give the first waiter of each
/// the same owner id.
auto executor_a(asio::io_context& io) {
  return asio::require(io.get_executor(), asio::execution::allocator(std::allocator<char>()));
}
auto executor_b(asio::io_context& io) {
  return asio::require(io.get_executor(), asio::execution::allocator(std::allocator<short>()));
}

enum class how_a_ends { cancel, destroy };

/// Starts `waits_each` waits through each of two waiters made by `make_a` and `make_b` on one
/// stream, ends A (cancel() or its destructor) while every wait pends, then lets the GPU pass.
/// A's waits must all be aborted and B's must all succeed.
template <class MakeA, class MakeB>
void check_isolated(evr::strategy s, how_a_ends how, MakeA&& make_a, MakeB&& make_b) {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  asio::io_context io;
  evr::reactor r(sim, quick_options(s));
  evr::stream st(sim, 0);
  REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});  // holds the stream (manual)
  tally ta, tb;
  auto a = std::make_optional(make_a(io, r));
  auto b = make_b(io, r);
  for (int i = 0; i < waits_each; ++i) {
    a->async_wait(st, count_into{&ta});
    b.async_wait(st, count_into{&tb});
  }
  if (how == how_a_ends::cancel) {
    a->cancel();
  } else {
    a.reset();
  }
  REQUIRE(run_until(io, [&] { return ta.total() == waits_each; }));
  CHECK(ta.aborted == waits_each);
  CHECK(tb.total() == 0);  // nothing of B's was touched while the GPU held the stream
  sim.run_until_blocked();
  REQUIRE(run_until(io, [&] { return tb.total() == waits_each; }));
  CHECK(tb.succeeded == waits_each);
  CHECK(tb.aborted == 0);
  CHECK(tb.other == 0);
  CHECK(r.metrics().cancelled == static_cast<std::uint64_t>(waits_each));
}

}  // namespace

TEST_CASE("cancel isolation: one waiter's cancel() or destruction aborts only its own waits") {
  for (evr::strategy s : evr::test::all_strategies) {
    for (how_a_ends how : {how_a_ends::cancel, how_a_ends::destroy}) {
      CAPTURE(std::string(evr::to_string(s)));
      CAPTURE(how == how_a_ends::cancel ? "cancel()" : "destroyed");
      SUBCASE("two executor types, the first waiter of each") {
        check_isolated(
            s, how,
            [](asio::io_context& io, evr::reactor& r) {
              return evr::basic_gpu_waiter<decltype(executor_a(io))>(executor_a(io), r);
            },
            [](asio::io_context& io, evr::reactor& r) {
              return evr::basic_gpu_waiter<decltype(executor_b(io))>(executor_b(io), r);
            });
      }
      SUBCASE("io_context::executor_type beside any_io_executor (evr::gpu_waiter)") {
        check_isolated(
            s, how,
            [](asio::io_context& io, evr::reactor& r) {
              return evr::basic_gpu_waiter<asio::io_context::executor_type>(io.get_executor(), r);
            },
            [](asio::io_context& io, evr::reactor& r) {
              return evr::gpu_waiter(io.get_executor(), r);
            });
      }
      SUBCASE("two waiters of one type") {
        check_isolated(
            s, how,
            [](asio::io_context& io, evr::reactor& r) {
              return evr::gpu_waiter(io.get_executor(), r);
            },
            [](asio::io_context& io, evr::reactor& r) {
              return evr::gpu_waiter(io.get_executor(), r);
            });
      }
    }
  }
}

TEST_CASE("cancel isolation: a waiter's cancel() leaves on_complete and sender waits alone") {
  namespace ex = evr::exec;
  using stoppable =
      ex::connect_result_t<evr::gpu_sender, evr::test::test_receiver<evr::test::stop_env>>;
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    asio::io_context io;
    // Before the reactor: its destructor completes pending waits into these (and the senders'
    // operation states).
    std::atomic<int> callbacks_ok{0}, callbacks_bad{0};
    std::stop_source stop;  // never requested: the senders are stoppable, and left alone
    std::vector<evr::test::outcome> outcomes(waits_each);
    std::vector<evr::test::op_slot<stoppable>> ops(waits_each);
    evr::reactor r(sim, quick_options(s));
    evr::stream st(sim, 0);
    REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
    tally waited;
    std::vector<evr::wait_handle> handles(waits_each);
    {
      evr::gpu_waiter waiter(io.get_executor(), r);
      for (int i = 0; i < waits_each; ++i) {
        waiter.async_wait(st, count_into{&waited});
        evr::on_complete(
            r, st, [&](std::error_code ec) { (ec ? callbacks_bad : callbacks_ok).fetch_add(1); },
            handles[static_cast<std::size_t>(i)]);
        auto& op = ops[static_cast<std::size_t>(i)].construct([&] {
          return ex::connect(evr::async_wait(r, st), evr::test::test_receiver<evr::test::stop_env>{
                                                         &outcomes[static_cast<std::size_t>(i)],
                                                         evr::test::stop_env{stop.get_token()}});
        });
        ex::start(op);
      }
      waiter.cancel();
      REQUIRE(run_until(io, [&] { return waited.total() == waits_each; }));
      CHECK(waited.aborted == waits_each);
    }
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return callbacks_ok.load() + callbacks_bad.load() == waits_each; }));
    CHECK(callbacks_ok.load() == waits_each);
    REQUIRE(wait_until([&] {
      for (const auto& o : outcomes)
        if (o.calls() != 1) return false;
      return true;
    }));
    for (const auto& o : outcomes) CHECK(o.values.load() == 1);
    CHECK(r.metrics().cancelled == static_cast<std::uint64_t>(waits_each));
  }
}
