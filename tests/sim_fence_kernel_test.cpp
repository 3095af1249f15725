// Fence words written by evr's fence kernel (reactor_options::kernel_fences): past
// max_fence_streams, on a device that runs the kernel, a wait's marker is still a fence word (a
// memory read to look at) rather than an event. The simulated device models the kernel as a
// fence write (options::fence_kernels); what it spares on a GPU, the hardware queues, is measured
// on the GPU (bench/studies/marker_queues.cu).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/helpers.hpp"
#include "support/host_func_call.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::wait_until;

namespace {

constexpr evr::strategy fence_strategies[] = {evr::strategy::fence, evr::strategy::adaptive};

/// quick_options(s) with the fence kernel on (reactor_options::kernel_fences is off by default).
evr::reactor_options with_kernel_fences(evr::strategy s) {
  auto opts = quick_options(s);
  opts.kernel_fences = true;
  return opts;
}

evr::sim::options manual_with_fence_kernels() {
  return evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual, .fence_kernels = true};
}

/// Completions in the order their handlers ran, by the wait's number; -1000 - i when one failed.
struct outcomes {
  std::mutex m;
  std::vector<int> seen;
  std::atomic<int> count{0};
  auto callback(int i) {
    return [this, i](std::error_code ec) {
      {
        std::lock_guard lock(m);
        seen.push_back(ec ? -1000 - i : i);
      }
      ++count;
    };
  }
};

}  // namespace

TEST_CASE("fence kernel: past max_fence_streams, fence words by the kernel, not events") {
  for (evr::strategy s : fence_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(manual_with_fence_kernels());
    auto opts = with_kernel_fences(s);
    opts.max_fence_streams = 2;
    // adaptive: no doorbell (a host function between the markers of this manual device).
    opts.doorbell_after = std::chrono::hours(1);
    outcomes out;  // before the reactor: its destructor completes pending waits
    evr::reactor r(sim, opts);
    std::vector<std::unique_ptr<evr::stream>> streams;
    for (int i = 0; i < 4; ++i) streams.push_back(std::make_unique<evr::stream>(sim, 0));
    auto wait_on = [&](int stream, int id) {
      REQUIRE_FALSE(
          evr::on_complete(r, *streams[static_cast<std::size_t>(stream)], out.callback(id)));
    };
    wait_on(0, 0);
    wait_on(1, 1);
    CHECK(sim.counters().fence_writes_enqueued == 2);
    CHECK(sim.counters().fence_kernels_enqueued == 0);
    // A third and a fourth stream: every new wait of the device gets the fence kernel, also on
    // the first two streams, behind their fence writes.
    wait_on(2, 2);
    wait_on(3, 3);
    wait_on(1, 4);
    wait_on(0, 5);
    CHECK(sim.counters().fence_writes_enqueued == 2);
    CHECK(sim.counters().fence_kernels_enqueued == 4);
    CHECK(sim.counters().event_records == 0);
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return out.count.load() == 6; }));
    std::lock_guard lock(out.m);
    std::vector<int> ids = out.seen;
    std::sort(ids.begin(), ids.end());
    CHECK(ids == std::vector<int>{0, 1, 2, 3, 4, 5});  // each once, none failed
    CHECK(r.metrics().event_queries == 0);
  }
}

TEST_CASE("fence kernel: fence writes and kernels mixed on a stream retire in its order, once") {
  for (evr::strategy s : fence_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(manual_with_fence_kernels());
    auto opts = with_kernel_fences(s);
    opts.max_fence_streams = 1;
    opts.doorbell_after = std::chrono::hours(1);
    outcomes out;
    evr::reactor r(sim, opts);
    evr::stream a(sim, 0), b(sim, 0);
    constexpr int n = 30;
    for (int i = 0; i < n; ++i) {
      REQUIRE(sim.launch_kernel(a.native()) == std::error_code{});
      REQUIRE_FALSE(evr::on_complete(r, a, out.callback(i)));
      if (i == 9) REQUIRE_FALSE(evr::on_complete(r, b, out.callback(1000)));  // the limit passed
    }
    CHECK(sim.counters().fence_writes_enqueued == 10);  // a's first ten, before b came
    CHECK(sim.counters().fence_kernels_enqueued == n - 10 + 1);
    for (int k = 0; k < n; k += 3) sim.step(a.native(), 6);  // a kernel and a marker each
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return out.count.load() == n + 1; }));
    std::lock_guard lock(out.m);
    std::vector<int> on_a;
    for (int id : out.seen) {
      CHECK(id >= 0);  // none failed
      if (id < 1000) on_a.push_back(id);
    }
    CHECK(on_a.size() == static_cast<std::size_t>(n));
    CHECK(std::is_sorted(on_a.begin(), on_a.end()));
  }
}

