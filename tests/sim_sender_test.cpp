// evr::async_wait as a P2300 sender (evr/callbacks/sender.hpp), on the simulated device, with a
// receiver of this file's own (no P2300 library): the protocol checked at compile time, where and
// how each completion arrives, stop requests before start / while pending / after completion, and
// exactly one completion per wait when stop requests race completions — 10^5 waits, the operation
// state destroyed by its own receiver (run under ASan and TSan: scripts/test.sh asan -R evr_tests).
// The zero-allocation check is in sim_reactor_test.cpp (it owns the process's counting new).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <new>
#include <random>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include <evr/callbacks/sender.hpp>
#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/helpers.hpp"
#include "support/test_receiver.hpp"

using namespace std::chrono_literals;
using evr::test::outcome;
using evr::test::quick_options;
using evr::test::stop_env;
using evr::test::test_receiver;
using evr::test::wait_until;

namespace ex = evr::exec;

// ---- the protocol, at compile time --------------------------------------------------------------

using plain_receiver = test_receiver<ex::empty_env>;
using stoppable_receiver = test_receiver<stop_env>;
using plain_op = ex::connect_result_t<evr::gpu_sender, plain_receiver>;
using stoppable_op = ex::connect_result_t<evr::gpu_sender, stoppable_receiver>;

static_assert(ex::sender<evr::gpu_sender>);
static_assert(ex::sender<const evr::gpu_sender&>);
static_assert(std::is_nothrow_copy_constructible_v<evr::gpu_sender>);
static_assert(ex::receiver<plain_receiver> && ex::receiver<stoppable_receiver>);
static_assert(ex::sender_to<evr::gpu_sender, plain_receiver>);
static_assert(ex::sender_to<evr::gpu_sender, stoppable_receiver>);
static_assert(ex::operation_state<plain_op> && ex::operation_state<stoppable_op>);
static_assert(
    std::is_same_v<evr::gpu_sender::completion_signatures,
                   ex::completion_signatures<ex::set_value_t(), ex::set_error_t(std::error_code),
                                             ex::set_stopped_t()>>);
static_assert(
    std::is_same_v<
        decltype(evr::gpu_sender::get_completion_signatures<evr::gpu_sender, ex::empty_env>()),
        evr::gpu_sender::completion_signatures>);
static_assert(std::is_same_v<ex::env_of_t<evr::gpu_sender>, ex::empty_env>);
// Operation states stay where they were made.
static_assert(!std::is_copy_constructible_v<plain_op> && !std::is_move_constructible_v<plain_op>);
static_assert(!std::is_copy_assignable_v<plain_op> && !std::is_move_assignable_v<plain_op>);
static_assert(noexcept(std::declval<plain_op&>().start()));
// Stop tokens: none in the environment is unstoppable; std::stop_token is stoppable.
static_assert(ex::unstoppable_token<ex::stop_token_of_t<ex::empty_env>>);
static_assert(ex::stoppable_token<ex::stop_token_of_t<stop_env>> &&
              !ex::unstoppable_token<ex::stop_token_of_t<stop_env>>);
// A receiver that cannot take an error_code is not connectable.
struct value_only_receiver {
  using receiver_concept = ex::receiver_t;
  void set_value() && noexcept {}
  void set_stopped() && noexcept {}
};
static_assert(!ex::sender_to<evr::gpu_sender, value_only_receiver>);
// Without a stop callback the operation state is the reactor's operation, the receiver, the
// reactor pointer and the target: nothing else.
static_assert(sizeof(plain_op) <= sizeof(evr::detail::wait_op) + sizeof(plain_receiver) +
                                      sizeof(void*) + sizeof(evr::wait_target));

// ---- behaviour ----------------------------------------------------------------------------------

