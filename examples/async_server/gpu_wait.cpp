#include "gpu_wait.hpp"

#include <stdexcept>

gpu_wait::gpu_wait(const asio::any_io_executor& executor, const source& s)
    : mode_(s.mode), poller_(s.poller) {
  if (blocks_a_thread(mode_))
    throw std::invalid_argument(std::string("gpu_wait: mode ") + to_string(mode_) + " blocks");
  if (mode_ == wait_mode::evr) {
    if (s.reactor == nullptr) throw std::invalid_argument("gpu_wait: evr mode needs a reactor");
    waiter_.emplace(executor, *s.reactor);
  }
  if (mode_ == wait_mode::poll && poller_ == nullptr)
    throw std::invalid_argument("gpu_wait: poll mode needs the io thread's poller");
}