TEST_CASE(
    "fence kernel: kernel_fences off, or a device without the kernel: events past the limit") {
  for (const bool device_runs_it : {false, true}) {
    CAPTURE(device_runs_it);
    evr::sim::options so = manual_with_fence_kernels();
    so.fence_kernels = device_runs_it;
    evr::sim::device sim(so);
    auto opts = with_kernel_fences(evr::strategy::fence);
    opts.max_fence_streams = 1;
    opts.kernel_fences = !device_runs_it;  // the one that is on cannot be used
    std::atomic<int> done{0};
    evr::reactor r(sim, opts);
    evr::stream a(sim, 0), b(sim, 0);
    REQUIRE_FALSE(evr::on_complete(r, a, [&](std::error_code ec) { done += ec ? 1000 : 1; }));
    REQUIRE_FALSE(evr::on_complete(r, b, [&](std::error_code ec) { done += ec ? 1000 : 1; }));
    CHECK(sim.counters().fence_writes_enqueued == 1);
    CHECK(sim.counters().fence_kernels_enqueued == 0);
    CHECK(sim.counters().event_records == 1);
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return done.load() == 2; }));
  }
}

TEST_CASE(
    "fence kernel: loaded by the constructor where the process runs, and by prepare_device; "
    "never by a wait") {
  evr::sim::options so = manual_with_fence_kernels();
  so.devices = 2;
  so.fence_kernels_after_load = true;  // ready only once loaded
  so.devices_in_use = 1;               // the process uses device 0 when the reactor is made
  evr::sim::device sim(so);
  auto opts = with_kernel_fences(evr::strategy::fence);
  opts.max_fence_streams = 1;
  outcomes out;
  evr::reactor r(sim, opts);
  CHECK(sim.counters().fence_kernel_loads == 1);
  CHECK(sim.fence_kernels(0));
  CHECK_FALSE(sim.fence_kernels(1));
  evr::stream a(sim, 1), b(sim, 1), c(sim, 1);
  REQUIRE_FALSE(evr::on_complete(r, a, out.callback(0)));  // within the limit: a fence write
  // Past it on device 1, whose kernel is not loaded: events, and no wait loads it.
  REQUIRE_FALSE(evr::on_complete(r, b, out.callback(1)));
  REQUIRE_FALSE(evr::on_complete(r, c, out.callback(2)));
  CHECK(sim.counters().event_records == 2);
  CHECK(sim.counters().fence_kernel_loads == 1);
  CHECK(r.prepare_device(1) == std::error_code{});
  CHECK(sim.counters().fence_kernel_loads == 2);
  for (int i = 3; i < 9; ++i) REQUIRE_FALSE(evr::on_complete(r, i % 2 ? b : c, out.callback(i)));
  CHECK(sim.counters().fence_kernels_enqueued == 6);
  CHECK(sim.counters().event_records == 2);
  CHECK(r.prepare_device(2) == evr::errc::no_device);  // the bad index named, nothing broken
  sim.run_until_blocked();
  REQUIRE(wait_until([&] { return out.count.load() == 9; }));
  std::lock_guard lock(out.m);
  std::vector<int> on_b;
  for (int id : out.seen) {
    CHECK(id >= 0);
    if (id % 2 == 1) on_b.push_back(id);
  }
  CHECK(std::is_sorted(on_b.begin(), on_b.end()));  // b's event, then its kernels, in order
}