TEST_CASE("sender: set_value on the reactor thread, for the work queued when start() is called") {
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    // Before the reactor: its destructor completes a pending wait (the operation state) into o.
    outcome o;
    evr::test::op_slot<plain_op> op;
    evr::reactor r(sim, quick_options(s));
    o.reactor = &r;
    evr::stream st(sim, 0);
    auto sndr = evr::async_wait(r, st);  // lazy: no marker yet
    REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
    op.construct([&] { return ex::connect(sndr, plain_receiver{&o}); });
    ex::start(op.get());  // the marker goes behind the kernel
    std::this_thread::sleep_for(5ms);
    CHECK(o.calls() == 0);
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return o.calls() == 1; }));
    CHECK(o.values.load() == 1);
    CHECK(o.on_reactor.load());
    CHECK(r.metrics().completed == 1);
  }
}

TEST_CASE("sender: the sender is a value; each connection is a wait of its own") {
  evr::sim::device sim;
  // Before the reactor: its destructor completes pending waits (the operation states) into these.
  outcome a, b;
  evr::test::op_slot<plain_op> op1, op2;
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::stream st(sim, 0);
  const evr::gpu_sender sndr = evr::async_wait(r, st);
  op1.construct([&] { return ex::connect(sndr, plain_receiver{&a}); });
  op2.construct([&] { return sndr.connect(plain_receiver{&b}); });
  ex::start(op1.get());
  ex::start(op2.get());
  REQUIRE(wait_until([&] { return a.calls() == 1 && b.calls() == 1; }));
  CHECK(a.values.load() == 1);
  CHECK(b.values.load() == 1);
  CHECK(r.metrics().completed == 2);
}

TEST_CASE("sender: a refused wait completes inline in start() with set_error") {
  evr::sim::device sim;
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::stream st(sim, 0);
  r.stop();
  outcome o(&r), so(&r);
  std::stop_source source;
  evr::test::op_slot<plain_op> op;
  op.construct([&] { return ex::connect(evr::async_wait(r, st), plain_receiver{&o}); });
  ex::start(op.get());
  CHECK(o.calls() == 1);  // before start() returned
  CHECK(o.errors.load() == 1);
  CHECK(o.error == evr::errc::reactor_stopped);
  CHECK_FALSE(o.on_reactor.load());
  evr::test::op_slot<stoppable_op> sop;  // with a stop callback registered and removed again
  sop.construct([&] {
    return ex::connect(evr::async_wait(r, st),
                       stoppable_receiver{&so, stop_env{source.get_token()}});
  });
  ex::start(sop.get());
  CHECK(so.errors.load() == 1);
  CHECK(so.error == evr::errc::reactor_stopped);
  // An empty target is refused the same way.
  outcome e;
  evr::test::op_slot<plain_op> eop;
  evr::reactor running(sim, quick_options(evr::strategy::poll));
  eop.construct([&] {
    return ex::connect(evr::async_wait(running, evr::wait_target{}), plain_receiver{&e});
  });
  ex::start(eop.get());
  CHECK(e.error == evr::errc::empty_handle);
}

TEST_CASE(
    "sender: stop requested before start completes inline with set_stopped, submits nothing") {
  evr::sim::device sim;
  evr::reactor r(sim, quick_options(evr::strategy::poll));
  evr::stream st(sim, 0);
  std::stop_source source;
  source.request_stop();
  outcome o;
  evr::test::op_slot<stoppable_op> op;
  op.construct([&] {
    return ex::connect(evr::async_wait(r, st),
                       stoppable_receiver{&o, stop_env{source.get_token()}});
  });
  ex::start(op.get());
  CHECK(o.calls() == 1);
  CHECK(o.stops.load() == 1);
  std::this_thread::sleep_for(5ms);
  const auto m = r.metrics();
  CHECK(m.submitted == 0);
  CHECK(m.rejected == 0);
}

