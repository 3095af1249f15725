// The handle tables of a simulated device (registry.hpp).
#include "registry.hpp"

#include <algorithm>

namespace evr::sim::detail {

registry::~registry() { std::scoped_lock lock(streams_mutex_, events_mutex_, fences_mutex_); }

// --- streams -------------------------------------------------------------------------------------
std::error_code registry::find_stream(evr::device::native_stream handle,
                                      std::shared_ptr<stream_state>& out) const {
  if (handle == nullptr || handle == reinterpret_cast<evr::device::native_stream>(1)) {
    return make_error_code(errc::invalid_argument);  // the legacy default stream: not modelled
  }
  if (handle == reinterpret_cast<evr::device::native_stream>(2)) {
    return make_error_code(errc::per_thread_default_stream);
  }
  std::lock_guard lock(streams_mutex_);
  auto it = streams_.find(handle);
  if (it == streams_.end()) return bad_handle();
  out = it->second;
  return {};
}

std::shared_ptr<stream_state> registry::new_stream(int device, int priority) {
  return std::make_shared<stream_state>(next_stream_id_.fetch_add(1, std::memory_order_relaxed),
                                        device, priority);
}

void registry::add_stream(std::shared_ptr<stream_state> s) {
  std::lock_guard lock(streams_mutex_);
  stream_state* handle = s.get();
  streams_.emplace(handle, std::move(s));
}

std::shared_ptr<stream_state> registry::retire_stream(evr::device::native_stream handle) {
  std::lock_guard lock(streams_mutex_);
  auto it = streams_.find(handle);
  if (it == streams_.end()) return nullptr;
  std::shared_ptr<stream_state> s = std::move(it->second);
  streams_.erase(it);
  retired_.push_back(s);
  return s;
}

std::vector<std::shared_ptr<stream_state>> registry::snapshot(bool by_id) const {
  std::vector<std::shared_ptr<stream_state>> all;
  {
    std::lock_guard lock(streams_mutex_);
    all.reserve(streams_.size() + retired_.size());
    for (const auto& [handle, s] : streams_) all.push_back(s);
    all.insert(all.end(), retired_.begin(), retired_.end());
  }
  if (by_id) {
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->id < b->id; });
  }
  return all;
}

// --- events --------------------------------------------------------------------------------------
std::error_code registry::find_event(evr::device::native_event handle, event_state& out) const {
  if (handle == nullptr) return make_error_code(errc::invalid_argument);
  std::lock_guard lock(events_mutex_);
  auto it = events_.find(handle);
  if (it == events_.end()) return bad_handle();
  out = *it->second;
  return {};
}

device::native_event registry::add_event(event_state e) {
  auto owned = std::make_unique<event_state>(std::move(e));
  evr::device::native_event handle = owned.get();
  std::lock_guard lock(events_mutex_);
  events_.emplace(handle, std::move(owned));
  return handle;
}

bool registry::take_event(evr::device::native_event handle, std::unique_ptr<event_state>& out) {
  auto it = events_.find(handle);
  if (it == events_.end()) return false;
  // The exporter's death ends its handle: later imports fail (imports already made keep working;
  // on CUDA using them is undefined).
  const event_state& e = *it->second;
  if (!e.imported && e.core->ipc_token != 0) exported_.erase(e.core->ipc_token);
  out = std::move(it->second);
  events_.erase(it);
  return true;
}

std::uint64_t registry::export_token(evr::device::native_event handle) {
  std::lock_guard lock(events_mutex_);
  auto it = events_.find(handle);
  if (it == events_.end()) return 0;
  const std::shared_ptr<event_core>& core = it->second->core;
  if (core->ipc_token == 0) {
    core->ipc_token = next_ipc_token_++;
    exported_.emplace(core->ipc_token, core);
  }
  return core->ipc_token;
}

std::shared_ptr<event_core> registry::exported(std::uint64_t token) const {
  std::lock_guard lock(events_mutex_);
  auto it = exported_.find(token);
  return it == exported_.end() ? nullptr : it->second;
}

// --- fence blocks --------------------------------------------------------------------------------
fence_block_state* registry::add_fence_block(std::uintptr_t base, std::size_t bytes) {
  std::lock_guard lock(fences_mutex_);
  fence_states_.push_back(std::make_unique<fence_block_state>(base, bytes));
  fence_block_state* b = fence_states_.back().get();
  fence_blocks_[base] = b;
  return b;
}

fence_block_state* registry::find_fence_block(std::uintptr_t address) const {
  std::lock_guard lock(fences_mutex_);
  auto it = fence_blocks_.upper_bound(address);
  if (it == fence_blocks_.begin()) return nullptr;
  --it;
  return it->second->contains(address) ? it->second : nullptr;
}

fence_block_state* registry::remove_fence_block(std::uintptr_t base) {
  std::lock_guard lock(fences_mutex_);
  auto it = fence_blocks_.find(base);
  if (it == fence_blocks_.end()) return nullptr;
  fence_block_state* b = it->second;
  fence_blocks_.erase(it);
  return b;
}

}  // namespace evr::sim::detail