TEST_CASE("fence kernel: with kernel_fences off nothing is loaded; a device without it says so") {
  evr::sim::options so = manual_with_fence_kernels();
  so.fence_kernels_after_load = true;
  evr::sim::device sim(so);
  {
    auto opts = quick_options(evr::strategy::fence);
    opts.kernel_fences = false;
    evr::reactor off(sim, opts);
    CHECK(off.prepare_device(0) == std::error_code{});  // no fence kernel (signal slots only)
    CHECK(sim.counters().fence_kernel_loads == 0);
    CHECK_FALSE(sim.fence_kernels(0));
  }
  evr::sim::device older(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  evr::reactor on(older, with_kernel_fences(evr::strategy::fence));
  CHECK(on.prepare_device(0) == evr::errc::unsupported);
  CHECK_FALSE(older.fence_kernels(0));
}

TEST_CASE("fence kernel: off by default: nothing loaded, events past the limit") {
  evr::sim::options so = manual_with_fence_kernels();
  so.fence_kernels_after_load = true;
  evr::sim::device sim(so);
  auto opts = quick_options(evr::strategy::fence);
  opts.max_fence_streams = 1;
  std::atomic<int> done{0};
  evr::reactor r(sim, opts);
  evr::stream a(sim, 0), b(sim, 0);
  REQUIRE_FALSE(evr::on_complete(r, a, [&](std::error_code ec) { done += !ec; }));
  REQUIRE_FALSE(evr::on_complete(r, b, [&](std::error_code ec) { done += !ec; }));
  CHECK(sim.counters().fence_kernel_loads == 0);
  CHECK(sim.counters().fence_kernels_enqueued == 0);
  CHECK(sim.counters().event_records == 1);
  sim.run_until_blocked();
  REQUIRE(wait_until([&] { return done.load() == 2; }));
}

TEST_CASE("fence kernel: beyond max_pending_fences, events, as for fence writes") {
  evr::sim::device sim(manual_with_fence_kernels());
  auto opts = with_kernel_fences(evr::strategy::fence);
  opts.max_fence_streams = 1;
  opts.max_pending_fences = 4;
  std::atomic<int> done{0};
  evr::reactor r(sim, opts);
  evr::stream a(sim, 0), b(sim, 0);
  constexpr int n = 12;
  for (int i = 0; i < n; ++i)
    REQUIRE_FALSE(evr::on_complete(r, i == 0 ? a : b, [&](std::error_code ec) { done += !ec; }));
  // a's fence write and three fence kernels make four pending; the rest record events.
  CHECK(sim.counters().fence_writes_enqueued == 1);
  CHECK(sim.counters().fence_kernels_enqueued == 3);
  CHECK(sim.counters().event_records == n - 4);
  sim.run_until_blocked();
  REQUIRE(wait_until([&] { return done.load() == n; }));
  CHECK(wait_until([&] { return r.pools().stats().in_use == 0; }));
}

TEST_CASE("fence kernel: a stopped reactor aborts the waits whose kernels had not run, once each") {
  evr::sim::device sim(manual_with_fence_kernels());
  auto opts = with_kernel_fences(evr::strategy::fence);
  opts.max_fence_streams = 1;
  outcomes out;
  auto r = std::make_unique<evr::reactor>(sim, opts);
  evr::stream a(sim, 0), b(sim, 0);
  REQUIRE_FALSE(evr::on_complete(*r, a, out.callback(0)));  // a fence write
  for (int i = 1; i <= 5; ++i) REQUIRE_FALSE(evr::on_complete(*r, b, out.callback(i)));
  REQUIRE(sim.counters().fence_kernels_enqueued == 5);
  sim.step(b.native(), 2);  // two of b's kernels ran
  REQUIRE(wait_until([&] { return out.count.load() == 2; }));
  r->stop();
  REQUIRE(wait_until([&] { return out.count.load() == 6; }));
  sim.run_until_blocked();  // the rest land after the stop, into a reactor that has let go
  r.reset();
  std::lock_guard lock(out.m);
  CHECK(out.seen.size() == 6u);
  std::vector<int> ids = out.seen;
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<int>{-1005, -1004, -1003, -1000, 1, 2});
}

