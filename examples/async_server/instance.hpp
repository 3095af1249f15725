// One running server: its reactor (evr mode), io_contexts and io threads, lane pools, metrics and
// the server itself, in the order they must be torn down. evr, hostfunc and poll modes run one
// io_context per io thread (connections are spread over them round-robin); pool mode one
// io_context shared by its threads; thread mode one for the accept loop (server.hpp says why).
// The process runs one instance for the self-test, load or serve, and two more in turn for
// --compare; the lanes and the /mlp model are the process's and outlive every instance.
//
// Thread safety: stop() from any thread (a signal handler's strand included); the rest from the
// thread that owns the instance.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>

#include <evr/evr.hpp>

#include "lane_set.hpp"
#include "lanes.hpp"
#include "metrics.hpp"
#include "mlp.hpp"
#include "server.hpp"

struct instance_config {
  server_config server;
  int threads = 1;  ///< io threads or the pool's threads (thread mode: 1, the accept loop's)
  evr::reactor_options reactor;  ///< evr mode
  /// Runs first on every io thread (a test's hook: e.g. to count what those threads allocate).
  std::function<void()> on_io_thread;
};

class instance {
 public:
  /// Builds everything and starts listening and the io threads. `lanes_by_device[d]`: the lanes
  /// of the d-th device used. Throws std::runtime_error when the address cannot be bound.
  instance(evr::device::backend& backend, const std::vector<std::vector<lane*>>& lanes_by_device,
           const mlp::model& model, instance_config cfg);
  /// Stops and joins, if not done yet.
  ~instance();
  instance(const instance&) = delete;
  instance& operator=(const instance&) = delete;

  asio::ip::tcp::endpoint endpoint() const;
  /// Stops accepting and closes the connections (requests in flight finish their GPU work).
  void stop() { server_->stop(); }
  /// Waits for every io and connection thread to finish. False if one ended by an exception.
  bool join();

  /// The first io_context (the accept loop's; signals may be waited for on it).
  asio::io_context& io() noexcept { return *contexts_.front(); }
  server& srv() noexcept { return *server_; }
  server_metrics& metrics() noexcept { return metrics_; }
  lane_set& lanes() noexcept { return lanes_; }
  evr::reactor* reactor() noexcept { return reactor_ ? &*reactor_ : nullptr; }

 private:
  // Teardown is the reverse of this order: the server (its batchers and pollers) and the lane
  // pools go before the io_contexts they post to, the io_contexts before the reactor they may
  // still have waits with.
  std::optional<evr::reactor> reactor_;
  std::vector<std::unique_ptr<asio::io_context>> contexts_;
  lane_set lanes_;
  server_metrics metrics_;
  std::unique_ptr<server> server_;
  std::vector<std::thread> threads_;
  std::atomic<bool> crashed_{false};
  bool joined_ = false;
};
