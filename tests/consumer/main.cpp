// Uses an installed evr: its headers (the umbrella header pulls in every public one), its archive
// (an error category lives in it) and the Asio headers its package config finds again. Prints one
// line and exits 0.
#include <evr/evr.hpp>

#include <asio/version.hpp>

#include <cstdio>
#include <system_error>

int main() {
  const std::error_code ec = evr::make_error_code(evr::errc::reactor_stopped);
  std::printf("evr_consumer: evr %s (Asio %d.%d.%d): %s error %d: %s\n", EVR_CONSUMER_FOUND_VERSION,
              ASIO_VERSION / 100000, ASIO_VERSION / 100 % 1000, ASIO_VERSION % 100,
              ec.category().name(), ec.value(), ec.message().c_str());
  return ec ? 0 : 1;
}
