// Soak on the simulated device: many reactor lifetimes, each served by 16 submitting threads over
// 64 streams of 2 simulated devices, with random strategies, random markers (fence words only;
// past a stream limit events or evr's fence kernel, the kernel made ready on device 1 in the
// middle of the first such lifetime; a small pending-fence budget), random cancellation through
// both front ends, device-signalled waits (fence and adaptive), and a stop() at a random point
// while waits are pending. Asserts, per lifetime:
// every wait completes exactly once (successes + aborts + errors + refusals == attempts, each
// wait's own counter == 1), the reactor's counters agree, the marker pool balances; across
// lifetimes: the heap does not grow after warm-up.
//
// Size: EVR_SOAK_COMPLETIONS waits in all (default 2*10^5, 2*10^4 under sanitizers). The long
// version:
//   EVR_SOAK_COMPLETIONS=10000000 build/release/tests/evr_tests -tc="soak*"
// EVR_SOAK_SEED=N replays a run's random choices (strategies, stop points, which waits are
// cancelled; thread interleavings are not reproducible). The seed is printed.
#include <doctest/doctest.h>

#include <malloc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::wait_until;

namespace {

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  return (end != nullptr && *end == '\0') ? v : fallback;
}

/// Bytes the heap has handed out and not taken back (glibc's mallinfo2; 0 where unsupported,
/// e.g. under the sanitizers, which replace malloc).
std::uint64_t heap_in_use() {
  const struct mallinfo2 mi = ::mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

/// Resident set size in KiB (/proc/self/status VmRSS; 0 if unreadable).
std::uint64_t rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      std::uint64_t kib = 0;
      status >> kib;
      return kib;
    }
    status.ignore(1 << 20, '\n');
  }
  return 0;
}

/// Which markers a round's waits get (reactor_options): fence words on every stream (the simulated
/// device's default, no stream limit), or past 8 streams a device events or evr's fence kernel;
/// now and then a pending-fence budget small enough to be met.
struct marker_mix {
  std::size_t max_fence_streams = 0;
  bool kernel_fences = false;
  std::size_t max_pending_fences = 512;

  static marker_mix random(std::mt19937_64& rng) {
    marker_mix m;
    const auto kind = rng() % 3;  // 0: no limit, 1: events past it, 2: the fence kernel past it
    if (kind != 0) m.max_fence_streams = 8;
    m.kernel_fences = kind == 2;
    if (rng() % 4 == 0) m.max_pending_fences = 24;
    return m;
  }
  void apply(evr::reactor_options& o) const {
    o.max_fence_streams = max_fence_streams;
    o.kernel_fences = kernel_fences;
    o.max_pending_fences = max_pending_fences;
  }
  std::string describe() const {
    return (max_fence_streams == 0 ? std::string("fence words")
            : kernel_fences        ? "fence kernel past 8 streams"
                                   : "events past 8 streams") +
           ", " + std::to_string(max_pending_fences) + " pending fences";
  }
};

/// Outcome bookkeeping of one reactor lifetime ("round").
struct round_record {
  explicit round_record(std::size_t n) : calls(n) {}
  std::vector<std::atomic<std::uint8_t>> calls;  // per wait: how many times it completed
  std::atomic<std::uint64_t> ok{0}, aborted{0}, errors{0}, refused{0}, finished{0};
  std::atomic<std::uint64_t> cancel_requests{0};

  void finish(std::size_t id, std::error_code ec) noexcept {
    calls[id].fetch_add(1, std::memory_order_relaxed);
    if (!ec) {
      ok.fetch_add(1, std::memory_order_relaxed);
    } else if (evr::test::aborted(ec)) {  // Asio's operation_aborted or evr's
      aborted.fetch_add(1, std::memory_order_relaxed);
    } else if (ec == evr::errc::reactor_stopped) {
      refused.fetch_add(1, std::memory_order_relaxed);  // an Asio refusal arrives as a completion
    } else {
      errors.fetch_add(1, std::memory_order_relaxed);
    }
    finished.fetch_add(1, std::memory_order_release);
  }
  /// A refusal returned by submit/on_complete (the callback is never called).
  void refuse(std::size_t id, std::error_code ec) noexcept {
    if (ec == evr::errc::reactor_stopped) {
      calls[id].fetch_add(1, std::memory_order_relaxed);
      refused.fetch_add(1, std::memory_order_relaxed);
      finished.fetch_add(1, std::memory_order_release);
    } else {
      finish(id, ec);  // any other refusal is unexpected here: counted as an error
    }
  }
};

