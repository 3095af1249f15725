// event_registry: ids → pooled events, lock-free on the hot paths.
//
// Slots live in chunks of chunk_size, allocated on demand and never moved or freed while the
// registry lives (so a pointer to a slot stays valid, whatever the id). Each slot has one atomic
// state word:
//
//     bits 63..32  generation (never 0)   bits 31..1  users (calls in progress)   bit 0  live
//
// * acquire: take a free slot index (free_slots_, or a fresh one), fill event/pool, then publish
//   with word = gen|live (release store). id = gen << 32 | index.
// * a call on an id ("enter"): CAS word → word + users_one while live and the generation matches;
//   "leave": fetch_sub users_one.
// * release: CAS to clear live (once: a second release finds it clear → unknown id). Whoever
//   leaves the slot with neither live nor users (the releaser, or the last call in progress)
//   "finalizes": returns the event to its pool, stores word = (gen+1) (release) and pushes the
//   index onto free_slots_.
// The plain fields (event, pool) are written by the acquirer before its release store of the word
// and read only after a successful acquire-ordered RMW of the word, or by the finalizer after its
// RMW found no other user; the free-slot queue orders the finalizer before the next acquirer.
#include <evr/pool/event_registry.hpp>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <new>
#include <string>

#include "event_queue.hpp"

namespace evr {
namespace {

constexpr std::uint64_t live_bit = 1;
constexpr std::uint64_t users_one = 2;
constexpr std::uint64_t users_mask = 0xffff'fffeULL;

constexpr std::uint32_t generation_of(std::uint64_t word_or_id) noexcept {
  return static_cast<std::uint32_t>(word_or_id >> 32);
}
constexpr std::uint32_t index_of(std::uint64_t id) noexcept {
  return static_cast<std::uint32_t>(id);
}
constexpr std::uint64_t users_of(std::uint64_t word) noexcept { return (word & users_mask) >> 1; }
constexpr std::uint32_t next_generation(std::uint32_t g) noexcept {
  return g == 0xffff'ffffU ? 1 : g + 1;
}

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

std::string id_context(const char* call, std::uint64_t id) {
  return std::string("evr::event_registry::") + call + "(id " + hex(id) + ")";
}

}  // namespace

struct event_registry::slot {
  /// gen | users | live (see the file comment). Every access is commented where it happens.
  std::atomic<std::uint64_t> word{std::uint64_t{1} << 32};
  device::native_event event = nullptr;
  event_pool* pool = nullptr;
  /// Set by record; read by elapsed_time. relaxed: a hint for a clear error, not a synchronizer
  /// (the backend orders the actual record with the actual query).
  std::atomic<bool> recorded{false};
};

struct event_registry::impl {
  static constexpr unsigned chunk_bits = 10;
  static constexpr std::uint64_t chunk_size = std::uint64_t{1} << chunk_bits;
  static constexpr std::uint64_t chunk_count = max_live_ids / chunk_size;

  impl() : chunks(new std::atomic<slot*>[chunk_count]) {
    // relaxed: nothing can observe the registry before its constructor returns.
    for (std::uint64_t i = 0; i < chunk_count; ++i)
      chunks[i].store(nullptr, std::memory_order_relaxed);
  }
  ~impl() {
    for (std::uint64_t i = 0; i < chunk_count; ++i)
      delete[] chunks[i].load(std::memory_order_relaxed);
  }

  /// The slot of `id`'s index, or nullptr when that index was never handed out.
  slot* find(std::uint64_t id) const noexcept {
    if (generation_of(id) == 0) return nullptr;  // 0 is never issued
    const std::uint64_t index = index_of(id);
    if (index >= max_live_ids) return nullptr;
    // acquire: pairs with the CAS that published the chunk, so its slots are constructed.
    slot* chunk = chunks[index >> chunk_bits].load(std::memory_order_acquire);
    return chunk ? &chunk[index & (chunk_size - 1)] : nullptr;
  }

