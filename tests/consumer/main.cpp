// Uses evr the way a user would (tests/consumer/CMakeLists.txt, scripts/ci/check-install.sh): its
// headers (the umbrella header pulls in every public one), its library, and the Asio flavour of the
// target it linked, reached as evr::asio so that this file serves both flavours. One wait on the
// simulated device goes through the Asio front end, one through on_complete. Prints one line and
// exits 0 when both completed with success.
#include <evr/evr.hpp>
#include <evr/sim/device.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <system_error>
#include <thread>

#if !defined(EVR_CONSUMER_FOUND_VERSION)
#define EVR_CONSUMER_FOUND_VERSION "?"  // built by hand (pkg-config)
#define EVR_CONSUMER_HOW "pkg-config"
#endif

int main() {
  evr::sim::device sim;
  evr::asio::io_context io;
  // Before the reactor: should the wait still be pending at the end, its destructor completes it.
  std::atomic<bool> called{false};
  std::error_code plain_ec = evr::errc::invalid_argument;
  evr::reactor reactor(sim);
  evr::gpu_waiter waiter(io.get_executor(), reactor);
  evr::stream stream(sim, 0);

  evr::asio_error_code asio_ec = evr::asio::error::would_block;
  waiter.async_wait(stream, [&](evr::asio_error_code ec) { asio_ec = ec; });
  io.run();  // returns once the wait completed

  const std::error_code refused = evr::on_complete(reactor, stream, [&](std::error_code ec) {
    plain_ec = ec;
    called = true;
  });
  for (int i = 0; i < 10000 && !refused && !called.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));

  const bool ok = !asio_ec && !refused && called.load() && !plain_ec;
#if defined(EVR_ASIO_BOOST)
  const char* flavour = "Boost.Asio";
#else
  const char* flavour = "Asio";
#endif
  std::printf(
      "evr_consumer (%s): evr %s, %s %d.%d.%d: gpu_waiter %s, on_complete %s: %s\n",
      EVR_CONSUMER_HOW, EVR_CONSUMER_FOUND_VERSION, flavour, EVR_ASIO_VERSION / 100000,
      EVR_ASIO_VERSION / 100 % 1000, EVR_ASIO_VERSION % 100,
      asio_ec ? asio_ec.message().c_str() : "done",
      refused ? refused.message().c_str() : (plain_ec ? plain_ec.message().c_str() : "done"),
      ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
