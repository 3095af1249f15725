// evr::async_wait against NVIDIA's stdexec, on the simulated device (scripts/ci/check-stdexec.sh).
// Each check prints one line; any failure prints FAILED and exits 1.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <exec/static_thread_pool.hpp>
#include <exec/when_any.hpp>
#include <stdexec/execution.hpp>

#include <evr/callbacks/stdexec.hpp>
#include <evr/sim/device.hpp>

using namespace std::chrono_literals;
using P = evr::stdexec_protocol;
using clk = std::chrono::steady_clock;

// The sender is a sender to stdexec, with its completion signatures, in any environment.
static_assert(stdexec::sender<evr::stdexec_gpu_sender>);
static_assert(stdexec::sender_in<evr::stdexec_gpu_sender>);
static_assert(stdexec::sender_in<evr::stdexec_gpu_sender, stdexec::env<>>);
static_assert(
    std::is_same_v<stdexec::completion_signatures_of_t<evr::stdexec_gpu_sender, stdexec::env<>>,
                   stdexec::completion_signatures<stdexec::set_value_t(),
                                                  stdexec::set_error_t(std::error_code),
                                                  stdexec::set_stopped_t()>>);

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

double ms_since(clk::time_point t0) {
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

/// One wait of the race: a stop source, what its receiver saw, the operation state.
struct slot;

struct race_receiver {
  using receiver_concept = stdexec::receiver_t;
  slot* s;
  void set_value() && noexcept;
  void set_error(std::error_code) && noexcept;
  void set_stopped() && noexcept;
  // The return type is spelled out: a deduced one is unknown where connect_result_t is formed
  // below, and stdexec would then see no get_env (an empty environment: no stop token).
  stdexec::prop<stdexec::get_stop_token_t, stdexec::inplace_stop_token> get_env() const noexcept;
};

using race_op = stdexec::connect_result_t<evr::stdexec_gpu_sender, race_receiver>;
// A stop callback is registered for each wait (the environment has a stop token).
static_assert(
    stdexec::stoppable_token<stdexec::stop_token_of_t<stdexec::env_of_t<race_receiver>>> &&
    !stdexec::unstoppable_token<stdexec::stop_token_of_t<stdexec::env_of_t<race_receiver>>>);

struct slot {
  stdexec::inplace_stop_source source;
  std::atomic<int> values{0}, errors{0}, stops{0};
  std::atomic<bool> stop_lost{false};  // set_value although stop had been requested by then
  std::atomic<bool> done{false};
  // The operation state, constructed in place (it cannot be moved) and destroyed with the slot.
  alignas(race_op) unsigned char storage[sizeof(race_op)];
  race_op* op = nullptr;
  ~slot() {
    if (op != nullptr) op->~race_op();
  }
};

void race_receiver::set_value() && noexcept {
  if (s->source.stop_requested()) s->stop_lost.store(true);
  s->values.fetch_add(1);
  s->done.store(true, std::memory_order_release);
}
void race_receiver::set_error(std::error_code) && noexcept {
  s->errors.fetch_add(1);
  s->done.store(true, std::memory_order_release);
}
void race_receiver::set_stopped() && noexcept {
  s->stops.fetch_add(1);
  s->done.store(true, std::memory_order_release);
}
stdexec::prop<stdexec::get_stop_token_t, stdexec::inplace_stop_token> race_receiver::get_env()
    const noexcept {
  return stdexec::prop{stdexec::get_stop_token, s->source.get_token()};
}

}  // namespace