  /// A slot for a new id: a recycled one, or the next fresh index (allocating its chunk).
  slot* take_slot(std::uint32_t& index, std::error_code& ec) noexcept {
    if (free_slots.pop(index)) return find((std::uint64_t{1} << 32) | index);
    // relaxed: uniqueness of the index is all we need; the chunk is published by its CAS.
    const std::uint64_t fresh = next_index.fetch_add(1, std::memory_order_relaxed);
    if (fresh >= max_live_ids) {
      ec = std::make_error_code(std::errc::resource_unavailable_try_again);
      return nullptr;
    }
    index = static_cast<std::uint32_t>(fresh);
    std::atomic<slot*>& cell = chunks[fresh >> chunk_bits];
    slot* chunk = cell.load(std::memory_order_acquire);  // acquire: as in find()
    if (chunk == nullptr) {
      slot* made = new (std::nothrow) slot[chunk_size];
      if (made == nullptr) {
        ec = std::make_error_code(std::errc::not_enough_memory);
        return nullptr;  // this index is lost; a later one of the chunk retries the allocation
      }
      // acq_rel: release publishes the constructed slots; acquire (on failure) sees the winner's.
      if (cell.compare_exchange_strong(chunk, made, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        chunk = made;
      } else {
        delete[] made;
      }
    }
    return &chunk[fresh & (chunk_size - 1)];
  }

  /// Starts a call on `id`: false when the id is not live (never issued, released, stale).
  static bool enter(slot& s, std::uint64_t id) noexcept {
    // acquire: on success we read event/pool, published by the acquirer's release store.
    std::uint64_t w = s.word.load(std::memory_order_acquire);
    for (;;) {
      if ((w & live_bit) == 0 || generation_of(w) != generation_of(id)) return false;
      if (users_of(w) == (users_mask >> 1)) return false;  // 2^31 calls in progress: refuse
      // acq_rel on success: acquire as above; release is not needed but the RMW is one anyway.
      if (s.word.compare_exchange_weak(w, w + users_one, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        return true;
      }
    }
  }

  /// Ends a call; finalizes when the id was released meanwhile and this was the last call.
  void leave(slot& s, std::uint64_t id) noexcept {
    // acq_rel: release our use of the event to the finalizer; acquire everyone else's if we are it.
    const std::uint64_t old = s.word.fetch_sub(users_one, std::memory_order_acq_rel);
    if ((old & live_bit) == 0 && users_of(old) == 1) finalize(s, index_of(id), generation_of(old));
  }

  /// Returns the event to its pool and recycles the slot under the next generation.
  void finalize(slot& s, std::uint32_t index, std::uint32_t generation) noexcept {
    device::native_event event = s.event;
    event_pool* pool = s.pool;
    s.event = nullptr;
    s.pool = nullptr;
    pool->release_native(event);
    // release: the cleared fields happen-before the next acquirer's writes (with the queue).
    s.word.store(std::uint64_t{next_generation(generation)} << 32, std::memory_order_release);
    free_slots.push(index);  // out of memory: the slot is lost, nothing else
  }

  std::unique_ptr<std::atomic<slot*>[]> chunks;
  alignas(64) std::atomic<std::uint64_t> next_index{0};
  alignas(64) pool_detail::queue<std::uint32_t> free_slots;
};

// --- construction ------------------------------------------------------------------------------

event_registry::event_registry(device::backend& backend, pool_options options)
    : owned_pools_(std::make_unique<pool_set>(backend, options)),
      pools_(*owned_pools_),
      impl_(std::make_unique<impl>()) {}

event_registry::event_registry(pool_set& pools) : pools_(pools), impl_(std::make_unique<impl>()) {}

event_registry::~event_registry() {
  // relaxed: the destructor runs alone (contract); give back the events of ids still live.
  const std::uint64_t issued = impl_->next_index.load(std::memory_order_relaxed);
  for (std::uint64_t i = 0; i < issued && i < max_live_ids; ++i) {
    slot* chunk = impl_->chunks[i >> impl::chunk_bits].load(std::memory_order_relaxed);
    if (chunk == nullptr) continue;
    slot& s = chunk[i & (impl::chunk_size - 1)];
    if (s.word.load(std::memory_order_relaxed) & live_bit) s.pool->release_native(s.event);
  }
}

// --- error_code overloads ----------------------------------------------------------------------

event_registry::id_type event_registry::acquire(int device, event_class klass,
                                                std::error_code& ec) noexcept {
  ec.clear();
  event_pool* pool = pools_.get(device, klass, ec);
  if (pool == nullptr) return invalid_id;
  device::native_event event = pool->acquire_native(ec);
  if (event == nullptr) return invalid_id;
  std::uint32_t index = 0;
  slot* s = impl_->take_slot(index, ec);
  if (s == nullptr) {
    pool->release_native(event);
    return invalid_id;
  }
  s->event = event;
  s->pool = pool;
  s->recorded.store(false, std::memory_order_relaxed);  // relaxed: published by the store below
  // relaxed: the slot is ours (free: no users, not live); only we write the word now.
  const std::uint32_t generation = generation_of(s->word.load(std::memory_order_relaxed));
  // release: publishes event/pool to every enter() that sees the id live.
  s->word.store((std::uint64_t{generation} << 32) | live_bit, std::memory_order_release);
  return (std::uint64_t{generation} << 32) | index;
}

void event_registry::release(id_type id, std::error_code& ec) noexcept {
  ec.clear();
  slot* s = impl_->find(id);
  if (s == nullptr) {
    ec = make_error_code(errc::unknown_event_id);
    return;
  }
  // relaxed load: the CAS below re-reads; acq_rel on the CAS: release our uses, acquire the
  // finished calls' uses in case we finalize.
  std::uint64_t w = s->word.load(std::memory_order_relaxed);
  for (;;) {
    if ((w & live_bit) == 0 || generation_of(w) != generation_of(id)) {
      ec = make_error_code(errc::unknown_event_id);
      return;
    }
    if (s->word.compare_exchange_weak(w, w & ~live_bit, std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
      break;
    }
  }
  if (users_of(w) == 0) impl_->finalize(*s, index_of(id), generation_of(w));
}

namespace {

/// Runs fn(slot&) inside enter/leave, or sets unknown_event_id.
template <class Impl, class Slot, class Fn>
void with_slot(Impl& impl, std::uint64_t id, std::error_code& ec, Fn&& fn) noexcept {
  Slot* s = impl.find(id);
  if (s == nullptr || !Impl::enter(*s, id)) {
    ec = make_error_code(errc::unknown_event_id);
    return;
  }
  fn(*s);
  impl.leave(*s, id);
}

}  // namespace

void event_registry::record(id_type id, device::native_stream stream,
                            std::error_code& ec) noexcept {
  ec.clear();
  with_slot<impl, slot>(*impl_, id, ec, [&](slot& s) {
    ec = s.pool->backend().record_event(s.event, stream);
    if (!ec) s.recorded.store(true, std::memory_order_relaxed);  // relaxed: see slot::recorded
  });
}

void event_registry::wait(id_type id, device::native_stream stream, std::error_code& ec) noexcept {
  ec.clear();
  with_slot<impl, slot>(
      *impl_, id, ec, [&](slot& s) { ec = s.pool->backend().stream_wait_event(stream, s.event); });
}

bool event_registry::query(id_type id, std::error_code& ec) noexcept {
  ec.clear();
  bool done = false;
  with_slot<impl, slot>(*impl_, id, ec, [&](slot& s) {
    std::error_code q = s.pool->backend().query_event(s.event);
    if (!q)
      done = true;
    else if (!is_not_ready(q))
      ec = q;
  });
  return done;
}

void event_registry::synchronize(id_type id, std::error_code& ec) noexcept {
  ec.clear();
  with_slot<impl, slot>(*impl_, id, ec,
                        [&](slot& s) { ec = s.pool->backend().synchronize_event(s.event); });
}

device::native_event event_registry::native(id_type id, std::error_code& ec) noexcept {
  ec.clear();
  device::native_event event = nullptr;
  with_slot<impl, slot>(*impl_, id, ec, [&](slot& s) { event = s.event; });
  return event;
}

int event_registry::device_of(id_type id, std::error_code& ec) const noexcept {
  ec.clear();
  int device = -1;
  with_slot<impl, slot>(*impl_, id, ec, [&](slot& s) { device = s.pool->device(); });
  return device;
}

event_class event_registry::class_of(id_type id, std::error_code& ec) const noexcept {
  ec.clear();
  event_class klass = event_class::plain;
  with_slot<impl, slot>(*impl_, id, ec, [&](slot& s) { klass = s.pool->klass(); });
  return klass;
}

namespace {

/// elapsed_time's checks and call; `culprit` names the id an error is about.
template <class Impl, class Slot>
float elapsed_impl(Impl& impl, std::uint64_t start, std::uint64_t end, std::error_code& ec,
                   std::uint64_t& culprit) noexcept {
  ec.clear();
  culprit = start;
  Slot* a = impl.find(start);
  if (a == nullptr || !Impl::enter(*a, start)) {
    ec = make_error_code(errc::unknown_event_id);
    return 0.0f;
  }
  float ms = 0.0f;
  Slot* b = impl.find(end);
  if (b == nullptr || !Impl::enter(*b, end)) {
    culprit = end;
    ec = make_error_code(errc::unknown_event_id);
  } else {
    if (a->pool->klass() != event_class::timing) {
      ec = make_error_code(errc::timing_disabled);
    } else if (b->pool->klass() != event_class::timing) {
      culprit = end;
      ec = make_error_code(errc::timing_disabled);
    } else if (!a->recorded.load(std::memory_order_relaxed)) {  // relaxed: see slot::recorded
      ec = make_error_code(errc::event_never_recorded);
    } else if (!b->recorded.load(std::memory_order_relaxed)) {
      culprit = end;
      ec = make_error_code(errc::event_never_recorded);
    } else {
      ec = a->pool->backend().elapsed_ms(a->event, b->event, ms);
      if (ec) ms = 0.0f;
    }
    impl.leave(*b, end);
  }
  impl.leave(*a, start);
  return ms;
}

}  // namespace

float event_registry::elapsed_time(id_type start, id_type end, std::error_code& ec) noexcept {
  std::uint64_t culprit = 0;
  return elapsed_impl<impl, slot>(*impl_, start, end, ec, culprit);
}

// --- throwing overloads ------------------------------------------------------------------------

event_registry::id_type event_registry::acquire(int device, event_class klass) {
  std::error_code ec;
  const id_type id = acquire(device, klass, ec);
  if (ec) {
    std::string context = "evr::event_registry::acquire(device " + std::to_string(device) +
                          ", class " + to_string(klass) + ")";
    if (ec == std::errc::resource_unavailable_try_again) {
      context += ": more than " + std::to_string(max_live_ids) + " ids live at once";
    }
    throw error(ec, context);
  }
  return id;
}

void event_registry::release(id_type id) {
  std::error_code ec;
  release(id, ec);
  if (ec) throw error(ec, id_context("release", id));
}

void event_registry::record(id_type id, device::native_stream stream) {
  std::error_code ec;
  record(id, stream, ec);
  if (ec) {
    throw error(ec, "evr::event_registry::record(id " + hex(id) + ", stream " +
                        hex(reinterpret_cast<std::uintptr_t>(stream)) + ")");
  }
}

void event_registry::wait(id_type id, device::native_stream stream) {
  std::error_code ec;
  wait(id, stream, ec);
  if (ec) {
    throw error(ec, "evr::event_registry::wait(id " + hex(id) + ", stream " +
                        hex(reinterpret_cast<std::uintptr_t>(stream)) + ")");
  }
}

bool event_registry::query(id_type id) {
  std::error_code ec;
  const bool done = query(id, ec);
  if (ec) throw error(ec, id_context("query", id));
  return done;
}

void event_registry::synchronize(id_type id) {
  std::error_code ec;
  synchronize(id, ec);
  if (ec) throw error(ec, id_context("synchronize", id));
}

float event_registry::elapsed_time(id_type start, id_type end) {
  std::error_code ec;
  std::uint64_t culprit = 0;
  const float ms = elapsed_impl<impl, slot>(*impl_, start, end, ec, culprit);
  if (ec) {
    throw error(ec, "evr::event_registry::elapsed_time(start id " + hex(start) + ", end id " +
                        hex(end) + "): " + (culprit == end && culprit != start ? "end" : "start") +
                        " id " + hex(culprit));
  }
  return ms;
}

device::native_event event_registry::native(id_type id) {
  std::error_code ec;
  device::native_event event = native(id, ec);
  if (ec) throw error(ec, id_context("native", id));
  return event;
}

}  // namespace evr