using strand_type = asio::strand<asio::io_context::executor_type>;

/// What one submitting thread keeps until the round is over (after every completion).
struct submitter_state {
  std::deque<asio::cancellation_signal> signals;  // stable addresses, emitted on `strand`
  std::deque<evr::event> events;                  // user events waited on (never re-recorded)
  std::unique_ptr<evr::wait_handle[]> handles;    // on_complete waits with a handle
  std::optional<strand_type> strand;
  std::optional<evr::basic_gpu_waiter<strand_type>> waiter;
  /// Device-signalled waits: one slot per stream (a slot is signalled in launch order, and only
  /// this thread launches on it), taken on first use.
  std::vector<evr::signal_slot> slots;
};

}  // namespace

TEST_CASE(
    "soak: many reactor lifetimes, 16 threads x 64 streams, cancellation and stop at random "
    "points") {
  const std::uint64_t total = std::max<std::uint64_t>(
      env_u64("EVR_SOAK_COMPLETIONS", evr::test::sanitized() ? 20000 : 200000), 1600);
  const std::uint64_t seed = env_u64("EVR_SOAK_SEED", std::random_device{}());
  MESSAGE("soak: " << total << " waits, seed " << seed << " (EVR_SOAK_SEED to replay)");
  constexpr int threads = 16, streams = 64, devices = 2;
  constexpr std::uint64_t max_per_round = 50000;
  const std::uint64_t rounds =
      std::max<std::uint64_t>(8, (total + max_per_round - 1) / max_per_round);
  const std::uint64_t per_thread = std::max<std::uint64_t>(1, total / rounds / threads);
  const std::size_t attempts = static_cast<std::size_t>(per_thread * threads);
  constexpr int tail_waits = 8;  // waits behind a long kernel, submitted right before stop()

  std::mt19937_64 rng(seed);
  // The fence kernel as on a GPU: ready on a device once loaded, and the process "uses" device 0
  // only, so a reactor's constructor loads it there and device 1 gets it from the first
  // prepare_device(1), made while that round's waits are being submitted.
  evr::sim::device sim(evr::sim::options{.devices = devices,
                                         .mode = evr::sim::run_mode::threaded,
                                         .fence_kernels = true,
                                         .fence_kernels_after_load = true,
                                         .devices_in_use = 1});
  std::vector<evr::stream> ss;
  for (int i = 0; i < streams; ++i) ss.emplace_back(sim, i % devices);

  // Every strategy at least once per four rounds, in a random order.
  std::vector<evr::strategy> order(std::begin(evr::test::all_strategies),
                                   std::end(evr::test::all_strategies));
  std::uint64_t grand_ok = 0, grand_aborted = 0, grand_refused = 0, grand_cancels = 0;
  std::uint64_t grand_lost = 0, grand_duplicated = 0;
  std::uint64_t grand_host_passes = 0, grand_host_completions = 0;  // the last hop (io threads)
  std::uint64_t grand_fence_kernels = 0, grand_event_markers = 0;   // markers past the limit
  std::array<std::uint64_t, 8> rounds_of{};  // lifetimes per strategy (indexed by its value)  //
                                             // waits completed 0 times, or more than once
  std::vector<std::uint64_t> heap_after, rss_after;
  const auto t_start = std::chrono::steady_clock::now();

  for (std::uint64_t round = 0; round < rounds; ++round) {
    if (round % order.size() == 0) std::shuffle(order.begin(), order.end(), rng);
    const evr::strategy strat = order[round % order.size()];
    ++rounds_of[static_cast<std::size_t>(strat)];
    auto opts = quick_options(strat);
    const marker_mix markers = marker_mix::random(rng);
    markers.apply(opts);
    opts.shutdown_drain = std::chrono::microseconds(rng() % 3000);  // short: waits are aborted
    // Stop somewhere in the last quarter of the submissions (racing them), or after all of them.
    const std::uint64_t stop_at =
        attempts - attempts / 4 + rng() % (attempts / 4 + attempts / 8 + 1);
    const auto c0 = sim.counters();
    CAPTURE(round);
    CAPTURE(std::string(evr::to_string(strat)));
    CAPTURE(stop_at);
    CAPTURE(markers.describe());
    // Device 1's prepare_device comes somewhere in the first half of the submissions.
    const std::uint64_t prepare_at = rng() % (attempts / 2 + 1);

    round_record rec(attempts + tail_waits);
    std::atomic<std::uint64_t> started{0};  // submissions attempted so far
    {
      evr::reactor r(sim, opts);
      asio::io_context io;
      auto work = asio::make_work_guard(io);
      std::vector<std::thread> io_threads;
      for (int i = 0; i < 2; ++i) io_threads.emplace_back([&io] { io.run(); });

      std::vector<submitter_state> state(threads);
      std::vector<std::uint64_t> thread_seeds(threads);
      for (auto& s : thread_seeds) s = rng();
      std::vector<std::thread> submitters;
      // Device-signalled waits where the strategy serves them (fence words and a fault probe).
      const bool signals = strat == evr::strategy::fence || strat == evr::strategy::adaptive;
      for (int t = 0; t < threads; ++t) {
        submitter_state& me = state[t];
        me.slots.resize(streams);
        me.handles.reset(new evr::wait_handle[per_thread]);
        me.strand.emplace(asio::make_strand(io));
        me.waiter.emplace(*me.strand, r);
        submitters.emplace_back([&, t] {
          std::mt19937_64 trng(thread_seeds[t]);
          submitter_state& my = state[t];
          std::vector<evr::wait_handle*> to_cancel;  // handles to cancel a little later
          for (std::uint64_t i = 0; i < per_thread; ++i) {
            const std::size_t id = static_cast<std::size_t>(t * per_thread + i);
            evr::stream& st = ss[trng() % streams];
            if (trng() % 8 == 0)
              sim.launch_kernel(st.native(), std::chrono::microseconds(trng() % 20));
            evr::wait_target target = st;
            const std::size_t which = static_cast<std::size_t>(&st - ss.data());
            if (trng() % 32 == 0) {  // a wait on a user's event (the reactor's "loose" path)
              my.events.emplace_back(sim);
              my.events.back().record(st);
              target = my.events.back();
            } else if (signals && trng() % 16 == 0) {  // a device-signalled wait
              evr::signal_slot& slot = my.slots[which];
              if (!slot) slot = r.pools().signals(static_cast<int>(which % devices)).acquire();
              const evr::signal_ticket ticket = slot.arm();
              sim.launch_kernel(st.native(), std::chrono::microseconds(trng() % 20),
                                [ref = slot.ref()] { evr::sim::signal(ref); });
              target = evr::wait_target(st, ticket);
            }
            const bool cancel = trng() % 10 == 0;
            switch (trng() % 3) {
              case 0: {  // Asio front end; cancellation through a slot, emitted on the strand
                auto handler = [&rec, id](std::error_code ec) { rec.finish(id, ec); };
                if (cancel) {
                  asio::cancellation_signal& sig = my.signals.emplace_back();
                  my.waiter->async_wait(target, asio::bind_cancellation_slot(sig.slot(), handler));
                  const auto type = std::array{asio::cancellation_type::terminal,
                                               asio::cancellation_type::partial,
                                               asio::cancellation_type::total}[trng() % 3];
                  const bool twice = trng() % 4 == 0;
                  rec.cancel_requests.fetch_add(1, std::memory_order_relaxed);
                  asio::post(*my.strand, [&sig, type, twice] {
                    sig.emit(type);
                    if (twice) sig.emit(type);  // harmless
                  });
                } else {
                  my.waiter->async_wait(target, handler);
                }
                if (trng() % 20000 == 0) my.waiter->cancel();  // now and then: all of it
                break;
              }
              case 1: {  // plain callbacks: no per-operation cancellation exists
                if (std::error_code ec = evr::on_complete(
                        r, target, [&rec, id](std::error_code e) { rec.finish(id, e); })) {
                  rec.refuse(id, ec);
                }
                break;
              }
              default: {  // on_complete with a wait_handle, cancelled through it
                evr::wait_handle& h = my.handles[i];
                if (std::error_code ec = evr::on_complete(
                        r, target, [&rec, id](std::error_code e) { rec.finish(id, e); }, h)) {
                  rec.refuse(id, ec);
                } else if (cancel) {
                  rec.cancel_requests.fetch_add(1, std::memory_order_relaxed);
                  if (trng() % 2 == 0) {
                    h.cancel();
                    if (trng() % 4 == 0) h.cancel();  // twice: harmless
                  } else {
                    to_cancel.push_back(&h);
                  }
                } else if (trng() % 2 == 0) {
                  h.reset();  // forgotten: never cancels
                }
                break;
              }
            }
            if (to_cancel.size() >= 4) {  // deferred: some of these have completed by now
              for (evr::wait_handle* h : to_cancel) h->cancel();
              to_cancel.clear();
            }
            started.fetch_add(1, std::memory_order_relaxed);
          }
          for (evr::wait_handle* h : to_cancel) h->cancel();
        });
      }

      // Device 1 prepared while the submitters run, then stop() at the chosen point, with waits
      // surely pending: a few behind a long kernel.
      while (started.load(std::memory_order_relaxed) < std::min(prepare_at, stop_at))
        std::this_thread::sleep_for(50us);
      CHECK_FALSE(r.prepare_device(1));
      while (started.load(std::memory_order_relaxed) < std::min<std::uint64_t>(stop_at, attempts))
        std::this_thread::sleep_for(50us);
      for (int k = 0; k < tail_waits; ++k) {
        evr::stream& st = ss[k % 2];  // one stream of each device
        if (k < 2) sim.launch_kernel(st.native(), 50ms);
        const std::size_t id = attempts + static_cast<std::size_t>(k);
        if (std::error_code ec =
                evr::on_complete(r, st, [&rec, id](std::error_code e) { rec.finish(id, e); })) {
          rec.refuse(id, ec);
        }
      }
      r.stop();
      for (auto& th : submitters) th.join();  // those still submitting are refused from now on
      // Every Asio completion is posted to io: wait for all of them.
      const bool all = wait_until(
          [&] { return rec.finished.load(std::memory_order_acquire) >= attempts + tail_waits; },
          60s);
      CHECK(all);
      work.reset();
      for (auto& th : io_threads) th.join();

      // Exactly once, per wait and in sum.
      std::size_t wrong = 0;
      for (auto& c : rec.calls) {
        const std::uint8_t n = c.load();
        wrong += n != 1;
        grand_lost += n == 0;
        grand_duplicated += n > 1;
      }
      CHECK(wrong == 0);
      CHECK(rec.ok + rec.aborted + rec.errors + rec.refused == attempts + tail_waits);
      CHECK(rec.errors == 0);
      CHECK(rec.aborted >= 2);  // the tail behind the 50 ms kernels outlives any drain (< 3 ms)
      const auto m = r.metrics();
      CHECK(m.in_flight == 0);
      CHECK(m.completed == rec.ok);
      CHECK(m.cancelled == rec.aborted);
      CHECK(m.failed == 0);
      CHECK(m.completed + m.cancelled + m.failed == m.submitted);
      CHECK(m.submitted + rec.refused == attempts + tail_waits);

      // The pool of marker events balances. What is still out after stop() are the markers the
      // GPU may not be past at the abort (of waits aborted at shutdown, or cancelled earlier and
      // kept as ghosts): destroyed with the reactor, never returned; at most one per aborted wait.
      sim.wait_idle();
      const auto ps = r.pools().stats();
      CHECK(ps.created == ps.destroyed + ps.cached + ps.in_use);
      CHECK(ps.in_use <= rec.aborted.load());
      // host_func never uses events; fence and adaptive only past max_pending_fences per device.
      if (strat == evr::strategy::host_func) CHECK(ps.created == 0);
      // Past the stream limit, fence and adaptive record events, or launch the fence kernel where
      // it is ready (device 0 from the start); poll and host_func never load it.
      const auto c_end = sim.counters();
      const std::uint64_t kernels = c_end.fence_kernels_enqueued - c0.fence_kernels_enqueued;
      const bool fences = strat == evr::strategy::fence || strat == evr::strategy::adaptive;
      if (fences && markers.max_fence_streams != 0) {
        if (markers.kernel_fences) {
          CHECK(kernels > 0);
        } else {
          CHECK(ps.created > 0);
        }
      }
      if (!fences || !markers.kernel_fences) CHECK(kernels == 0);
      if (!fences) CHECK(c_end.fence_kernel_loads == c0.fence_kernel_loads);
      grand_fence_kernels += kernels;
      if (fences && markers.max_fence_streams != 0 && !markers.kernel_fences)
        grand_event_markers += ps.created;

      grand_ok += rec.ok;
      grand_aborted += rec.aborted;
      grand_refused += rec.refused;
      grand_cancels += rec.cancel_requests;
      grand_host_passes += m.host_passes;
      grand_host_completions += m.host_completions;
      for (auto& s : state) s.waiter.reset();  // before the reactor (cancels nothing: all done)
    }  // ~reactor: destroys the abandoned markers and the cached ones
    // Every event created this round (the reactor's markers, the users' events) was destroyed.
    const auto c1 = sim.counters();
    CHECK(c1.events_created - c0.events_created == c1.events_destroyed - c0.events_destroyed);
    heap_after.push_back(heap_in_use());
    rss_after.push_back(rss_kib());
  }

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  MESSAGE("soak: " << rounds << " lifetimes, " << rounds * (attempts + tail_waits) << " waits in "
                   << seconds << " s: " << grand_ok << " ok, " << grand_aborted << " aborted ("
                   << grand_cancels << " cancel requests), " << grand_refused
                   << " refused after stop");
  // The one line CI shows (.ci/run greps "soak summary:").
  std::string per_strategy;
  for (const evr::strategy st : evr::test::all_strategies) {
    if (!per_strategy.empty()) per_strategy += ' ';
    per_strategy += evr::to_string(st);
    per_strategy += ' ';
    per_strategy += std::to_string(rounds_of[static_cast<std::size_t>(st)]);
  }
  const std::uint64_t waits = rounds * (attempts + tail_waits);
  std::printf(
      "soak summary: %llu waits, %llu completed exactly once, lost %llu, duplicated %llu, in %.1f "
      "s; %llu reactor lifetimes (%s) x %d threads x %d streams, stop() at random points; "
      "%llu found by the io threads' own passes (%llu passes); past the stream limit %llu fence "
      "kernels, %llu pooled events; seed %llu\n",
      static_cast<unsigned long long>(waits),
      static_cast<unsigned long long>(waits - grand_lost - grand_duplicated),
      static_cast<unsigned long long>(grand_lost),
      static_cast<unsigned long long>(grand_duplicated), seconds,
      static_cast<unsigned long long>(rounds), per_strategy.c_str(), threads, streams,
      static_cast<unsigned long long>(grand_host_completions),
      static_cast<unsigned long long>(grand_host_passes),
      static_cast<unsigned long long>(grand_fence_kernels),
      static_cast<unsigned long long>(grand_event_markers), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  CHECK(grand_lost == 0);
  CHECK(grand_duplicated == 0);
  // Memory: after a warm-up of a quarter of the lifetimes (at least 2), the heap in use after a
  // lifetime may wander but not grow with the number of lifetimes.
  const std::size_t warm = std::max<std::size_t>(2, heap_after.size() / 4);
  const std::uint64_t heap_base = heap_after[warm - 1];
  const std::uint64_t heap_max =
      *std::max_element(heap_after.begin() + static_cast<std::ptrdiff_t>(warm), heap_after.end());
  const std::uint64_t rss_base = rss_after[warm - 1];
  const std::uint64_t rss_max =
      *std::max_element(rss_after.begin() + static_cast<std::ptrdiff_t>(warm), rss_after.end());
  MESSAGE("soak: heap in use after warm-up " << heap_base / 1024 << " KiB, at most "
                                             << heap_max / 1024 << " KiB later; RSS " << rss_base
                                             << " KiB, at most " << rss_max << " KiB later");
  if (heap_base != 0) {
    // Generous: 8 MiB plus 64 KiB per lifetime (fence blocks of aborted fence waits are kept on
    // purpose, a few KiB per lifetime; see docs/architecture.md "Shutdown").
    CHECK(heap_max <= heap_base + (8u << 20) + rounds * (64u << 10));
  }
  if (!evr::test::sanitized()) CHECK(rss_max <= rss_base + 64 * 1024 + rounds * 256);
}
