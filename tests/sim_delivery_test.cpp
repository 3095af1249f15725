// Delivery on the simulator: no heap allocation per wait in steady state (every heap allocation
// of the process is counted here), handlers on their own executors and strands.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <evr/callbacks/sender.hpp>
#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"
#include "support/instant_backend.hpp"
#include "support/test_receiver.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::run_until;
using evr::test::wait_until;

// ------------------------------------------------------------------------------------------------
// Counting every heap allocation of the process (for the zero-allocation test).
#if defined(__GNUC__) && !defined(__clang__)
// GCC flags free() of memory from the replaced operator new after inlining; both sides are
// malloc/free here, so the pairing is right.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
std::atomic<std::uint64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

// Waits one after another through `waiter`; returns the heap allocations made by the last
// `measured` of them.
template <typename Waiter>
std::uint64_t allocations_per_waits(asio::io_context& io, Waiter& waiter, evr::stream& st,
                                    int measured) {
  constexpr int warmup = 3000;
  int done = 0;
  std::uint64_t at_start = 0;
  std::function<void(std::error_code)> next;  // allocated once, before measuring
  next = [&](std::error_code ec) {
    REQUIRE_FALSE(ec);
    ++done;
    if (done == warmup) at_start = g_allocations.load();
    if (done < warmup + measured) waiter.async_wait(st, std::ref(next));
  };
  asio::post(io, [&] { waiter.async_wait(st, std::ref(next)); });
  REQUIRE(run_until(
      io, [&] { return done == warmup + measured; }, 60s));
  return g_allocations.load() - at_start;
}

}  // namespace

TEST_CASE("zero heap allocations per wait in steady state (Asio front end, posted delivery)") {
  evr::test::instant_backend device;
  constexpr int measured = 20000;
  for (evr::strategy s : {evr::strategy::poll, evr::strategy::fence}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::reactor r(device, quick_options(s));
    evr::stream st = evr::stream::wrap(device, reinterpret_cast<void*>(0x1000));
    asio::io_context io;
    {
      evr::basic_gpu_waiter<asio::io_context::executor_type> waiter(io.get_executor(), r);
      const std::uint64_t n = allocations_per_waits(io, waiter, st, measured);
      MESSAGE(std::string(evr::to_string(s))
              << ", io_context executor: " << n << " heap allocations in " << measured << " waits");
      CHECK(n == 0);
    }
    {
      // The type-erased executor most code holds (evr::gpu_waiter's): evr posts to the
      // io_context inside it.
      evr::gpu_waiter waiter(io.get_executor(), r);
      const std::uint64_t n = allocations_per_waits(io, waiter, st, measured);
      MESSAGE(std::string(evr::to_string(s))
              << ", any_io_executor: " << n << " heap allocations in " << measured << " waits");
      CHECK(n == 0);
    }
    // (A handler bound to a strand is not free of allocations: when the strand is idle, Asio
    // posts an invoker of its own, allocated from the posting thread's recycling cache, the
    // reactor's, and freed into the io_context thread's: about one per three waits here. Posting
    // through the context's thread instead would recycle it but lose the strand's order when
    // several threads run the context: see docs/architecture.md.)
  }
}

namespace {

// The sender's operation state, built in place again for every wait; its receiver says when it
// has completed (the operation state may be destroyed from then on).
template <class Env>
struct alloc_receiver {
  using receiver_concept = evr::exec::receiver_t;
  std::atomic<int>* done;
  Env env{};
  void set_value() && noexcept { done->fetch_add(1, std::memory_order_release); }
  void set_error(std::error_code) && noexcept { std::abort(); }
  void set_stopped() && noexcept { std::abort(); }
  Env get_env() const noexcept { return env; }
};

template <class Env>
std::uint64_t sender_allocations(evr::reactor& r, evr::stream& st, Env env, int measured) {
  using op_type = evr::exec::connect_result_t<evr::gpu_sender, alloc_receiver<Env>>;
  constexpr int warmup = 3000;
  evr::test::op_slot<op_type> slot;
  std::atomic<int> done{0};
  std::uint64_t at_start = 0;
  for (int i = 0; i < warmup + measured; ++i) {
    if (i == warmup) at_start = g_allocations.load();
    slot.construct([&] {
      return evr::exec::connect(evr::async_wait(r, st), alloc_receiver<Env>{&done, env});
    });
    evr::exec::start(slot.get());
    while (done.load(std::memory_order_acquire) != i + 1) std::this_thread::yield();
  }
  const std::uint64_t n = g_allocations.load() - at_start;
  slot.reset();
  return n;
}

}  // namespace

