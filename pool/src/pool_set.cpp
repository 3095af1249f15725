// pool_set: one event_pool per (device, class), created on first use.
#include <evr/pool/pool_set.hpp>

#include <atomic>
#include <mutex>
#include <new>
#include <string>

namespace evr {
namespace {

std::string get_context(int device, event_class klass) {
  return "evr::pool_set::get(device " + std::to_string(device) + ", class " + to_string(klass) +
         ")";
}

/// The pool in `slot`, made by `make()` on first use. Double-checked: the fast path is one acquire
/// load (pairs with the release store that publishes a constructed pool); creation runs under
/// `mutex`, after `check()` (the device exists). Errors in `ec`: check()'s, an evr::error's code,
/// not_enough_memory.
template <typename Pool, typename Check, typename Make>
Pool* get_or_create(std::atomic<Pool*>& slot, std::mutex& mutex, std::error_code& ec, Check check,
                    Make make) noexcept {
  if (Pool* pool = slot.load(std::memory_order_acquire)) return pool;
  std::lock_guard<std::mutex> lock(mutex);
  // relaxed: stores happen under `mutex`, which we hold.
  if (Pool* pool = slot.load(std::memory_order_relaxed)) return pool;
  if ((ec = check())) return nullptr;
  Pool* pool = nullptr;
  try {
    pool = make();
  } catch (const error& e) {
    ec = e.code();
    return nullptr;
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
    return nullptr;
  }
  slot.store(pool, std::memory_order_release);  // release: publishes the constructed pool
  return pool;
}

}  // namespace

pool_set::pool_set(device::backend& backend, pool_options options)
    : backend_(backend), options_(options) {
  int count = 0;
  // A backend that cannot count its devices (CUDA without a driver) leaves device_count_ at 0;
  // get() asks again, so the error it reports is the backend's own.
  if (!backend_.device_count(count)) device_count_ = count;
}

pool_set::~pool_set() {
  // relaxed: destruction cannot race with get() (the caller's contract).
  for (auto& slot : pools_) delete slot.load(std::memory_order_relaxed);
  for (auto& slot : signal_pools_) delete slot.load(std::memory_order_relaxed);
}

std::error_code pool_set::check_device(int device) noexcept {
  if (device < device_count_) return {};
  int count = 0;
  if (std::error_code count_ec = backend_.device_count(count)) return count_ec;
  device_count_ = count;
  return device < device_count_ ? std::error_code{} : make_error_code(errc::no_device);
}

signal_pool& pool_set::signals(int device) {
  std::error_code ec;
  signal_pool* pool = signals(device, ec);
  if (pool == nullptr)
    throw error(ec, "evr::pool_set::signals(device " + std::to_string(device) + ")");
  return *pool;
}

signal_pool* pool_set::signals(int device, std::error_code& ec) noexcept {
  ec.clear();
  if (device < 0 || device >= max_devices) {
    ec = make_error_code(errc::no_device);
    return nullptr;
  }
  return get_or_create(
      signal_pools_[static_cast<std::size_t>(device)], create_mutex_, ec,
      [&] { return check_device(device); }, [&] { return new signal_pool(backend_, device); });
}

event_pool& pool_set::get(int device, event_class klass) {
  std::error_code ec;
  event_pool* pool = get(device, klass, ec);
  if (pool == nullptr) throw error(ec, get_context(device, klass));
  return *pool;
}

event_pool* pool_set::get(int device, event_class klass, std::error_code& ec) noexcept {
  ec.clear();
  if (static_cast<unsigned>(klass) >= static_cast<unsigned>(event_class_count)) {
    ec = make_error_code(errc::invalid_argument);
    return nullptr;
  }
  if (device < 0 || device >= max_devices) {
    ec = make_error_code(errc::no_device);
    return nullptr;
  }
  return get_or_create(
      pools_[static_cast<std::size_t>(device) * event_class_count + static_cast<unsigned>(klass)],
      create_mutex_, ec, [&] { return check_device(device); },
      [&] { return new event_pool(backend_, device, klass, options_); });
}

void pool_set::empty_cache() noexcept {
  for (auto& slot : pools_) {
    // acquire: a pool created concurrently is seen fully constructed (or not at all).
    if (event_pool* pool = slot.load(std::memory_order_acquire)) pool->empty_cache();
  }
}

pool_stats pool_set::stats() const noexcept {
  pool_stats sum;
  for (const auto& slot : pools_) {
    // acquire: as in empty_cache().
    if (const event_pool* pool = slot.load(std::memory_order_acquire)) {
      const pool_stats s = pool->stats();
      sum.created += s.created;
      sum.destroyed += s.destroyed;
      sum.cached += s.cached;
      sum.in_use += s.in_use;
      sum.peak_in_use += s.peak_in_use;
      sum.acquires += s.acquires;
      sum.growths += s.growths;
    }
  }
  return sum;
}

}  // namespace evr
