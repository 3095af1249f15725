// Posted completions of one delivery batch bound for one io_context are queued together
// (callbacks/include/evr/callbacks/detail/io_context_posts.hpp). What must not change with that:
// each executor's order, the handlers' distribution over a context's threads, a context destroyed
// from an inline handler of the same batch, and nothing lost.
//
// A batch is made deterministic by holding the reactor: an inline handler blocks its thread
// while the waits are submitted on a device where every marker is already done; once released,
// the reactor's next sweep retires them all and delivers them in one batch.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <evr/evr.hpp>

#include "support/asio.hpp"
#include "support/helpers.hpp"
#include "support/instant_backend.hpp"

using namespace std::chrono_literals;
using evr::test::quick_options;
using evr::test::wait_until;

namespace {

/// Blocks the reactor thread inside an inline handler until release() (or destruction).
class reactor_hold {
 public:
  reactor_hold(evr::reactor& r, const evr::stream& st) {
    // Shared with the handler: it still reads the flag after release() returns.
    REQUIRE_FALSE(evr::on_complete(r, st, [s = s_](std::error_code) {
      std::unique_lock<std::mutex> l(s->m);
      s->held = true;
      s->cv.notify_all();
      s->cv.wait(l, [&] { return s->released; });
    }));
    std::unique_lock<std::mutex> l(s_->m);
    REQUIRE(s_->cv.wait_for(l, 20s, [&] { return s_->held; }));
  }
  ~reactor_hold() { release(); }
  reactor_hold(const reactor_hold&) = delete;
  reactor_hold& operator=(const reactor_hold&) = delete;
  void release() {
    {
      std::lock_guard<std::mutex> l(s_->m);
      s_->released = true;
    }
    s_->cv.notify_all();
  }

 private:
  struct state {
    std::mutex m;
    std::condition_variable cv;
    bool held = false, released = false;
  };
  std::shared_ptr<state> s_ = std::make_shared<state>();
};

evr::stream instant_stream(evr::test::instant_backend& device) {
  return evr::stream::wrap(device, reinterpret_cast<void*>(0x1000));
}

}  // namespace

TEST_CASE(
    "batched posts: an inline handler runs after the batch's earlier completions were posted") {
  evr::test::instant_backend device;
  // Before the reactor: its destructor runs a pending inline handler, which uses these.
  asio::io_context io;
  std::vector<std::string> log;  // the reactor thread appends, then (after) this thread reads
  std::atomic<bool> inline_ran{false};
  evr::reactor r(device, quick_options(evr::strategy::poll));
  evr::stream st = instant_stream(device);
  evr::gpu_waiter waiter(io.get_executor(), r);
  {
    reactor_hold hold(r, st);
    waiter.async_wait(st, [&](evr::asio_error_code ec) { log.push_back(ec ? "A failed" : "A"); });
    REQUIRE_FALSE(evr::on_complete(r, st, [&](std::error_code) {
      // On the reactor thread, inside the batch: A must be in the context's queue by now (held
      // posts are flushed before user code runs), C not (it completes after this handler).
      log.push_back("B");
      io.poll();
      log.push_back("B done");
      inline_ran = true;
    }));
    waiter.async_wait(st, [&](evr::asio_error_code ec) { log.push_back(ec ? "C failed" : "C"); });
  }
  REQUIRE(wait_until([&] { return inline_ran.load(); }));
  REQUIRE(evr::test::run_until(io, [&] { return log.size() == 4; }));
  CHECK(log == std::vector<std::string>{"B", "A", "B done", "C"});
}

TEST_CASE("batched posts: each executor's handlers run in the batch's order") {
  // Handlers bound to the context and to a strand of it, interleaved in one batch, one thread
  // running the context. Each executor's handlers run in the order their waits completed. (Across
  // the two there is no order to keep, in Asio as here: an idle strand's first handler brings
  // the strand's whole queue with it.)
  evr::test::instant_backend device;
  evr::reactor r(device, quick_options(evr::strategy::poll));
  evr::stream st = instant_stream(device);
  asio::io_context io;
  auto strand = asio::make_strand(io);
  evr::gpu_waiter waiter(io.get_executor(), r);
  constexpr int n = 60;
  std::vector<int> plain, stranded;  // appended on the one thread running io
  {
    reactor_hold hold(r, st);
    for (int i = 0; i < n; ++i) {
      if (i % 3 == 1) {
        waiter.async_wait(st, asio::bind_executor(strand, [&stranded, i](evr::asio_error_code ec) {
                            if (!ec) stranded.push_back(i);
                          }));
      } else {
        waiter.async_wait(st, [&plain, i](evr::asio_error_code ec) {
          if (!ec) plain.push_back(i);
        });
      }
    }
  }
  REQUIRE(evr::test::run_until(io, [&] { return plain.size() + stranded.size() == n; }));
  std::vector<int> expected_plain, expected_stranded;
  for (int i = 0; i < n; ++i) (i % 3 == 1 ? expected_stranded : expected_plain).push_back(i);
  CHECK(plain == expected_plain);
  CHECK(stranded == expected_stranded);
}