TEST_CASE("sender: zero heap allocations per wait beyond the operation state") {
  // The operation state (the reactor's operation, the receiver, the stop callback) lives where
  // connect's result is put: here a slot reused for every wait. Nothing else is allocated per
  // wait, with or without a stop callback (the std::stop_source's shared state is made once).
  evr::test::instant_backend device;
  constexpr int measured = 20000;
  for (evr::strategy s : {evr::strategy::poll, evr::strategy::fence}) {
    CAPTURE(std::string(evr::to_string(s)));
    evr::reactor r(device, quick_options(s));
    evr::stream st = evr::stream::wrap(device, reinterpret_cast<void*>(0x1000));
    const std::uint64_t plain = sender_allocations(r, st, evr::exec::empty_env{}, measured);
    std::stop_source source;
    const std::uint64_t stoppable =
        sender_allocations(r, st, evr::test::stop_env{source.get_token()}, measured);
    MESSAGE(std::string(evr::to_string(s))
            << ": " << plain << " heap allocations in " << measured << " waits (no stop token), "
            << stoppable << " (std::stop_token)");
    CHECK(plain == 0);
    CHECK(stoppable == 0);
  }
}

TEST_CASE("gpu_waiter: handlers on another context run there, the waiter's context never run") {
  // A handler is posted to its own executor; it does not depend on the waiter's context.
  evr::test::instant_backend device;
  // Declared before the reactor, so destroyed after its thread ended: after a handler ran, the
  // reactor thread may still be inside the post that woke `runs` (Asio signals after unlocking),
  // and `runs` is not a context evr serves (nothing of evr's waits for it in its destructor).
  asio::io_context never_run, runs;
  std::atomic<int> ran{0};  // before the pool: it may still run a handler (aborted) until destroyed
  asio::thread_pool pool(1);
  evr::reactor r(device, quick_options(evr::strategy::poll));
  evr::stream st = evr::stream::wrap(device, reinterpret_cast<void*>(0x1000));
  evr::basic_gpu_waiter<asio::io_context::executor_type> waiter(never_run.get_executor(), r);
  auto strand = asio::make_strand(runs);
  waiter.async_wait(st, asio::bind_executor(runs, [&](evr::asio_error_code ec) { ran += !ec; }));
  waiter.async_wait(st, asio::bind_executor(strand, [&](evr::asio_error_code ec) {
                      ran += !ec && strand.running_in_this_thread();
                    }));
  waiter.async_wait(st, asio::bind_executor(pool, [&](evr::asio_error_code ec) { ran += !ec; }));
  REQUIRE(run_until(
      runs, [&] { return ran.load() == 3; }, 20s));
  pool.join();
  CHECK(ran.load() == 3);
}

TEST_CASE("gpu_waiter: handlers bound to one strand run in stream order, four threads running") {
  evr::test::instant_backend device;
  evr::reactor r(device, quick_options(evr::strategy::poll));
  evr::stream st = evr::stream::wrap(device, reinterpret_cast<void*>(0x1000));
  asio::io_context io;
  auto strand = asio::make_strand(io);
  evr::gpu_waiter waiter(io.get_executor(), r);
  constexpr int n = 4000;
  std::vector<int> order;  // appended on the strand only
  order.reserve(n);
  std::atomic<int> done{0};
  asio::post(strand, [&] {
    for (int i = 0; i < n; ++i) {
      waiter.async_wait(st, asio::bind_executor(strand, [&, i](evr::asio_error_code ec) {
                          if (!ec) order.push_back(i);
                          ++done;
                        }));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { io.run_for(60s); });
  REQUIRE(wait_until([&] { return done.load() == n; }, 60s));
  io.stop();
  for (auto& t : threads) t.join();
  REQUIRE(order.size() == static_cast<std::size_t>(n));
  CHECK(std::is_sorted(order.begin(), order.end()));
}
