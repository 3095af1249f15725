// signal_pool: signal slots of one device (see the header for why and the contracts).
//
// State, shared by the pool object and every slot handed out (a shared_ptr: slots are taken per
// lane, not per wait, so the reference count is off the hot path): the blocks of slot memory,
// and per slot how many signals were armed when it was given back. Everything under `mutex`;
// growth under `grow_mutex` (a block is made without `mutex`: see add_block).
#include <evr/pool/signal_pool.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include <evr/device/error.hpp>

namespace evr {
namespace detail {
namespace {
/// Capacity for `n` elements, grown geometrically (an exact reserve per batch would copy the
/// vector at every batch).
template <class T>
void make_room(std::vector<T>& v, std::size_t n) {
  if (v.capacity() < n) v.reserve(std::max(n, 2 * v.capacity()));
}
}  // namespace

struct signal_pool_state {
  signal_pool_state(device::backend& b, int d, std::size_t n)
      : backend(b), device(d), batch(n == 0 ? 1 : n) {}
  ~signal_pool_state();

  device::backend& backend;
  const int device;
  const std::size_t batch;
  mutable std::mutex mutex;
  std::mutex grow_mutex;  // one growth at a time; taken before `mutex`, never inside it
  std::vector<device::signal_block> blocks;  // slot i is in blocks[i / batch] at i % batch
  std::vector<std::uint64_t> armed;          // per slot: armed when it was last given back
  std::vector<std::size_t> free;             // slots given back (some may await signals)
  std::size_t in_use = 0;

  std::uint64_t* word(std::size_t i) const noexcept {
    return blocks[i / batch].host_word(i % batch);
  }
  /// Every signal armed for slot `i` has landed: it may be handed out again.
  bool settled(std::size_t i) const noexcept {
    return std::atomic_ref<std::uint64_t>(*word(i)).load(std::memory_order_acquire) >= armed[i];
  }
  /// (mutex) A settled free slot, or `npos`.
  std::size_t take_free() noexcept {
    for (std::size_t k = free.size(); k-- > 0;) {
      if (!settled(free[k])) continue;
      const std::size_t i = free[k];
      free[k] = free.back();
      free.pop_back();
      return i;
    }
    return npos;
  }
  /// (mutex) Slots made so far.
  std::size_t made() const noexcept { return blocks.size() * batch; }
  /// The same, taking `mutex`.
  std::size_t made_locked() const noexcept {
    std::lock_guard<std::mutex> lock(mutex);
    return made();
  }
  /// (grow_mutex, not mutex) One more block of slots, all free. The block is made without
  /// `mutex`: a device's first block loads the signal kernel, which waits for the device's
  /// running kernels, and release() and the slots' other users must not wait with it. Room in
  /// the vectors is made before the block is added, so that nothing throws once it is in (and
  /// release() never allocates: free has room for every slot); if that room cannot be had, the
  /// block, which no kernel has seen yet, is freed.
  std::error_code add_block() noexcept {
    device::signal_block b;
    if (auto ec = backend.allocate_signal_block(device, batch, b)) return ec;
    std::lock_guard<std::mutex> lock(mutex);
    const std::size_t first = made();
    try {
      make_room(blocks, blocks.size() + 1);
      make_room(armed, first + batch);
      make_room(free, first + batch);
    } catch (const std::bad_alloc&) {
      backend.free_signal_block(b);
      return std::make_error_code(std::errc::not_enough_memory);
    }
    blocks.push_back(b);
    armed.resize(first + batch, 0);
    for (std::size_t i = first + batch; i-- > first;) free.push_back(i);
    return {};
  }
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
};

namespace {
/// Blocks with a signal still to land when their pool went away: kept for the process (a kernel
/// armed for and not yet run would write into freed memory), and listed here so that they stay
/// reachable, which is what they are, rather than lost (a leak checker would report them). Only
/// waits whose kernel never signalled (a fault, a misuse) leave a block here. Never destroyed
/// (the list must outlive every pool, statics included). Thread-safe: its mutex.
struct kept_signal_blocks {
  std::mutex mutex;
  std::vector<device::signal_block> blocks;

  static kept_signal_blocks& instance() {
    static kept_signal_blocks* const kept = new kept_signal_blocks;
    return *kept;
  }
  void keep(const device::signal_block& b) noexcept {
    std::lock_guard<std::mutex> lock(mutex);
    try {
      blocks.push_back(b);
    } catch (const std::bad_alloc&) {
      // Out of memory: the block stays allocated all the same, only unlisted.
    }
  }
};
}  // namespace

signal_pool_state::~signal_pool_state() {
  // Every slot is back (they hold the state).
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    bool settled_block = true;
    for (std::size_t i = b * batch; i < (b + 1) * batch && settled_block; ++i)
      settled_block = settled(i);
    if (settled_block) {
      backend.free_signal_block(blocks[b]);
    } else {
      kept_signal_blocks::instance().keep(blocks[b]);
    }
  }
}

}  // namespace detail

