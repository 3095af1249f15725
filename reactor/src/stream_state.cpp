#include "stream_state.hpp"

#include <bit>

namespace evr::detail {

stream_table::stream_table(std::size_t max_streams) : max_(max_streams == 0 ? 1 : max_streams) {
  std::size_t capacity = std::bit_ceil(max_ * 2);
  slots_ = std::make_unique<std::atomic<stream_state*>[]>(capacity);
  for (std::size_t i = 0; i < capacity; ++i) slots_[i].store(nullptr, std::memory_order_relaxed);
  mask_ = capacity - 1;
}

stream_table::~stream_table() = default;  // the reactor core deletes the states it decides to

std::size_t stream_table::home(device::native_stream native, int key_device) const noexcept {
  // Fibonacci hashing of the handle's address (low bits are alignment zeros) and the device.
  auto x = reinterpret_cast<std::uintptr_t>(native) ^
           (static_cast<std::uintptr_t>(key_device + 1) << 48);
  return static_cast<std::size_t>((x * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
}

stream_state* stream_table::find(device::native_stream native, int key_device) const noexcept {
  for (std::size_t i = home(native, key_device), n = 0; n <= mask_; i = (i + 1) & mask_, ++n) {
    stream_state* s = slots_[i].load(std::memory_order_acquire);
    if (s == nullptr) return nullptr;
    if (s->native == native && s->key_device == key_device) return s;
  }
  return nullptr;
}

stream_state* stream_table::insert(stream_state* fresh) noexcept {
  if (count_.load(std::memory_order_relaxed) >= max_) return find(fresh->native, fresh->key_device);
  for (std::size_t i = home(fresh->native, fresh->key_device), n = 0; n <= mask_;
       i = (i + 1) & mask_, ++n) {
    stream_state* s = slots_[i].load(std::memory_order_acquire);
    if (s == nullptr) {
      // release: the state's fields are visible to whoever loads the pointer (acquire).
      if (slots_[i].compare_exchange_strong(s, fresh, std::memory_order_acq_rel,
                                            std::memory_order_acquire)) {
        count_.fetch_add(1, std::memory_order_relaxed);
        return fresh;
      }
      // lost the slot: `s` now holds the winner; fall through to compare it.
    }
    if (s->native == fresh->native && s->key_device == fresh->key_device) return s;
  }
  return nullptr;
}

namespace {
// Retained objects, reachable from a global so that leak checkers see them as kept on purpose.
struct retained {
  std::mutex mutex;
  std::vector<std::unique_ptr<stream_state>> states;
  std::vector<device::fence_block> blocks;
};
retained& graveyard() {
  static retained* g = new retained;  // never destroyed: host functions may run during exit
  return *g;
}
}  // namespace

void retain_for_process_lifetime(stream_state* st) {
  retained& g = graveyard();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.states.emplace_back(st);
}

void retain_for_process_lifetime(const device::fence_block& block) {
  retained& g = graveyard();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.blocks.push_back(block);
}

fence_allocator::~fence_allocator() {
  for (auto& d : devices_) {
    for (auto& b : d.blocks) {
      if (leak_)
        retain_for_process_lifetime(b);
      else
        backend_.free_fence_block(b);
    }
  }
}

std::error_code fence_allocator::allocate(int device, std::uint64_t*& host,
                                          std::uint64_t& device_address) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (device < 0) return make_error_code(errc::no_device);
  if (devices_.size() <= static_cast<std::size_t>(device)) devices_.resize(device + 1);
  per_device& d = devices_[device];
  if (d.used_in_last == block_words) {
    // Room first (may throw bad_alloc): a push_back that threw after the allocation would lose
    // the block.
    if (d.blocks.size() == d.blocks.capacity()) d.blocks.reserve(2 * d.blocks.size() + 1);
    device::fence_block block;
    if (auto ec = backend_.allocate_fence_block(device, block_words, block)) return ec;
    d.blocks.push_back(block);
    d.used_in_last = 0;
  }
  const device::fence_block& b = d.blocks.back();
  host = b.host_word(d.used_in_last);
  device_address = b.device_word(d.used_in_last);
  ++d.used_in_last;
  return {};
}

}  // namespace evr::detail
