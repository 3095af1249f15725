#include "instance.hpp"

#include <cstdio>

instance::instance(evr::device::backend& backend, const std::vector<lane*>& lanes,
                   const mlp::model& model, instance_config cfg)
    : io_(cfg.threads), pool_(io_.get_executor(), lanes) {
  if (cfg.server.mode == wait_mode::evr) reactor_.emplace(backend, cfg.reactor);
  server_ = std::make_unique<server>(io_, cfg.server, pool_, reactor(), model, metrics_);
  server_->start();
  for (int i = 0; i < cfg.threads; ++i) {
    threads_.emplace_back([this] {
      try {
        io_.run();
      } catch (const std::exception& e) {
        // Only a bug gets here (client errors are answered, connection errors end the connection).
        std::fprintf(stderr, "evr-async-server: io thread: %s\n", e.what());
        crashed_ = true;
        io_.stop();
      }
    });
  }
}

instance::~instance() {
  if (!joined_) {
    server_->stop();
    join();
  }
}

asio::ip::tcp::endpoint instance::endpoint() const {
  return {asio::ip::make_address(server_->config().address), server_->port()};
}

bool instance::join() {
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  server_->join_connection_threads();
  joined_ = true;
  return !crashed_;
}