int main() {
  std::printf("stdexec commit %s; compiler %s\n", EVR_STDEXEC_COMMIT,
#if defined(__clang__)
              "clang " __clang_version__
#else
              "g++ " __VERSION__
#endif
  );
  evr::sim::device sim;
  evr::reactor r(sim);
  std::vector<evr::stream> streams;
  for (int i = 0; i < 8; ++i) streams.emplace_back(sim, 0);
  evr::stream& s0 = streams[0];

  // 1. sync_wait of one wait behind 2 ms of work.
  {
    (void)sim.launch_kernel(s0.native(), 2ms);
    const auto t0 = clk::now();
    auto res = stdexec::sync_wait(evr::async_wait<P>(r, s0));
    const double ms = ms_since(t0);
    check(res.has_value() && ms >= 1.9, "sync_wait(async_wait(r, s)) after 2 ms of work");
    std::printf("sync_wait(async_wait(r, s)) behind a 2 ms kernel: value after %.2f ms\n", ms);
  }

  // 2. when_all of 64 waits on 8 streams, work of 0-400 us each.
  {
    for (int i = 0; i < 64; ++i)
      (void)sim.launch_kernel(streams[static_cast<std::size_t>(i % 8)].native(),
                              std::chrono::microseconds(100 * (i % 5)));
    const auto before = r.metrics().completed;
    const auto t0 = clk::now();
    auto all = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return stdexec::when_all(evr::async_wait<P>(r, streams[I % 8])...);
    }
    (std::make_index_sequence<64>{});
    auto res = stdexec::sync_wait(std::move(all));
    const double ms = ms_since(t0);
    const auto completed = r.metrics().completed - before;
    check(res.has_value() && completed == 64, "when_all of 64 waits");
    std::printf("when_all of 64 async_waits on 8 streams: value after %.2f ms, %llu completions\n",
                ms, static_cast<unsigned long long>(completed));
  }

  // 3. then chains: the first continuation runs on the reactor thread.
  {
    bool on_reactor = false;
    auto chain = evr::async_wait<P>(r, s0) | stdexec::then([&] {
                   on_reactor = r.running_in_this_thread();
                   return 20;
                 }) |
                 stdexec::then([](int x) { return x + 22; });
    auto [v] = stdexec::sync_wait(std::move(chain)).value();
    check(v == 42 && on_reactor, "then chain");
    std::printf("async_wait | then | then: %d, first then on the reactor thread: %s\n", v,
                on_reactor ? "yes" : "no");
  }

  // 4. continues_on a static_thread_pool: the continuation leaves the reactor thread.
  {
    exec::static_thread_pool pool(2);
    const auto main_id = std::this_thread::get_id();
    (void)sim.launch_kernel(s0.native(), 500us);
    auto moved = evr::async_wait<P>(r, s0) | stdexec::continues_on(pool.get_scheduler()) |
                 stdexec::then([&] {
                   return !r.running_in_this_thread() && std::this_thread::get_id() != main_id;
                 });
    auto [on_pool] = stdexec::sync_wait(std::move(moved)).value();
    check(on_pool, "continues_on(static_thread_pool)");
    std::printf("async_wait | continues_on(static_thread_pool) | then: on a pool thread: %s\n",
                on_pool ? "yes" : "no");
  }

  // 5. Stop through a stop source while the wait is pending (the stream is stalled), and before
  //    start.
  {
    evr::stream& held = streams[1];
    sim.stall(held.native());
    (void)sim.launch_kernel(held.native());
    const auto cancelled_before = r.metrics().cancelled;
    stdexec::inplace_stop_source source;
    auto stoppable = stdexec::write_env(evr::async_wait<P>(r, held),
                                        stdexec::prop{stdexec::get_stop_token, source.get_token()});
    std::thread stopper([&] {
      std::this_thread::sleep_for(5ms);
      source.request_stop();
    });
    const auto t0 = clk::now();
    auto res = stdexec::sync_wait(std::move(stoppable));
    const double ms = ms_since(t0);
    stopper.join();
    const auto cancelled = r.metrics().cancelled - cancelled_before;
    check(!res.has_value() && cancelled == 1, "stop source while pending");
    std::printf(
        "write_env(async_wait, stop token) + request_stop() after 5 ms on a stalled "
        "stream: %s after %.2f ms, reactor cancelled %llu\n",
        res ? "value (WRONG)" : "stopped", ms, static_cast<unsigned long long>(cancelled));

    const auto submitted_before = r.metrics().submitted;
    stdexec::inplace_stop_source early;
    early.request_stop();
    auto res2 = stdexec::sync_wait(stdexec::write_env(
        evr::async_wait<P>(r, held), stdexec::prop{stdexec::get_stop_token, early.get_token()}));
    const auto submitted = r.metrics().submitted - submitted_before;
    check(!res2.has_value() && submitted == 0, "stop before start");
    std::printf("stop requested before start: %s, waits submitted %llu\n",
                res2 ? "value (WRONG)" : "stopped", static_cast<unsigned long long>(submitted));

    // 6. when_any: the stalled wait loses to a ready one and is stopped.
    const auto cancelled_before_any = r.metrics().cancelled;
    auto any = exec::when_any(evr::async_wait<P>(r, held), evr::async_wait<P>(r, s0));
    auto res3 = stdexec::sync_wait(std::move(any));
    check(res3.has_value() && r.metrics().cancelled - cancelled_before_any == 1, "when_any");
    std::printf("exec::when_any(stalled wait, ready wait): %s, the stalled one cancelled: %s\n",
                res3 ? "value" : "stopped (WRONG)",
                r.metrics().cancelled - cancelled_before_any == 1 ? "yes" : "no");

    // 7. when_all with a failing sibling (it throws): the pending wait is stopped, the error comes
    //    through.
    const auto cancelled_before_all = r.metrics().cancelled;
    bool threw = false;
    try {
      (void)stdexec::sync_wait(stdexec::when_all(evr::async_wait<P>(r, held),
                                                 stdexec::just() | stdexec::then([] {
                                                   throw std::system_error(
                                                       std::make_error_code(std::errc::io_error));
                                                 })));
    } catch (const std::system_error& e) {
      threw = e.code() == std::errc::io_error;
    }
    check(threw && r.metrics().cancelled - cancelled_before_all == 1, "when_all error sibling");
    std::printf(
        "when_all(stalled wait, then(throw io_error)): error rethrown %s, the wait "
        "cancelled: %s\n",
        threw ? "yes" : "no", r.metrics().cancelled - cancelled_before_all == 1 ? "yes" : "no");
    sim.resume(held.native());
  }

  // 8. Errors: a stopped reactor refuses, sync_wait rethrows the error code.
  {
    evr::reactor stopped(sim);
    stopped.stop();
    std::error_code got;
    try {
      (void)stdexec::sync_wait(evr::async_wait<P>(stopped, s0));
    } catch (const std::system_error& e) {
      got = e.code();
    }
    check(got == evr::errc::reactor_stopped, "refusal as set_error");
    std::printf("async_wait on a stopped reactor: set_error(%s)\n", got.message().c_str());
  }

  // 9. Stop racing completion: 20 000 waits, each stopped from another thread at a random moment
  //    around its completion (the submitter stays at most 4 waits ahead of the stopper, which
  //    spins 0-15 us before each stop); every wait completes exactly once.
  {
    constexpr int waits = 20000;
    std::vector<slot> slots(waits);
    std::atomic<int> started{0}, stopped_upto{0};
    std::thread stopper([&] {
      std::mt19937 rng(7);
      for (int i = 0; i < waits; ++i) {
        while (started.load(std::memory_order_acquire) <= i) std::this_thread::yield();
        const auto until = clk::now() + std::chrono::microseconds(rng() % 16);
        while (clk::now() < until) {
        }
        slots[static_cast<std::size_t>(i)].source.request_stop();
        stopped_upto.store(i + 1, std::memory_order_release);
      }
    });
    const auto t0 = clk::now();
    std::mt19937 rng(11);
    for (int i = 0; i < waits; ++i) {
      slot& sl = slots[static_cast<std::size_t>(i)];
      evr::stream& st = streams[static_cast<std::size_t>(i % 8)];
      while (i - stopped_upto.load(std::memory_order_acquire) > 4) std::this_thread::yield();
      if (i % 2 == 0) (void)sim.launch_kernel(st.native(), std::chrono::microseconds(rng() % 12));
      sl.op = ::new (sl.storage)
          race_op(stdexec::connect(evr::async_wait<P>(r, st), race_receiver{&sl}));
      stdexec::start(*sl.op);
      started.store(i + 1, std::memory_order_release);
    }
    stopper.join();
    int values = 0, stops = 0, lost = 0, bad = 0;
    for (auto& sl : slots) {
      while (!sl.done.load(std::memory_order_acquire)) std::this_thread::yield();
      values += sl.values.load();
      stops += sl.stops.load();
      lost += sl.stop_lost.load() ? 1 : 0;
      if (sl.values.load() + sl.errors.load() + sl.stops.load() != 1 || sl.errors.load() != 0)
        ++bad;
    }
    std::this_thread::sleep_for(10ms);  // a second completion would show up here
    for (auto& sl : slots)
      if (sl.values.load() + sl.errors.load() + sl.stops.load() != 1) ++bad;
    check(bad == 0 && values + stops == waits && stops > 0, "stop racing completion");
    std::printf(
        "stop racing completion: %d waits in %.0f ms: %d stopped, %d values (%d of them with the "
        "stop request lost to the completion), %d not exactly once\n",
        waits, ms_since(t0), stops, values, lost, bad);
  }

  sim.wait_idle();
  const auto m = r.metrics();
  std::printf(
      "reactor: submitted %llu, completed %llu, cancelled %llu, failed %llu\n",
      static_cast<unsigned long long>(m.submitted), static_cast<unsigned long long>(m.completed),
      static_cast<unsigned long long>(m.cancelled), static_cast<unsigned long long>(m.failed));
  std::printf("%s\n", failures == 0 ? "stdexec check: OK" : "stdexec check: FAILED");
  return failures == 0 ? 0 : 1;
}