TEST_CASE("sender: stop while pending cancels the wait: set_stopped on the reactor thread") {
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    // Before the reactor: its destructor completes pending waits (the operation states) into these.
    std::stop_source source, other;
    outcome o, bystander;
    evr::test::op_slot<stoppable_op> op, op2;
    evr::reactor r(sim, quick_options(s));
    o.reactor = bystander.reactor = &r;
    evr::stream st(sim, 0);
    REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});  // holds the stream (manual)
    op.construct([&] {
      return ex::connect(evr::async_wait(r, st),
                         stoppable_receiver{&o, stop_env{source.get_token()}});
    });
    op2.construct([&] {
      return ex::connect(evr::async_wait(r, st),
                         stoppable_receiver{&bystander, stop_env{other.get_token()}});
    });
    ex::start(op.get());
    ex::start(op2.get());
    std::this_thread::sleep_for(2ms);
    CHECK(o.calls() == 0);
    CHECK(source.request_stop());
    REQUIRE(wait_until([&] { return o.calls() == 1; }));
    CHECK(o.stops.load() == 1);
    CHECK(o.on_reactor.load());
    CHECK(bystander.calls() == 0);  // only the stopped wait was touched
    sim.run_until_blocked();
    REQUIRE(wait_until([&] { return bystander.calls() == 1; }));
    CHECK(bystander.values.load() == 1);
    // After completion a stop request reaches nothing (the callback is gone).
    CHECK(other.request_stop());
    std::this_thread::sleep_for(2ms);
    CHECK(bystander.calls() == 1);
    CHECK(o.calls() == 1);
    CHECK(r.metrics().cancelled == 1);
  }
}

namespace {
/// Requests stop on `source` when its wait completes (on the reactor thread), as when_all /
/// when_any do for the siblings of a completed sender.
struct stopping_receiver {
  using receiver_concept = ex::receiver_t;
  std::stop_source* source;
  std::atomic<int>* done;
  void set_value() && noexcept {
    source->request_stop();
    done->fetch_add(1);
  }
  void set_error(std::error_code) && noexcept { done->fetch_add(1); }
  void set_stopped() && noexcept { done->fetch_add(1); }
};
}  // namespace

TEST_CASE("sender: a stop requested on the reactor thread by another completion cancels a wait") {
  for (evr::strategy s : evr::test::all_strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
    // Before the reactor: its destructor completes pending waits (the operation states) into these.
    std::stop_source source;
    outcome o;
    std::atomic<int> done{0};
    evr::test::op_slot<stoppable_op> pending;
    evr::test::op_slot<ex::connect_result_t<evr::gpu_sender, stopping_receiver>> stopper;
    evr::reactor r(sim, quick_options(s));
    o.reactor = &r;
    evr::stream held(sim, 0), quick(sim, 0);
    REQUIRE(sim.launch_kernel(held.native()) == std::error_code{});
    pending.construct([&] {
      return ex::connect(evr::async_wait(r, held),
                         stoppable_receiver{&o, stop_env{source.get_token()}});
    });
    stopper.construct([&] {
      return ex::connect(evr::async_wait(r, quick), stopping_receiver{&source, &done});
    });
    ex::start(pending.get());
    ex::start(stopper.get());
    sim.step(quick.native());  // its marker: the stopper completes and requests the stop
    REQUIRE(wait_until([&] { return o.calls() == 1; }));
    CHECK(done.load() == 1);
    CHECK(o.stops.load() == 1);
    CHECK(o.on_reactor.load());
    sim.run_until_blocked();
  }
}