TEST_CASE("fence kernel: the simulated device refuses bad input, naming it") {
  evr::sim::device without(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  evr::sim::device sim(
      evr::sim::options{.devices = 2, .mode = evr::sim::run_mode::manual, .fence_kernels = true});
  evr::stream on_0(sim, 0), on_1(sim, 1), elsewhere(without, 0);
  evr::device::fence_block block;
  REQUIRE(sim.allocate_fence_block(0, 1, block) == std::error_code{});
  CHECK(sim.fence_kernels(0));
  CHECK_FALSE(sim.fence_kernels(2));
  CHECK_FALSE(without.fence_kernels(0));
  CHECK(without.write_fence_by_kernel(0, elsewhere.native(), block.device_address, 1) ==
        evr::errc::unsupported);
  CHECK(sim.write_fence_by_kernel(2, on_0.native(), block.device_address, 1) ==
        evr::errc::no_device);
  CHECK(sim.write_fence_by_kernel(0, on_1.native(), block.device_address, 1) ==
        evr::errc::device_mismatch);
  CHECK(sim.write_fence_by_kernel(0, on_0.native(), block.device_address + 4096, 1) ==
        evr::errc::invalid_argument);
  CHECK(sim.counters().fence_kernels_enqueued == 0);
  {  // a device whose kernel was never loaded
    evr::sim::device later(evr::sim::options{.devices = 1,
                                             .mode = evr::sim::run_mode::manual,
                                             .fence_kernels = true,
                                             .fence_kernels_after_load = true});
    evr::stream st(later, 0);
    evr::device::fence_block words;
    REQUIRE(later.allocate_fence_block(0, 1, words) == std::error_code{});
    CHECK(later.write_fence_by_kernel(0, st.native(), words.device_address, 1) ==
          evr::errc::unsupported);
    CHECK(later.load_fence_kernels(0) == std::error_code{});
    CHECK(later.write_fence_by_kernel(0, st.native(), words.device_address, 1) ==
          std::error_code{});
    later.run_until_blocked();
    CHECK(words.host[0] == 1);
    later.free_fence_block(words);
  }
  REQUIRE(sim.write_fence_by_kernel(0, on_0.native(), block.device_address, 7) ==
          std::error_code{});
  sim.run_until_blocked();
  CHECK(block.host[0] == 7);
  CHECK(sim.counters().fence_kernels_enqueued == 1);
  CHECK(sim.counters().fence_writes_landed == 1);
  sim.free_fence_block(block);
}

TEST_CASE("fence kernel: poll and host_func load nothing; a host function may not load it") {
  evr::sim::options so = manual_with_fence_kernels();
  so.mode = evr::sim::run_mode::threaded;
  so.fence_kernels_after_load = true;
  evr::sim::device sim(so);
  for (evr::strategy s : {evr::strategy::poll, evr::strategy::host_func}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::reactor r(sim, with_kernel_fences(s));  // their markers are never fence words
    CHECK(r.prepare_device(0) == std::error_code{});
    CHECK(r.prepare_device(1) == evr::errc::no_device);  // the index is checked all the same
  }
  CHECK(sim.counters().fence_kernel_loads == 0);
  evr::sim::options one_device_unused = so;
  one_device_unused.devices_in_use = 0;  // the constructor finds nothing to load
  evr::sim::device fresh(one_device_unused);
  evr::reactor r(fresh, with_kernel_fences(evr::strategy::fence));
  evr::stream st(fresh, 0);
  // The load would wait for the host function it is called from.
  CHECK(evr::test::call_in_host_func(fresh, st, [&] { return r.prepare_device(0); }) ==
        evr::errc::called_from_host_func);
  CHECK(fresh.counters().fence_kernel_loads == 0);
  CHECK(r.prepare_device(0) == std::error_code{});  // from an ordinary thread it loads
  CHECK(fresh.fence_kernels(0));
}
