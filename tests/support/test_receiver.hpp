// A P2300 receiver of the tests' own (evr::exec protocol, no P2300 library) and a place to build
// an operation state in (they cannot be moved).
#pragma once

#include <atomic>
#include <new>
#include <stop_token>
#include <system_error>
#include <utility>

#include <evr/callbacks/exec.hpp>
#include <evr/reactor/reactor.hpp>

namespace evr::test {

/// What one wait's receiver saw. `reactor`: the reactor whose thread on_reactor is checked
/// against (nullptr: not checked).
struct outcome {
  explicit outcome(const evr::reactor* r = nullptr) : reactor(r) {}
  const evr::reactor* reactor;
  std::atomic<int> values{0}, errors{0}, stops{0};
  std::atomic<bool> on_reactor{false};
  std::error_code error;  ///< written before the count that publishes it
  int calls() const { return values.load() + errors.load() + stops.load(); }
};

/// An environment whose stop token is a std::stop_token.
struct stop_env {
  std::stop_token token;
  std::stop_token query(evr::exec::get_stop_token_t) const noexcept { return token; }
};

/// Records its completion into an outcome; its environment is `Env`.
template <class Env>
struct test_receiver {
  using receiver_concept = evr::exec::receiver_t;
  outcome* out;
  Env env{};

  void seen() noexcept {
    out->on_reactor.store(out->reactor != nullptr && out->reactor->running_in_this_thread());
  }
  void set_value() && noexcept {
    seen();
    out->values.fetch_add(1);
  }
  void set_error(std::error_code ec) && noexcept {
    seen();
    out->error = ec;
    out->errors.fetch_add(1);
  }
  void set_stopped() && noexcept {
    seen();
    out->stops.fetch_add(1);
  }
  Env get_env() const noexcept { return env; }
};

/// Storage for one operation state, built in place from connect's result (guaranteed elision)
/// and destroyed with the slot. The operation must have completed by then.
template <class Op>
class op_slot {
 public:
  op_slot() = default;
  op_slot(const op_slot&) = delete;
  op_slot& operator=(const op_slot&) = delete;
  ~op_slot() { reset(); }

  /// Builds the operation state from `make()` (which returns it by value).
  template <class Make>
  Op& construct(Make&& make) {
    reset();
    op_ = ::new (static_cast<void*>(storage_)) Op(std::forward<Make>(make)());
    return *op_;
  }
  Op& get() { return *op_; }
  void reset() {
    if (op_ != nullptr) std::exchange(op_, nullptr)->~Op();
  }

 private:
  alignas(Op) unsigned char storage_[sizeof(Op)];
  Op* op_ = nullptr;
};

}  // namespace evr::test
