#include "instance.hpp"

#include <pthread.h>

#include <cstdio>

namespace {

std::vector<std::unique_ptr<asio::io_context>> make_contexts(const instance_config& cfg) {
  std::vector<std::unique_ptr<asio::io_context>> v;
  if (context_per_thread(cfg.server.mode)) {
    // One per thread, each run by that thread alone (concurrency hint 1: Asio keeps the handlers
    // a thread posts to its own context in a queue of its own, without the lock).
    for (int i = 0; i < cfg.threads; ++i) v.push_back(std::make_unique<asio::io_context>(1));
  } else {
    v.push_back(std::make_unique<asio::io_context>(cfg.threads));
  }
  return v;
}

}  // namespace

instance::instance(evr::device::backend& backend,
                   const std::vector<std::vector<lane*>>& lanes_by_device, const mlp::model& model,
                   instance_config cfg)
    : contexts_(make_contexts(cfg)), lanes_(lanes_by_device) {
  if (cfg.server.mode == wait_mode::evr) reactor_.emplace(backend, cfg.reactor);
  std::vector<asio::io_context*> contexts;
  for (auto& c : contexts_) contexts.push_back(c.get());
  server_ = std::make_unique<server>(contexts, cfg.server, lanes_, reactor(), model, metrics_);
  server_->start();
  for (int i = 0; i < cfg.threads; ++i) {
    asio::io_context& io = *contexts_[static_cast<std::size_t>(i) % contexts_.size()];
    threads_.emplace_back([this, &io, i, hook = cfg.on_io_thread] {
      // Named so that profiles and scripts/study/server-profile.py tell them from the reactor
      // ("evr-reactor"), the simulator's and CUDA's own threads.
      char name[16];
      std::snprintf(name, sizeof name, "evr-io-%d", i);
      pthread_setname_np(pthread_self(), name);
      if (hook) hook();
      try {
        io.run();
      } catch (const std::exception& e) {
        // Only a bug gets here (client errors are answered, connection errors end the connection).
        std::fprintf(stderr, "evr-async-server: io thread: %s\n", e.what());
        crashed_ = true;
        for (auto& c : contexts_) c->stop();
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
