// The handle tables of a simulated device: which streams, events, exported events and fence
// blocks exist. A handle is the address of its state object; a handle that is not in the table
// (destroyed, made by another backend) is reported as cuda invalid resource handle (400) and never
// dereferenced.
//
// Thread safety: every member may be called from any thread. Three mutexes, one per table, each
// held only for a lookup or an update of its table; nothing else is taken while one is held,
// except that reap() locks streams' mutexes while holding the stream table's (the order of
// scheduler.hpp; a progress waiter's condition may take the stream table's). Lookups return
// shared_ptr copies, so a stream or event stays alive for the call that looked it up even if
// another thread destroys its handle meanwhile.
//
// Lifetime: a destroyed stream moves to a "retired" list until its work has drained and its
// worker has exited; reap() then hands it to the scheduler, which joins the worker. Fence block
// states live as long as the registry (a queued write may still point at one after its memory was
// freed).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "model.hpp"

namespace evr::sim::detail {

class registry {
 public:
  registry() = default;
  /// Takes each table's mutex once before the tables go: the last call another thread made on
  /// the device (its contract: returned before the destruction begins) happens-before it.
  ~registry();
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;

  // --- streams ---------------------------------------------------------------------------------
  /// The stream of `handle`: errc::invalid_argument for the legacy default stream (nullptr, 1,
  /// not modelled), errc::per_thread_default_stream for cudaStreamPerThread (2), cuda 400 for a
  /// handle that is not a live stream of this device.
  std::error_code find_stream(evr::device::native_stream handle,
                              std::shared_ptr<stream_state>& out) const;
  /// A new stream, not registered yet (ids follow creation order).
  std::shared_ptr<stream_state> new_stream(int device, int priority);
  /// Registers `s`: from now on its handle is valid.
  void add_stream(std::shared_ptr<stream_state> s);
  /// Unregisters `handle` and moves its stream to the retired list; nullptr when unknown.
  std::shared_ptr<stream_state> retire_stream(evr::device::native_stream handle);
  /// Every stream, live and retired (sorted by id when `by_id`).
  std::vector<std::shared_ptr<stream_state>> snapshot(bool by_id = false) const;
  /// Drops retired streams for which `finished` (called with the stream's mutex held) is true and
  /// returns them, so that the caller joins their workers with no lock held.
  template <typename Finished>
  std::vector<std::shared_ptr<stream_state>> reap(Finished finished) {
    std::vector<std::shared_ptr<stream_state>> done;
    std::lock_guard lock(streams_mutex_);
    std::erase_if(retired_, [&](const std::shared_ptr<stream_state>& s) {
      std::lock_guard stream_lock(s->mutex);
      if (!finished(*s)) return false;
      done.push_back(s);
      return true;
    });
    return done;
  }

  // --- events ----------------------------------------------------------------------------------
  /// A copy of the event of `handle`: errc::invalid_argument for nullptr, cuda 400 when unknown.
  std::error_code find_event(evr::device::native_event handle, event_state& out) const;
  evr::device::native_event add_event(event_state e);
  /// Unregisters `handle`, then calls `removed()` (a counter's bump) before the table's mutex is
  /// released, so that whoever takes the mutex later (the destructor) sees both; false when
  /// unknown. The exporter's death ends its IPC handle.
  template <typename Removed>
  bool remove_event(evr::device::native_event handle, Removed removed) {
    std::unique_ptr<event_state> gone;  // destroyed after the lock is released
    std::lock_guard lock(events_mutex_);
    if (!take_event(handle, gone)) return false;
    removed();
    return true;
  }
  /// The IPC token of the event's core, assigned on first export (0 when `handle` is unknown).
  std::uint64_t export_token(evr::device::native_event handle);
  /// The core exported under `token`, or nullptr.
  std::shared_ptr<event_core> exported(std::uint64_t token) const;

  // --- fence blocks ----------------------------------------------------------------------------
  fence_block_state* add_fence_block(std::uintptr_t base, std::size_t bytes);
  /// The live block holding the 8 aligned bytes at `address`, or nullptr.
  fence_block_state* find_fence_block(std::uintptr_t address) const;
  /// Unregisters the block at `base` and returns it (its state stays allocated); nullptr if none.
  fence_block_state* remove_fence_block(std::uintptr_t base);

 private:
  mutable std::mutex streams_mutex_;
  std::unordered_map<const void*, std::shared_ptr<stream_state>> streams_;
  std::vector<std::shared_ptr<stream_state>> retired_;  // destroyed, still draining
  std::atomic<std::uint64_t> next_stream_id_{1};

  /// remove_event's part under events_mutex_.
  bool take_event(evr::device::native_event handle, std::unique_ptr<event_state>& out);

  mutable std::mutex events_mutex_;
  std::unordered_map<const void*, std::unique_ptr<event_state>> events_;
  std::unordered_map<std::uint64_t, std::shared_ptr<event_core>> exported_;  // token → core
  std::uint64_t next_ipc_token_ = 1;

  mutable std::mutex fences_mutex_;
  std::map<std::uintptr_t, fence_block_state*> fence_blocks_;     // live: base → state
  std::vector<std::unique_ptr<fence_block_state>> fence_states_;  // every block ever allocated
};

}  // namespace evr::sim::detail
