// bench/sender_pool.hpp — a minimal thread pool with a scheduler, and continues_on, in evr's own
// sender protocol (evr::exec), so that evr-bench can measure "a GPU completion continued on a
// thread pool" without a P2300 library (stdexec is not a dependency). Modelled on
// exec::static_thread_pool: workers park on a condition variable; a task is an intrusive node, so
// continuing a completion allocates nothing.
#pragma once

#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <evr/callbacks/exec.hpp>

namespace evr::bench {

class thread_pool {
 public:
  /// A unit of work: enqueued by pointer, run once by a worker.
  struct task {
    task* next = nullptr;
    void (*run)(task*) noexcept = nullptr;
  };

  explicit thread_pool(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~thread_pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    for (auto& w : workers_) w.join();
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  /// Runs `t` on a worker (FIFO); wakes one. The notify is made under the lock: once the task
  /// ran, its owner may destroy the pool, and the enqueuing thread must be done with it by then.
  void enqueue(task* t) {
    std::lock_guard<std::mutex> lock(mutex_);
    t->next = nullptr;
    (tail_ != nullptr ? tail_->next : head_) = t;
    tail_ = t;
    ready_.notify_one();
  }

  /// What continues_on takes.
  struct scheduler {
    thread_pool* pool;
  };
  scheduler get_scheduler() noexcept { return {this}; }

  /// true on one of this pool's workers.
  bool running_in_this_thread() const noexcept {
    for (const auto& w : workers_)
      if (w.get_id() == std::this_thread::get_id()) return true;
    return false;
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [this] { return stop_ || head_ != nullptr; });
      if (head_ == nullptr) return;  // stopping, nothing left
      task* t = std::exchange(head_, head_->next);
      if (head_ == nullptr) tail_ = nullptr;
      lock.unlock();
      t->run(t);
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  task* head_ = nullptr;
  task* tail_ = nullptr;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

namespace detail {

/// continues_on(sndr, sched)'s operation state: the inner sender completes into it, it queues
/// itself on the pool, a worker completes the outer receiver with the same completion.
template <class Sender, class Receiver>
class continued_op : thread_pool::task {
  enum class kind : unsigned char { value, error, stopped };

  struct inner_receiver {
    using receiver_concept = exec::receiver_t;
    continued_op* op;
    void set_value() && noexcept { op->hand_off(kind::value, {}); }
    void set_error(std::error_code ec) && noexcept { op->hand_off(kind::error, ec); }
    void set_stopped() && noexcept { op->hand_off(kind::stopped, {}); }
    /// The outer receiver's environment (its stop token reaches the inner sender). The return
    /// type is spelled out: deduced, it needed continued_op complete (clang 14 asks for it while
    /// continued_op's own members are declared).
    auto get_env() const noexcept -> decltype(exec::get_env(std::declval<const Receiver&>())) {
      return exec::get_env(op->rcvr_);
    }
  };

 public:
  using operation_state_concept = exec::operation_state_t;

  continued_op(Sender sndr, Receiver rcvr, thread_pool* pool)
      : rcvr_(std::move(rcvr)),
        pool_(pool),
        inner_(exec::connect(std::move(sndr), inner_receiver{this})) {}
  continued_op(continued_op&&) = delete;

  void start() & noexcept { exec::start(inner_); }

 private:
  void hand_off(kind k, std::error_code ec) noexcept {
    kind_ = k;
    ec_ = ec;
    run = &continued_op::on_pool;
    pool_->enqueue(this);  // (a mutex and a notify: the hand-off being measured)
  }
  static void on_pool(thread_pool::task* t) noexcept {
    auto* self = static_cast<continued_op*>(t);
    switch (self->kind_) {
      case kind::value: exec::set_value(std::move(self->rcvr_)); break;
      case kind::error: exec::set_error(std::move(self->rcvr_), self->ec_); break;
      case kind::stopped: exec::set_stopped(std::move(self->rcvr_)); break;
    }
  }

  Receiver rcvr_;
  thread_pool* pool_;
  kind kind_ = kind::value;
  std::error_code ec_;
  exec::connect_result_t<Sender, inner_receiver> inner_;
};

template <class Sender>
struct continued_sender {
  using sender_concept = exec::sender_t;
  using completion_signatures =
      exec::completion_signatures<exec::set_value_t(), exec::set_error_t(std::error_code),
                                  exec::set_stopped_t()>;
  Sender sndr;
  thread_pool* pool;

  template <class Receiver>
  continued_op<Sender, std::decay_t<Receiver>> connect(Receiver&& rcvr) const {
    return continued_op<Sender, std::decay_t<Receiver>>(sndr, std::forward<Receiver>(rcvr), pool);
  }
  exec::empty_env get_env() const noexcept { return {}; }
};

}  // namespace detail

/// `sndr`'s completion, delivered on a worker of `sched`'s pool (for senders completing with
/// set_value(), set_error(std::error_code) or set_stopped(), such as evr::gpu_sender).
template <class Sender>
detail::continued_sender<std::decay_t<Sender>> continues_on(Sender&& sndr,
                                                            thread_pool::scheduler sched) {
  return {std::forward<Sender>(sndr), sched.pool};
}

}  // namespace evr::bench
