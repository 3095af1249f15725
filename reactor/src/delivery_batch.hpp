// reactor/src/delivery_batch.hpp — the waits a pass retired, completed together after its sweep.
//
// Owns the batch (each wait with its outcome, in retirement order) and the front ends that hold
// their posts back until the batch ends (deferred_posts.hpp: while a posted completion runs, this
// thread is marked as delivering the batch, and hold_until_batch_end registers with it). What
// deliver() guarantees: each wait of the batch is completed once, statistics counted; held posts
// are flushed before any inline completion runs user code, and at the end.
//
// Threads: under the pass lock (the reactor thread, or a host's pass that delivers a batch of
// posted completions only). An inline handler may detach an execution context from inside
// deliver() (detach_group appends and nulls entries): the loop indexes the batch and re-reads its
// size, so it stays valid.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <system_error>
#include <utility>
#include <vector>

#include <evr/reactor/detail/deferred_posts.hpp>
#include <evr/reactor/detail/wait_op.hpp>

#include "counters.hpp"

namespace evr::detail {

/// What a wait aborted by cancellation or shutdown completes with (the Asio front end maps it to
/// its flavour's asio::error::operation_aborted; the core is Asio-free).
inline std::error_code aborted_error() noexcept { return make_error_code(errc::operation_aborted); }

class delivery_batch {
 public:
  using clock = std::chrono::steady_clock;

  explicit delivery_batch(reactor_counters& counters) : counters_(counters) { ready_.reserve(256); }
  delivery_batch(const delivery_batch&) = delete;
  delivery_batch& operator=(const delivery_batch&) = delete;

  void add(wait_op* op, std::error_code ec) { ready_.emplace_back(op, ec); }
  bool empty() const noexcept { return ready_.empty(); }
  std::size_t size() const noexcept { return ready_.size(); }
  /// No wait of the batch is delivered inline (a host's pass delivers only such a batch: it runs
  /// no user code).
  bool posted_only() const noexcept;
  /// The waits of `group` not delivered yet leave the batch, marked detached_, into `out`.
  void detach_group(std::uintptr_t group, std::vector<wait_op*>& out);
  /// Completes every wait of the batch (retired at `detected`), then empties it (keeping its
  /// capacity: no allocation in steady state).
  void deliver(clock::time_point detected);
  /// hold_until_batch_end for this batch (deferred_posts.hpp).
  bool hold(deferred_posts& d) noexcept;

 private:
  void count(const wait_op& op, std::error_code ec, clock::time_point detected,
             clock::time_point now) noexcept;
  void flush_held() noexcept;

  reactor_counters& counters_;
  std::vector<std::pair<wait_op*, std::error_code>> ready_;
  // Front ends holding posts back until the end of the batch under way: one per Asio flavour in
  // use, so a few slots are plenty (a front end beyond them posts at once).
  std::array<deferred_posts*, 4> held_{};
  std::size_t held_count_ = 0;
};

}  // namespace evr::detail
