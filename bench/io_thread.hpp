// bench/io_thread.hpp — an io_context run by one thread parked in run(): posted delivery, as in
// a server. The work guard keeps run() from returning while nothing is queued; the destructor
// lets it drain what is queued and joins.
#pragma once

#include <thread>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

namespace evr::bench {

class io_thread {
 public:
  io_thread() : thread_([this] { io_.run(); }) {}
  ~io_thread() {
    work_.reset();
    thread_.join();
  }
  io_thread(const io_thread&) = delete;
  io_thread& operator=(const io_thread&) = delete;
  asio::io_context& io() { return io_; }

 private:
  asio::io_context io_{1};
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::thread thread_;
};

}  // namespace evr::bench
