// Signal slots made ahead of need (signal_pool::reserve, reactor::prepare_device): on CUDA the
// first batch of a device loads evr's signal kernel, and a load waits for the device's running
// kernels; a program whose kernels wait for the host makes its slots first. What must hold: the
// slots are made in whole batches, once; taking them afterwards makes nothing; prepare_device
// makes them only for the strategies that serve signal slots, refuses a bad index and a host
// function, and reports a failure without breaking the pool (the next attempt makes them).
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/forwarding_backend.hpp"
#include "support/helpers.hpp"
#include "support/host_func_call.hpp"

using evr::test::quick_options;
using evr::test::wait_until;

namespace {

constexpr evr::sim::options manual{.devices = 2, .mode = evr::sim::run_mode::manual};

/// The simulated device, counting the signal blocks it makes and the signal kernel's loads;
/// `refuse` fails the next blocks with not_enough_memory, `load_error` the next loads,
/// `unsupported` answers as a backend without signal slots; with `hold` set, a block is made only
/// once `hold` is cleared (`holding` says one is being made).
class counting_blocks : public evr::test::forwarding_backend {
 public:
  using forwarding_backend::forwarding_backend;
  std::error_code allocate_signal_block(int d, std::size_t n,
                                        evr::device::signal_block& out) noexcept override {
    if (unsupported) return forwarding_backend::backend::allocate_signal_block(d, n, out);
    if (refuse) return std::make_error_code(std::errc::not_enough_memory);
    holding = hold.load();
    while (hold.load()) std::this_thread::yield();
    holding = false;
    ++made;
    return forwarding_backend::allocate_signal_block(d, n, out);
  }
  std::error_code load_signal_kernel(int d) noexcept override {
    ++loads;
    return load_error ? load_error : forwarding_backend::load_signal_kernel(d);
  }
  std::atomic<int> made{0}, loads{0};
  std::atomic<bool> refuse{false}, hold{false}, holding{false};
  std::error_code load_error;
  bool unsupported = false;
};

}  // namespace

TEST_CASE("signal slots ahead: reserve makes whole batches once; taking them makes nothing") {
  evr::sim::device sim(manual);
  counting_blocks be(sim);
  evr::signal_pool pool(be, 0, 4);
  pool.reserve(0);
  CHECK(be.made == 0);
  pool.reserve(9);  // three batches of four
  CHECK(be.made == 3);
  CHECK(pool.stats().slots == 12);
  pool.reserve(5);  // already there
  CHECK(be.made == 3);
  std::vector<evr::signal_slot> slots;
  for (int i = 0; i < 12; ++i) slots.push_back(pool.acquire());
  CHECK(be.made == 3);
  slots.push_back(pool.acquire());  // the thirteenth needs a batch
  CHECK(be.made == 4);
  CHECK(pool.stats().in_use == 13);
}

TEST_CASE(
    "signal slots ahead: a failed reserve is reported, keeps what it made, and can be retried") {
  evr::sim::device sim(manual);
  counting_blocks be(sim);
  evr::signal_pool pool(be, 0, 4);
  pool.reserve(4);
  be.refuse = true;
  std::error_code ec;
  pool.reserve(12, ec);
  CHECK(ec == std::errc::not_enough_memory);
  CHECK(pool.stats().slots == 4);  // the batch made before the failure stays, usable
  try {
    pool.reserve(12);
    FAIL("reserve did not throw");
  } catch (const evr::error& e) {
    CHECK(e.code() == std::errc::not_enough_memory);
    CHECK(std::string(e.what()).find("signal_pool::reserve") != std::string::npos);
  }
  be.refuse = false;
  pool.reserve(12, ec);
  CHECK_FALSE(ec);
  CHECK(pool.stats().slots == 12);
  std::vector<evr::signal_slot> slots;
  for (int i = 0; i < 12; ++i) slots.push_back(pool.acquire());
  CHECK(be.made == 3);
}

