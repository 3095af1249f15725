// evr/reactor/delivery.hpp — how a completed wait reaches its handler (gpu_waiter::set_delivery).
#pragma once

namespace evr {

/// How a completed wait reaches its handler.
enum class delivery : unsigned char {
  post,               ///< to the handler's associated executor (asio::post): the default
  inline_on_reactor,  ///< run on the reactor thread: lowest latency; the handler must be short
                      ///< and must never block (it delays every other completion)
};

}  // namespace evr
