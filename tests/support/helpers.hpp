// Small helpers shared by the reactor tests.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <system_error>
#include <thread>

#include <evr/callbacks/detail/asio_forward.hpp>  // evr::asio: the flavour under test (io_context)
#include <evr/device/error.hpp>
#include <evr/reactor/options.hpp>

namespace evr::test {

/// The error an evr::error thrown by f carries ({} when nothing was thrown); `what` gets what().
template <class F>
std::error_code thrown(F&& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const evr::error& e) {
    if (what) *what = e.what();
    return e.code();
  }
  return {};
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// Runs `io` until `done()` or `timeout`; returns done(). Never hangs a test.
inline bool run_until(asio::io_context& io, const std::function<bool()>& done,
                      std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(std::chrono::milliseconds(1));
  }
  return done();
}

/// Spins (with sleeps) until `done()` or `timeout`.
inline bool wait_until(const std::function<bool()>& done,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  return done();
}

/// Options for `s` that keep tests quick (short probes and drains).
inline reactor_options quick_options(strategy s) {
  reactor_options o;
  o.strategy = s;
  o.fault_probe_interval = std::chrono::milliseconds(2);
  o.doorbell_after = std::chrono::milliseconds(2);
  o.shutdown_drain = std::chrono::milliseconds(200);
  return o;
}

inline constexpr strategy all_strategies[] = {strategy::poll, strategy::fence, strategy::host_func,
                                              strategy::adaptive};

/// True in sanitizer builds, where stress tests run smaller.
constexpr bool sanitized() {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

}  // namespace evr::test