TEST_CASE("sender: a reactor shutting down aborts a pending wait with set_error, not set_stopped") {
  evr::sim::device sim(evr::sim::options{.devices = 1, .mode = evr::sim::run_mode::manual});
  evr::stream st(sim, 0);
  REQUIRE(sim.launch_kernel(st.native()) == std::error_code{});
  std::stop_source source;  // never asked to stop
  outcome o, so;
  evr::test::op_slot<plain_op> op;
  evr::test::op_slot<stoppable_op> sop;
  {
    auto opts = quick_options(evr::strategy::poll);
    opts.shutdown_drain = 1ms;
    evr::reactor r(sim, opts);
    op.construct([&] { return ex::connect(evr::async_wait(r, st), plain_receiver{&o}); });
    sop.construct([&] {
      return ex::connect(evr::async_wait(r, st),
                         stoppable_receiver{&so, stop_env{source.get_token()}});
    });
    ex::start(op.get());
    ex::start(sop.get());
  }
  CHECK(o.errors.load() == 1);
  CHECK(o.error == evr::errc::operation_aborted);
  CHECK(so.errors.load() == 1);
  CHECK(so.error == evr::errc::operation_aborted);
  CHECK(source.request_stop());  // nothing registered any more
  sim.run_until_blocked();
}

TEST_CASE("fault: sender: a device fault fails the wait with the CUDA error") {
  evr::sim::device sim;
  // Before the reactor: its destructor completes a pending wait (the operation state) into o.
  outcome o;
  evr::test::op_slot<plain_op> op;
  evr::reactor r(sim, quick_options(evr::strategy::fence));
  evr::stream st(sim, 0);
  REQUIRE(sim.launch_faulting_kernel(st.native()) == std::error_code{});
  op.construct([&] { return ex::connect(evr::async_wait(r, st), plain_receiver{&o}); });
  ex::start(op.get());
  REQUIRE(wait_until([&] { return o.calls() == 1; }));
  CHECK(o.errors.load() == 1);
  CHECK(o.error.category() == evr::cuda_category());
}

namespace {

/// A receiver that destroys its own operation state (heap-allocated) when it completes, as a
/// P2300 algorithm may; `slot` outlives it.
struct race_slot {
  std::stop_source source;
  std::atomic<int> values{0}, errors{0}, stops{0};
  std::atomic<bool> stop_lost{false};  ///< set_value although stop had been requested by then
  std::atomic<bool> done{false};
};

void destroy_op(void* op) noexcept;  // deletes a self_destroying_op (defined below)

struct self_destroying_receiver {
  using receiver_concept = ex::receiver_t;
  race_slot* slot;
  void** op;  ///< where the operation state's owner keeps it (a self_destroying_op*)

  void finish(std::atomic<int>& counter) noexcept {
    race_slot* s = slot;
    void* o = *op;
    counter.fetch_add(1, std::memory_order_relaxed);
    destroy_op(o);  // destroys this receiver too: nothing of *this is touched below
    s->done.store(true, std::memory_order_release);
  }
  void set_value() && noexcept {
    // The stop request came while the reactor was completing the wait (or just before, after
    // its CAS lost): the race this test is about.
    if (slot->source.stop_requested()) slot->stop_lost.store(true, std::memory_order_relaxed);
    finish(slot->values);
  }
  void set_error(std::error_code) && noexcept { finish(slot->errors); }
  void set_stopped() && noexcept { finish(slot->stops); }
  stop_env get_env() const noexcept { return stop_env{slot->source.get_token()}; }
};

using self_destroying_op = ex::connect_result_t<evr::gpu_sender, self_destroying_receiver>;

void destroy_op(void* op) noexcept { delete static_cast<self_destroying_op*>(op); }

}  // namespace