TEST_CASE("batched posts: one batch's handlers are shared by the threads running the context") {
  // Each completion is its own operation in the context's queue: a second thread takes the second
  // handler while the first still runs (one function running the whole batch would not).
  evr::test::instant_backend device;
  evr::reactor r(device, quick_options(evr::strategy::poll));
  evr::stream st = instant_stream(device);
  asio::io_context io;
  evr::gpu_waiter waiter(io.get_executor(), r);
  std::mutex m;
  std::condition_variable cv;
  int entered = 0;
  bool both_at_once = false;
  auto handler = [&](evr::asio_error_code) {
    std::unique_lock<std::mutex> l(m);
    ++entered;
    cv.notify_all();
    if (cv.wait_for(l, 10s, [&] { return entered == 2; })) both_at_once = true;
  };
  auto work = asio::make_work_guard(io);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) threads.emplace_back([&] { io.run(); });
  {
    reactor_hold hold(r, st);
    waiter.async_wait(st, handler);
    waiter.async_wait(st, handler);
  }
  const bool both_entered = wait_until([&] {
    std::lock_guard<std::mutex> l(m);
    return entered == 2;
  });
  work.reset();
  for (auto& t : threads) t.join();
  CHECK(both_entered);
  CHECK(both_at_once);
}

TEST_CASE("batched posts: an inline handler destroys a context whose completions the batch holds") {
  // The batch: waits bound for `doomed`, then an inline handler that destroys it, then waits
  // bound for `lives`. The first were posted into `doomed` before the inline handler ran and are
  // destroyed with it, unrun; nothing is posted into it afterwards (ASan: no use after free).
  evr::test::instant_backend device;
  std::atomic<bool> destroyed{false};  // before the reactor: its destructor may run the handler
  evr::reactor r(device, quick_options(evr::strategy::poll));
  evr::stream st = instant_stream(device);
  auto doomed = std::make_unique<asio::io_context>();
  auto doomed_waiter = std::make_unique<evr::gpu_waiter>(doomed->get_executor(), r);
  asio::io_context lives;
  evr::gpu_waiter waiter(lives.get_executor(), r);
  auto token = std::make_shared<int>(0);
  std::atomic<int> doomed_ran{0}, lived{0};
  constexpr int n = 16;
  {
    reactor_hold hold(r, st);
    for (int i = 0; i < n; ++i)
      doomed_waiter->async_wait(st, [&, token](evr::asio_error_code) { ++doomed_ran; });
    // The handler owns the doomed waiter and context (it may run in the reactor's destructor).
    REQUIRE_FALSE(evr::on_complete(r, st,
                                   [&destroyed, doomed_waiter = std::move(doomed_waiter),
                                    doomed = std::move(doomed)](std::error_code) mutable {
                                     doomed_waiter.reset();
                                     doomed.reset();
                                     destroyed = true;
                                   }));
    for (int i = 0; i < n; ++i)
      waiter.async_wait(st, [&](evr::asio_error_code ec) { lived += !ec; });
  }
  REQUIRE(wait_until([&] { return destroyed.load(); }));
  REQUIRE(evr::test::run_until(lives, [&] { return lived.load() == n; }));
  CHECK(doomed_ran.load() == 0);
  CHECK(token.use_count() == 1);  // every handler bound for `doomed` was destroyed
}

TEST_CASE("batched posts: many contexts in one batch, each handler once") {
  // More contexts than a batch holds at once (8): the holder posts what it has and goes on.
  evr::test::instant_backend device;
  evr::reactor r(device, quick_options(evr::strategy::poll));
  evr::stream st = instant_stream(device);
  constexpr int contexts = 20, per_context = 5;
  std::vector<std::unique_ptr<asio::io_context>> ios;
  std::vector<std::unique_ptr<evr::gpu_waiter>> waiters;
  for (int c = 0; c < contexts; ++c) {
    ios.push_back(std::make_unique<asio::io_context>());
    waiters.push_back(std::make_unique<evr::gpu_waiter>(ios.back()->get_executor(), r));
  }
  std::vector<std::atomic<int>> ran(contexts * per_context);
  {
    reactor_hold hold(r, st);
    for (int i = 0; i < per_context; ++i) {
      for (int c = 0; c < contexts; ++c) {
        const int k = c * per_context + i;
        waiters[static_cast<std::size_t>(c)]->async_wait(
            st, [&ran, k](evr::asio_error_code ec) { ran[static_cast<std::size_t>(k)] += !ec; });
      }
    }
  }
  for (int c = 0; c < contexts; ++c) {
    REQUIRE(evr::test::run_until(*ios[static_cast<std::size_t>(c)], [&] {
      for (int i = 0; i < per_context; ++i) {
        if (ran[static_cast<std::size_t>(c * per_context + i)].load() == 0) return false;
      }
      return true;
    }));
  }
  for (auto& x : ran) CHECK(x.load() == 1);
}
