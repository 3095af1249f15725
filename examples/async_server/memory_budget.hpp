// A budget of bytes for request buffers: what the requests being served hold beyond the lanes'
// standing buffers (an /mlp request's rows in and out, a large /saxpy or /sum's element buffers).
// A request takes its bytes before it allocates them and gives them back when it is answered; one
// that does not fit is refused (503 with Retry-After) instead of growing the process without
// bound.
//
// Thread-safe, lock-free: one atomic add (and one subtract when it does not fit) per request.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

class memory_budget {
 public:
  explicit memory_budget(std::uint64_t bytes) noexcept : limit_(bytes) {}

  /// Bytes held by a request while it lives; empty when they did not fit.
  class charge {
   public:
    charge(memory_budget& b, std::uint64_t bytes) noexcept : budget_(&b), bytes_(bytes) {
      if (!b.try_take(bytes)) budget_ = nullptr;
    }
    charge(const charge&) = delete;
    charge& operator=(const charge&) = delete;
    ~charge() {
      if (budget_ != nullptr) budget_->give_back(bytes_);
    }
    explicit operator bool() const noexcept { return budget_ != nullptr; }

   private:
    memory_budget* budget_;
    std::uint64_t bytes_;
  };

  std::uint64_t limit() const noexcept { return limit_; }
  /// Bytes held now (a statistic).
  std::uint64_t used() const noexcept { return used_.load(std::memory_order_relaxed); }

 private:
  bool try_take(std::uint64_t bytes) noexcept {
    if (used_.fetch_add(bytes, std::memory_order_relaxed) + bytes <= limit_) return true;
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    return false;
  }
  void give_back(std::uint64_t bytes) noexcept {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
  }

  const std::uint64_t limit_;
  std::atomic<std::uint64_t> used_{0};
};