TEST_CASE("signal slots ahead: prepare_device makes the first batch for fence and adaptive only") {
  for (evr::strategy s : {evr::strategy::fence, evr::strategy::adaptive}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(manual);
    counting_blocks be(sim);
    evr::reactor r(be, quick_options(s));
    CHECK(be.made == 0);  // the constructor makes none: a program that never signals pays nothing
    CHECK(r.prepare_device(1) == std::error_code{});
    CHECK(be.made == 1);
    CHECK(r.prepare_device(1) == std::error_code{});  // idempotent
    CHECK(be.made == 1);
    CHECK(r.prepare_device(2) == evr::errc::no_device);
    CHECK(be.made == 1);
    // Taking the prepared slots makes nothing, and a wait on one completes.
    evr::signal_slot slot = r.pools().signals(1).acquire();
    CHECK(be.made == 1);
    evr::stream st(be, 1);
    std::atomic<int> done{0};
    const evr::signal_ticket t = slot.arm();
    REQUIRE_FALSE(
        sim.launch_kernel(st.native(), {}, [ref = slot.ref()] { evr::sim::signal(ref); }));
    REQUIRE_FALSE(evr::on_complete(r, evr::wait_target(st, t),
                                   [&](std::error_code ec) { done += ec ? 1000 : 1; }));
    REQUIRE(wait_until([&] {
      sim.run_until_blocked();
      return done.load() != 0;
    }));
    CHECK(done == 1);
  }
  for (evr::strategy s : {evr::strategy::poll, evr::strategy::host_func}) {
    CAPTURE(std::string(evr::to_string(s)));  // their waits refuse signal tickets: nothing to make
    evr::sim::device sim(manual);
    counting_blocks be(sim);
    evr::reactor r(be, quick_options(s));
    CHECK(r.prepare_device(0) == std::error_code{});
    CHECK(r.prepare_device(2) == evr::errc::no_device);
    CHECK(be.made == 0);
  }
}

TEST_CASE(
    "signal slots ahead: prepare_device reports a failure, and a backend without slots is none") {
  evr::sim::device sim(manual);
  counting_blocks be(sim);
  evr::reactor r(be, quick_options(evr::strategy::fence));
  be.refuse = true;
  CHECK(r.prepare_device(0) == std::errc::not_enough_memory);
  CHECK(be.loads == 0);  // no slots, no load
  be.refuse = false;
  be.load_error = std::make_error_code(std::errc::not_enough_memory);  // the kernel's load fails
  CHECK(r.prepare_device(0) == std::errc::not_enough_memory);
  CHECK(be.made == 1);
  be.load_error = {};
  CHECK(r.prepare_device(0) == std::error_code{});  // tried again: the load, not another batch
  CHECK(be.made == 1);
  CHECK(be.loads == 2);
  counting_blocks without(sim);
  without.unsupported = true;
  evr::reactor w(without, quick_options(evr::strategy::fence));
  CHECK(w.prepare_device(0) == std::error_code{});
}

TEST_CASE("signal slots ahead: prepare_device from a host function is refused and makes nothing") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::threaded});
  counting_blocks be(sim);
  evr::reactor r(be, quick_options(evr::strategy::fence));  // kernel_fences off: signals alone
  evr::stream st(sim, 0);
  // An allocation or a load would wait for the host function it is called from.
  CHECK(evr::test::call_in_host_func(sim, st, [&] { return r.prepare_device(0); }) ==
        evr::errc::called_from_host_func);
  CHECK(be.made == 0);
  CHECK(r.prepare_device(0) == std::error_code{});
  CHECK(be.made == 1);
}

TEST_CASE("signal slots ahead: a batch in the making holds up no release() of the pool's slots") {
  // A device's first batch loads the signal kernel, which waits for the device's running kernels:
  // a thread giving a slot back meanwhile must not wait for that (in Python it holds the GIL).
  evr::sim::device sim(manual);
  counting_blocks be(sim);
  evr::signal_pool pool(be, 0, 2);
  evr::signal_slot a = pool.acquire(), b = pool.acquire();
  be.hold = true;
  std::thread grower([&] { evr::signal_slot c = pool.acquire(); });  // needs a batch: held
  REQUIRE(wait_until([&] { return be.holding.load(); }));
  std::atomic<bool> released{false};
  std::thread giver([&] {
    a.release();
    released = true;
  });
  const bool in_time = wait_until([&] { return released.load(); });
  be.hold = false;  // lets the batch be made whatever happened, so that nothing hangs
  giver.join();
  grower.join();
  CHECK(in_time);
  CHECK(be.made == 2);
  CHECK(pool.stats().slots == 4);
}
