#include "offload_threads.hpp"

#include <pthread.h>

#include <cstdio>
#include <string>

offload_threads::offload_threads(std::size_t n, const char* name)
    : io_(static_cast<int>(n)), keep_(asio::make_work_guard(io_)) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::string thread_name = std::string(name) + "-" + std::to_string(i);
    threads_.emplace_back([this, thread_name] {
      pthread_setname_np(pthread_self(), thread_name.substr(0, 15).c_str());
      io_.run();
    });
  }
}

offload_threads::~offload_threads() {
  keep_.reset();  // run() returns once the steps queued so far have run
  for (auto& t : threads_) t.join();
}
