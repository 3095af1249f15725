// evr/reactor/detail/host_schedule.hpp — when a host (poll_host.hpp) should look at each of its
// streams: a min-heap of (look time, stream), so that a host's pass visits only the streams whose
// look is due instead of every active stream (a server's io thread with 128 lanes spent 8 us per
// request scanning them all while it polled through their windows, on the H200). Not public.
//
// Entries are never removed in place: a stream's plan carries an epoch that every new plan bumps,
// and an entry whose epoch is no longer the stream's is dropped when it comes to the top. So the
// schedule holds no reference a stream must undo, and a stream never refers to a host's schedule
// (hosts come and go with their execution contexts; stream states live as long as the reactor).
//
// Threads: under the reactor's pass lock only (the host's own passes, and the reactor's planning).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace evr::detail {

struct stream_state;

/// `Stream` is stream_state (a parameter only so that the tests can use stand-ins).
template <typename Stream>
class basic_host_schedule {
 public:
  struct entry {
    std::int64_t look_ns;  ///< steady clock ns; the stream is due from then on
    Stream* stream;
    std::uint32_t epoch;  ///< the stream's plan epoch when scheduled
  };
  static constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();

  /// Schedules a look. A full heap first drops its stale entries, and grows only if the current
  /// ones fill half of it: so a host's steady traffic allocates nothing (a host that does not
  /// pass while the reactor plans its streams again would otherwise collect one entry per plan,
  /// and a loaded host's vector would grow now and then, mid-traffic).
  template <typename Current>
  void add(const entry& e, Current&& current) {
    if (heap_.capacity() == 0) heap_.reserve(initial_capacity);
    if (heap_.size() == heap_.capacity()) {
      compact(current);
      if (2 * heap_.size() >= heap_.capacity()) heap_.reserve(2 * heap_.capacity());
    }
    heap_.push_back(e);
    std::push_heap(heap_.begin(), heap_.end(), later);
  }
  /// The earliest current entry (`current` drops the stale ones first); nullptr when none is left.
  /// Valid until the schedule next changes.
  template <typename Current>
  const entry* next(Current&& current) {
    while (!heap_.empty() && !current(heap_.front())) pop();
    return heap_.empty() ? nullptr : &heap_.front();
  }
  /// The earliest current entry's look; `never` when none is left.
  template <typename Current>
  std::int64_t next_ns(Current&& current) {
    const entry* e = next(current);
    return e == nullptr ? never : e->look_ns;
  }
  /// Whether an entry with a look at or before `until_ns` satisfies `pred` (which should drop
  /// the stale ones itself). Visits only those entries and their children (the heap's order:
  /// no child looks before its parent), so a near `until_ns` costs a few entries, not all.
  template <typename Pred>
  bool any_until(std::int64_t until_ns, Pred&& pred) const {
    return any_until_from(0, until_ns, pred);
  }
  /// Appends the current entries due at `now_ns` to `out` (in look order), each stream once:
  /// not again when `out` has it already (a look a pass left for the next, host_pass.cpp).
  template <typename Current>
  void take_due(std::int64_t now_ns, Current&& current, std::vector<entry>& out) {
    while (!heap_.empty() && heap_.front().look_ns <= now_ns) {
      const entry e = heap_.front();
      pop();
      const auto same = [&](const entry& o) { return o.stream == e.stream; };
      if (current(e) && std::none_of(out.begin(), out.end(), same)) out.push_back(e);
    }
  }
  std::size_t size() const noexcept { return heap_.size(); }
  std::size_t capacity() const noexcept { return heap_.capacity(); }
  /// Drops the stale entries.
  template <typename Current>
  void compact(Current&& current) {
    heap_.erase(
        std::remove_if(heap_.begin(), heap_.end(), [&](const entry& e) { return !current(e); }),
        heap_.end());
    std::make_heap(heap_.begin(), heap_.end(), later);
  }

 private:
  static constexpr std::size_t initial_capacity = 64;
  static bool later(const entry& a, const entry& b) noexcept { return a.look_ns > b.look_ns; }
  template <typename Pred>
  bool any_until_from(std::size_t i, std::int64_t until_ns, Pred& pred) const {
    if (i >= heap_.size() || heap_[i].look_ns > until_ns) return false;
    return pred(heap_[i]) || any_until_from(2 * i + 1, until_ns, pred) ||
           any_until_from(2 * i + 2, until_ns, pred);
  }
  void pop() {
    std::pop_heap(heap_.begin(), heap_.end(), later);
    heap_.pop_back();
  }
  std::vector<entry> heap_;
};

using host_schedule = basic_host_schedule<stream_state>;

}  // namespace evr::detail