TEST_CASE(
    "sender: stop racing completion, 10^5 waits: exactly one completion each, op freed by it") {
  // Every wait is stopped from two other threads at a random moment around its completion (the
  // submitter stays at most a few waits ahead of them, and a random spin of 0-15 us before each
  // stop spreads them over the wait's life), and its receiver deletes the operation state. ASan
  // sees any touch of a freed operation state (the stop callback's, the reactor's, start()'s);
  // TSan any unordered one. Counted: stops that won (set_stopped), and stops that came while the
  // reactor was completing the wait and lost (set_value with stop already requested).
  constexpr int total = 100000;
  constexpr int batch = 2500;
  const evr::strategy strategies[] = {evr::strategy::poll, evr::strategy::fence,
                                      evr::strategy::adaptive, evr::strategy::host_func};
  int stopped_total = 0, values_total = 0, lost_total = 0;
  for (evr::strategy s : strategies) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::sim::device sim;
    // Before the reactor: its destructor completes pending waits into these (refilled per batch).
    std::vector<race_slot> slots;
    std::vector<void*> ops;
    evr::reactor r(sim, quick_options(s));
    std::vector<evr::stream> streams;
    for (int i = 0; i < 8; ++i) streams.emplace_back(sim, 0);
    const int waits = total / 4;
    int stopped = 0, values = 0, lost = 0;
    std::mt19937 rng(static_cast<unsigned>(s) + 1);
    for (int base = 0; base < waits; base += batch) {
      slots = std::vector<race_slot>(batch);
      ops.assign(batch, nullptr);
      std::atomic<int> started{0}, stopped_upto{0};
      // Two stoppers per batch, each stopping every slot (one of them may find it stopped).
      auto stopper = [&](unsigned seed, bool paces) {
        std::mt19937 local(seed);
        for (int i = 0; i < batch; ++i) {
          while (started.load(std::memory_order_acquire) <= i) std::this_thread::yield();
          const auto until =
              std::chrono::steady_clock::now() + std::chrono::microseconds(local() % 16);
          while (std::chrono::steady_clock::now() < until) {
          }
          slots[static_cast<std::size_t>(i)].source.request_stop();
          if (paces) stopped_upto.store(i + 1, std::memory_order_release);
        }
      };
      std::thread a(stopper, rng(), true), b(stopper, rng(), false);
      for (int i = 0; i < batch; ++i) {
        const auto k = static_cast<std::size_t>(i);
        evr::stream& st = streams[k % streams.size()];
        while (i - stopped_upto.load(std::memory_order_acquire) > 4) std::this_thread::yield();
        if (i % 2 == 0)
          REQUIRE(sim.launch_kernel(st.native(), std::chrono::microseconds(rng() % 12)) ==
                  std::error_code{});
        auto* op = new self_destroying_op(
            ex::connect(evr::async_wait(r, st), self_destroying_receiver{&slots[k], &ops[k]}));
        ops[k] = op;
        ex::start(*op);  // may already have completed (and freed it) when start() returns
        started.store(i + 1, std::memory_order_release);
      }
      a.join();
      b.join();
      REQUIRE(wait_until([&] {
        for (auto& sl : slots)
          if (!sl.done.load(std::memory_order_acquire)) return false;
        return true;
      }));
      for (auto& sl : slots) {
        REQUIRE(sl.values.load() + sl.errors.load() + sl.stops.load() == 1);
        REQUIRE(sl.errors.load() == 0);
        stopped += sl.stops.load();
        values += sl.values.load();
        lost += sl.stop_lost.load() ? 1 : 0;
      }
    }
    std::this_thread::sleep_for(5ms);  // a second completion would have freed twice by now
    const auto m = r.metrics();
    CHECK(m.in_flight == 0);
    // Every stop that won cancelled a wait the reactor had (a stop before start submits none).
    CHECK(m.cancelled <= static_cast<std::uint64_t>(stopped));
    CHECK(m.completed == static_cast<std::uint64_t>(values));
    MESSAGE(std::string(evr::to_string(s))
            << ": " << waits << " waits: " << stopped << " stopped (" << m.cancelled
            << " of them cancelled in the reactor, the rest before start), " << values
            << " values, of which " << lost << " with the stop request lost to the completion");
    stopped_total += stopped;
    values_total += values;
    lost_total += lost;
  }
  CHECK(stopped_total + values_total == total);
  CHECK(stopped_total > 0);
  CHECK(values_total > 0);
  CHECK(lost_total > 0);  // stop requests did land while waits were completing
  MESSAGE(total << " waits: " << stopped_total << " stopped, " << values_total << " values ("
                << lost_total << " of them with a stop request that lost the race)");
}