signal_slot::signal_slot(signal_slot&& other) noexcept
    : state_(std::move(other.state_)),
      index_(other.index_),
      word_(std::exchange(other.word_, nullptr)),
      armed_(other.armed_),
      ref_(other.ref_) {}

signal_slot& signal_slot::operator=(signal_slot&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    index_ = other.index_;
    word_ = std::exchange(other.word_, nullptr);
    armed_ = other.armed_;
    ref_ = other.ref_;
  }
  return *this;
}

int signal_slot::device() const noexcept { return state_ ? state_->device : -1; }

std::uint64_t signal_slot::signalled() const noexcept {
  return word_ == nullptr ? 0
                          : std::atomic_ref<std::uint64_t>(*word_).load(std::memory_order_acquire);
}

void signal_slot::enqueue_signal(device::native_stream stream) {
  std::error_code ec;
  enqueue_signal(stream, ec);
  throw_if(ec, "signal_slot::enqueue_signal");
}

void signal_slot::enqueue_signal(device::native_stream stream, std::error_code& ec) noexcept {
  check_stream(stream, ec);
  if (!ec) ec = state_->backend.enqueue_signal(state_->device, stream, ref_);
}

void signal_slot::check_stream(device::native_stream stream, std::error_code& ec) const noexcept {
  if (!state_) {
    ec = make_error_code(errc::empty_handle);
    return;
  }
  device::backend& be = state_->backend;
  // CUDA does not name a capturing stream's device (cudaStreamGetDevice then fails and
  // invalidates the capture): a launch into a capture goes to the current device.
  int stream_device = -1;
  const bool capturing = be.stream_is_capturing(stream);
  if (capturing && stream == nullptr) {
    // The legacy default stream while another thread captures in global mode: a launch onto it
    // would fail and invalidate that capture.
    ec = make_cuda_error(906);  // cudaErrorStreamCaptureImplicit
    return;
  }
  ec = capturing ? be.current_device(stream_device) : be.stream_device(stream, stream_device);
  if (!ec && stream_device != state_->device) ec = make_error_code(errc::device_mismatch);
}

void signal_slot::release() noexcept {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->armed[index_] = armed_;
    // Cannot fail for want of memory: free has room for every slot (reserved at growth).
    state_->free.push_back(index_);
    --state_->in_use;
  }
  state_.reset();
  word_ = nullptr;
}

signal_pool::signal_pool(device::backend& backend, int device, std::size_t batch)
    : state_(std::make_shared<detail::signal_pool_state>(backend, device, batch)) {}

signal_pool::~signal_pool() = default;

signal_slot signal_pool::acquire() {
  std::error_code ec;
  signal_slot s = acquire(ec);
  throw_if(ec, "signal_pool::acquire");
  return s;
}

signal_slot signal_pool::acquire(std::error_code& ec) noexcept {
  ec.clear();
  signal_slot s;
  if (take_free_slot(s)) return s;
  std::lock_guard<std::mutex> growing(state_->grow_mutex);
  // Another thread may have made a block meanwhile, and others may take this one's slots first.
  while (!take_free_slot(s)) {
    if ((ec = state_->add_block())) return s;
  }
  return s;
}

bool signal_pool::take_free_slot(signal_slot& s) noexcept {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const std::size_t i = state_->take_free();
  if (i == detail::signal_pool_state::npos) return false;
  s.state_ = state_;
  s.index_ = i;
  s.word_ = state_->word(i);
  s.armed_ = state_->armed[i];
  s.ref_ = state_->blocks[i / state_->batch].ref(i % state_->batch);
  ++state_->in_use;
  return true;
}

void signal_pool::reserve(std::size_t slots) {
  std::error_code ec;
  reserve(slots, ec);
  throw_if(ec, "signal_pool::reserve");
}

void signal_pool::reserve(std::size_t slots, std::error_code& ec) noexcept {
  ec.clear();
  std::lock_guard<std::mutex> growing(state_->grow_mutex);
  while (!ec && state_->made_locked() < slots) ec = state_->add_block();
}

int signal_pool::device() const noexcept { return state_->device; }

signal_pool_stats signal_pool::stats() const noexcept {
  std::lock_guard<std::mutex> lock(state_->mutex);
  signal_pool_stats st;
  st.slots = state_->made();
  st.in_use = state_->in_use;
  for (std::size_t i : state_->free) st.waiting += state_->settled(i) ? 0 : 1;
  return st;
}

}  // namespace evr
