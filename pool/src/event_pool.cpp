// event_pool: events of one device and class, recycled through pool_detail::queue (moodycamel).
//
// Layout
//   pool_state     — everything shared: the cache (queue), the growth mutex, slow-path counters and
//                    `refs`, the central part of the reference count. Owned jointly by the
//                    event_pool object and by every event handed out (see "Lifetime").
//   thread_entry   — one per (thread, pool) that has used the pool: the thread's moodycamel
//                    producer and consumer tokens, its counters (`out`: acquires minus releases
//                    done by this thread, `acquires`) and `spare`, a one-event cache in front of
//                    the queue. Written by its thread only, except by the slow paths below, which
//                    hold registry_mutex().
//   thread_cache   — a thread_local list of the thread's entries, plus `tl_last`, the entry used
//                    last (the fast path compares one serial number).
//
// The fast path (a thread that releases and re-acquires): release parks the event in the entry's
// `spare` if it is empty, else enqueues it into the thread's own moodycamel sub-queue; acquire
// takes the spare, else from its own sub-queue, else from any (consumer token), else grows. With
// the spare, an acquire+release pair costs two atomic read-modify-writes (the exchange that takes
// the spare, the release's decrement of `out`); through the queue, four (moodycamel's explicit
// dequeue does two, and the take of an empty spare is skipped). Other threads take spares only on
// slow paths, under registry_mutex(): growth steals one before creating a batch, empty_cache() and
// close destroy them all, thread exit moves its spare to the queue. EVR_POOL_USE_MUTEX turns the
// spare off, so that every event goes through the mutex queue.
// (evr-bench pool on the H100 machine, 16 cores, real CUDA events: 23-25 ns per acquire+release
// pair on one thread; 300+ M pairs/s at 8 threads, about 100x a mutex+deque pool.)
//
// Lifetime (a reference count split like Linux's percpu_ref)
//   The number of events handed out and not yet released ("outstanding") is
//       refs - open_bias + sum of the entries' `out`          while the pool object lives,
//       refs                                                  after it was destroyed.
//   While the pool object lives, `refs` carries open_bias (2^62), so it can never reach zero
//   however the per-thread counts are spread (an event acquired on one thread and released on
//   another leaves +1 on one entry and -1 on the other). ~event_pool ("close") swaps every entry's
//   count for the marker `switched` (one atomic exchange each, under registry_mutex), adds the sum
//   to `refs` and removes the bias: `refs` is now the exact number of outstanding events. A release
//   that finds its entry switched (the exchange won), or that has no entry, decrements `refs`
//   instead; whoever brings it to zero frees the state. Entries never keep the state alive: when
//   the state is freed, its entries are orphaned (tokens destroyed, serial set to 0) under
//   registry_mutex and their threads delete them lazily.
//   An event released after close is destroyed rather than cached. A release racing with close
//   may still enqueue its event (or park it in its spare) after close drained the cache;
//   free_state() drains the cache and the spares once more, so such an event is destroyed at the
//   latest with the state.
//
// Memory orders are justified at each atomic operation. The invariant they protect: every use of
// the state by a thread happens-before the state is freed. Each thread's last use is followed by a
// release-ordered decrement (of its entry's `out` or of `refs`), and the thread that frees
// observed all of them through acquire-ordered read-modify-writes on the same atomics (RMWs on one
// atomic are totally ordered, and release sequences carry the earlier decrements along).
#include <evr/pool/event_pool.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "event_queue.hpp"

namespace evr {

device::event_flags flags_of(event_class c) noexcept {
  switch (c) {
    case event_class::plain: return device::event_flags::none;
    case event_class::timing: return device::event_flags::timing;
    case event_class::interprocess: return device::event_flags::interprocess;
    case event_class::blocking: return device::event_flags::blocking_sync;
  }
  return device::event_flags::none;
}

const char* to_string(event_class c) noexcept {
  switch (c) {
    case event_class::plain: return "plain";
    case event_class::timing: return "timing";
    case event_class::interprocess: return "interprocess";
    case event_class::blocking: return "blocking";
  }
  return "invalid";
}

namespace pool_detail {
namespace {

using event_queue = queue<device::native_event>;

/// Added to `refs` while the event_pool object lives.
constexpr std::int64_t open_bias = std::int64_t{1} << 62;
/// An entry's `out` after close; values >= switched_threshold mean "switched" (real counts stay
/// far below 2^61 in magnitude, so the marker survives late decrements).
constexpr std::int64_t switched = std::int64_t{1} << 62;
constexpr std::int64_t switched_threshold = std::int64_t{1} << 61;

/// The per-thread one-event cache (thread_entry::spare); off in the mutex build (bisecting).
constexpr bool use_spare = queue_is_lock_free;

/// Guards every pool_state::entries list, thread_entry::prev/next/state, the creation and
/// destruction of tokens held by entries, and close/free. Slow paths only. Never destroyed, so a
/// pool destroyed during static destruction can still take it.
std::mutex& registry_mutex() noexcept {
  static std::mutex* m = new std::mutex;
  return *m;
}

/// Serial numbers identify states in thread caches (a freed state's address may be reused).
/// relaxed: uniqueness is all that matters, and the RMW gives it.
std::atomic<std::uint64_t> next_serial{1};

}  // namespace

struct thread_entry;

struct pool_state {
  pool_state(device::backend& b, int dev, event_class k, std::size_t batch_size)
      : backend(b),
        device(dev),
        klass(k),
        flags(flags_of(k)),
        batch(batch_size),
        serial(next_serial.fetch_add(1, std::memory_order_relaxed)),
        cache(4 * 32) {}

  // Read-mostly: written once, or (`closed`) once more at close.
  device::backend& backend;
  const int device;
  const event_class klass;
  const device::event_flags flags;
  const std::size_t batch;
  const std::uint64_t serial;
  /// Set by close; read by every release. Release/acquire is not needed for correctness (the flag
  /// only steers an event to the cache or to destruction, and free_state() drains late arrivals),
  /// but costs nothing on the load side, so: store release, load acquire.
  std::atomic<bool> closed{false};

  /// Central part of the reference count (see the file comment). Touched only on slow paths:
  /// threads without an entry, releases after close, thread exit, close.
  alignas(64) std::atomic<std::int64_t> refs{open_bias};

  alignas(64) event_queue cache;

  alignas(64) std::mutex grow_mutex;
  // Slow-path counters. relaxed everywhere: statistics, read without a common lock.
  std::atomic<std::uint64_t> created{0};
  std::atomic<std::uint64_t> destroyed{0};
  std::atomic<std::uint64_t> growths{0};
  std::atomic<std::uint64_t> folded_acquires{
      0};  ///< acquires of dead entries and of threads without one
  std::atomic<std::uint64_t> peak{0};

  thread_entry* entries = nullptr;  ///< guarded by registry_mutex()
};

struct alignas(64) thread_entry {
  /// Events acquired minus released through this entry, or `switched` + junk after close.
  /// Owner's acquire: load+store (relaxed), no RMW: acquire never runs concurrently with close
  /// (the pool object must outlive its callers), and the only other writers are close and the
  /// owner's own thread exit. Owner's release: fetch_sub (release), an RMW because close may
  /// exchange it concurrently. Close and thread exit: exchange (acq_rel).
  std::atomic<std::int64_t> out{0};
  /// The one-event cache (nullptr when empty). Only the owner puts an event in (load, then store
  /// if empty); anyone may take it out, always with an exchange, and takers only ever write
  /// nullptr, so the owner's load+store cannot lose an event nor hand one out twice. The owner's
  /// store is release and a thief's exchange acquire, so what the releasing thread did with the
  /// event happens-before its reuse (as the queue guarantees).
  std::atomic<device::native_event> spare{nullptr};
  /// Written by the owner only (load+store, relaxed); read by stats().
  std::atomic<std::uint64_t> acquires{0};
  /// The state's serial, or 0 once orphaned. Written under registry_mutex; read by the owner
  /// without it (relaxed: the owner only compares it with the serial of a state it holds a
  /// reference to, which cannot be orphaned meanwhile, and any other value means "not this one").
  std::atomic<std::uint64_t> serial{0};
  pool_state* state = nullptr;
  std::optional<event_queue::producer_token> producer;  // destroyed under registry_mutex
  std::optional<event_queue::consumer_token> consumer;
  thread_entry* prev = nullptr;  ///< in state->entries, guarded by registry_mutex()
  thread_entry* next = nullptr;
};

namespace {

void link(pool_state& s, thread_entry* e) noexcept {
  e->prev = nullptr;
  e->next = s.entries;
  if (s.entries) s.entries->prev = e;
  s.entries = e;
}

void unlink(pool_state& s, thread_entry* e) noexcept {
  if (e->prev)
    e->prev->next = e->next;
  else
    s.entries = e->next;
  if (e->next) e->next->prev = e->prev;
  e->prev = e->next = nullptr;
}

/// Drops the entry's tokens and marks it orphaned. registry_mutex held.
void orphan(thread_entry* e) noexcept {
  e->producer.reset();
  e->consumer.reset();
  e->state = nullptr;
  e->serial.store(0, std::memory_order_relaxed);  // relaxed: see thread_entry::serial
}

void destroy_event(pool_state& s, device::native_event ev) noexcept {
  s.backend.destroy_event(ev);
  s.destroyed.fetch_add(1, std::memory_order_relaxed);
}

struct thread_cache {
  std::vector<thread_entry*> entries;
  ~thread_cache();
};

// constinit + trivially destructible: accessed on the fast path without a TLS init guard.
constinit thread_local thread_entry* tl_last = nullptr;
constinit thread_local bool tl_dead = false;  ///< this thread's cache was destroyed (thread exit)

thread_cache& tl_cache() {
  thread_local thread_cache cache;
  return cache;
}

/// Thread exit: fold every live entry into its state and delete all entries.
thread_cache::~thread_cache() {
  tl_last = nullptr;
  tl_dead = true;
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (thread_entry* e : entries) {
    if (e->serial.load(std::memory_order_relaxed) != 0) {
      pool_state& s = *e->state;
      unlink(s, e);
      // acq_rel: release publishes this thread's uses of the state to whoever frees it; acquire
      // is not needed here but harmless. A switched entry (pool closed) was already folded.
      const std::int64_t v = e->out.exchange(switched, std::memory_order_acq_rel);
      if (v < switched_threshold) {
        // The pool is open (close would have switched us under the same mutex), so `refs` still
        // carries open_bias and cannot reach zero here. release: as above.
        s.refs.fetch_add(v, std::memory_order_release);
        s.folded_acquires.fetch_add(e->acquires.load(std::memory_order_relaxed),
                                    std::memory_order_relaxed);
      }
      // The spare goes back to the queue (the queue is alive: the state is not freed while the
      // entry is linked). If the pool is closed, free_state() drains it from there.
      // relaxed: we are the owner (the only thread that puts into it).
      if (device::native_event spare = e->spare.exchange(nullptr, std::memory_order_relaxed)) {
        if (!s.cache.push(*e->producer, spare)) destroy_event(s, spare);
      }
      e->producer.reset();
      e->consumer.reset();
    }
    delete e;
  }
  entries.clear();
}

/// The calling thread's entry for `s`, creating it on first use; nullptr when the thread has no
/// cache any more (thread exit), when the pool is closed, or when out of memory. The caller holds
/// a reference to `s` (the pool object, or an event), so `s` is alive.
thread_entry* entry_slow(pool_state& s) noexcept {
  if (tl_dead) return nullptr;
  try {
    thread_cache& cache = tl_cache();
    for (thread_entry* e : cache.entries) {
      if (e->serial.load(std::memory_order_relaxed) == s.serial) {
        tl_last = e;
        return e;
      }
    }
    std::lock_guard<std::mutex> lock(registry_mutex());
    // Prune entries orphaned by freed states (their tokens are already gone).
    std::erase_if(cache.entries, [](thread_entry* e) {
      if (e->serial.load(std::memory_order_relaxed) != 0) return false;
      if (tl_last == e) tl_last = nullptr;
      delete e;
      return true;
    });
    // Under the mutex: close sets `closed` before it takes the mutex to switch entries, so either
    // we see it here, or close finds (and switches) the entry we link now.
    if (s.closed.load(std::memory_order_relaxed)) return nullptr;
    cache.entries.reserve(cache.entries.size() + 1);  // may throw: before anything is linked
    auto* e = new thread_entry;
    e->producer.emplace(s.cache.token_source());
    e->consumer.emplace(s.cache.token_source());
    if (!event_queue::valid(*e->producer)) {  // out of memory inside moodycamel
      e->producer.reset();
      e->consumer.reset();
      delete e;
      return nullptr;
    }
    e->state = &s;
    e->serial.store(s.serial, std::memory_order_relaxed);  // relaxed: see thread_entry::serial
    link(s, e);
    cache.entries.push_back(e);  // capacity reserved: cannot throw
    tl_last = e;
    return e;
  } catch (...) {  // bad_alloc
    return nullptr;
  }
}

inline thread_entry* entry_for(pool_state& s) noexcept {
  thread_entry* e = tl_last;
  // relaxed: see thread_entry::serial.
  if (e != nullptr && e->serial.load(std::memory_order_relaxed) == s.serial) return e;
  return entry_slow(s);
}

inline bool take(pool_state& s, thread_entry* e, device::native_event& ev) noexcept {
  return e ? s.cache.pop(*e->producer, *e->consumer, ev) : s.cache.pop(ev);
}

inline bool put(pool_state& s, thread_entry* e, device::native_event ev) noexcept {
  return e ? s.cache.push(*e->producer, ev) : s.cache.push(ev);
}

/// Outstanding events, summed over the entries. registry_mutex held; pool open.
std::int64_t in_use_locked(const pool_state& s) noexcept {
  // relaxed: a snapshot (see pool_stats).
  std::int64_t n = s.refs.load(std::memory_order_relaxed) - open_bias;
  for (const thread_entry* e = s.entries; e; e = e->next) {
    const std::int64_t v = e->out.load(std::memory_order_relaxed);
    if (v < switched_threshold) n += v;
  }
  return n < 0 ? 0 : n;
}

void note_peak(pool_state& s, std::uint64_t in_use) noexcept {
  // relaxed: a statistic; writers hold registry_mutex, so load+store does not lose a maximum.
  if (in_use > s.peak.load(std::memory_order_relaxed))
    s.peak.store(in_use, std::memory_order_relaxed);
}

/// Takes every thread's spare. registry_mutex held.
void steal_spares_locked(pool_state& s, std::vector<device::native_event>& out) noexcept {
  for (thread_entry* e = s.entries; e; e = e->next) {
    // relaxed load: a hint; acquire exchange: see thread_entry::spare.
    if (e->spare.load(std::memory_order_relaxed) == nullptr) continue;
    if (device::native_event spare = e->spare.exchange(nullptr, std::memory_order_acquire)) {
      try {
        out.push_back(spare);
      } catch (const std::bad_alloc&) {
        e->spare.store(spare, std::memory_order_relaxed);  // leave it where it was
      }
    }
  }
}

/// Destroys every spare of `s` (empty_cache, close, free).
void destroy_spares(pool_state& s) noexcept {
  std::vector<device::native_event> spares;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    steal_spares_locked(s, spares);
  }
  for (device::native_event spare : spares)
    destroy_event(s, spare);  // outside the mutex: may block
}

/// Takes one spare of another thread, or nullptr. registry_mutex held.
device::native_event steal_one_spare_locked(pool_state& s) noexcept {
  for (thread_entry* e = s.entries; e; e = e->next) {
    if (e->spare.load(std::memory_order_relaxed) == nullptr) continue;  // relaxed: a hint
    // acquire: see thread_entry::spare.
    if (device::native_event spare = e->spare.exchange(nullptr, std::memory_order_acquire))
      return spare;
  }
  return nullptr;
}

void empty_cache(pool_state& s) noexcept {
  destroy_spares(s);
  device::native_event ev = nullptr;
  while (s.cache.pop(ev)) destroy_event(s, ev);
}

/// The last reference is gone: orphan the entries, destroy what is left in the cache, free.
void free_state(pool_state* s) noexcept {
  std::vector<device::native_event> spares;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    steal_spares_locked(*s, spares);
    while (thread_entry* e = s->entries) {
      if (device::native_event spare = e->spare.exchange(nullptr, std::memory_order_acquire)) {
        destroy_event(*s, spare);  // only when steal_spares_locked ran out of memory
      }
      unlink(*s, e);
      orphan(e);
    }
  }
  for (device::native_event spare : spares) destroy_event(*s, spare);
  // Events released while the pool was closing (see the file comment).
  device::native_event ev = nullptr;
  while (s->cache.pop(ev)) destroy_event(*s, ev);
  delete s;
}

/// Counts one event handed out.
inline void note_acquire(pool_state& s, thread_entry* e) noexcept {
  if (e) {
    // load+store, relaxed: see thread_entry::out (acquire never races with close, and the owner
    // is the only other writer); an increment never frees anything, and the event itself was
    // handed over by the queue.
    e->out.store(e->out.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    // relaxed, load+store: only this thread writes it.
    e->acquires.store(e->acquires.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  } else {
    s.refs.fetch_add(1, std::memory_order_relaxed);  // relaxed: as above
    s.folded_acquires.fetch_add(1, std::memory_order_relaxed);
  }
}

/// Counts one event given back; may free the state (the caller must not touch `s` afterwards).
inline void drop_ref(pool_state& s, thread_entry* e) noexcept {
  if (e) {
    // release: publishes this thread's use of the state to close's exchange (acq_rel), which
    // then passes it on through `refs` to whoever frees.
    const std::int64_t old = e->out.fetch_sub(1, std::memory_order_release);
    if (old < switched_threshold) return;  // pool open when we decremented: nothing can be freed
  }
  // acq_rel: release our uses; acquire everyone else's before a possible free.
  if (s.refs.fetch_sub(1, std::memory_order_acq_rel) == 1) free_state(&s);
}

/// Creates a batch on the calling thread; returns one event (nullptr and ec on failure).
device::native_event grow(pool_state& s, thread_entry* e, std::error_code& ec) noexcept {
  std::lock_guard<std::mutex> lock(s.grow_mutex);
  device::native_event ev = nullptr;
  if (take(s, e, ev)) return ev;  // another grower refilled the cache while we waited
  if (use_spare) {
    std::lock_guard<std::mutex> reg(registry_mutex());
    if ((ev = steal_one_spare_locked(s)) != nullptr) return ev;  // another thread's idle spare
  }

  std::vector<device::native_event> made;
  try {
    made.reserve(s.batch);
  } catch (const std::bad_alloc&) {
    // Fall back to a batch of one (no vector needed).
  }
  const std::size_t want = made.capacity() >= s.batch ? s.batch : 1;
  device::native_event first = nullptr;
  std::size_t count = 0;
  for (std::size_t i = 0; i < want; ++i) {
    device::native_event created = nullptr;
    std::error_code err = s.backend.create_event(s.device, s.flags, created);
    if (err || created == nullptr) {
      if (count == 0) ec = err ? err : make_error_code(errc::invalid_argument);
      break;
    }
    if (count++ == 0)
      first = created;
    else
      made.push_back(created);  // capacity reserved
  }
  if (count == 0) return nullptr;
  s.created.fetch_add(count, std::memory_order_relaxed);
  s.growths.fetch_add(1, std::memory_order_relaxed);
  if (!made.empty()) {
    const bool ok = e ? s.cache.push_bulk(*e->producer, made.data(), made.size())
                      : s.cache.push_bulk(made.data(), made.size());
    if (!ok) {
      for (device::native_event x : made) destroy_event(s, x);
    }
  }
  {
    std::lock_guard<std::mutex> reg(registry_mutex());
    note_peak(s, static_cast<std::uint64_t>(in_use_locked(s)) + 1);  // +1: the one we return
  }
  return first;
}

device::native_event acquire(pool_state& s, std::error_code& ec) noexcept {
  ec.clear();
  thread_entry* e = entry_for(s);
  device::native_event ev = nullptr;
  // relaxed load: a hint that skips the RMW when empty. relaxed exchange: only this thread puts
  // events in, so the value it reads is our own release's (a thief only ever writes nullptr).
  if (use_spare && e != nullptr && e->spare.load(std::memory_order_relaxed) != nullptr) {
    ev = e->spare.exchange(nullptr, std::memory_order_relaxed);
    if (ev != nullptr) {
      note_acquire(s, e);
      return ev;
    }
  }
  if (!take(s, e, ev)) {
    ev = grow(s, e, ec);
    if (ev == nullptr) return nullptr;
  }
  note_acquire(s, e);
  return ev;
}

void release(pool_state& s, device::native_event ev) noexcept {
  thread_entry* e = entry_for(s);
  // acquire: see pool_state::closed.
  if (s.closed.load(std::memory_order_acquire)) {
    destroy_event(s, ev);
  } else if (use_spare && e != nullptr && e->spare.load(std::memory_order_relaxed) == nullptr) {
    // relaxed load: only we put events in, so "empty" stays true until our store. release store:
    // pairs with a thief's acquire exchange (see thread_entry::spare).
    e->spare.store(ev, std::memory_order_release);
  } else if (!put(s, e, ev)) {
    destroy_event(s, ev);
  }
  drop_ref(s, e);  // last touch of `s`
}

void close(pool_state* s) noexcept {
  s->closed.store(true, std::memory_order_release);  // see pool_state::closed
  std::int64_t outstanding = 0;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (thread_entry* e = s->entries; e; e = e->next) {
      // acq_rel: acquire the owner's earlier (release) decrements; the exchange is ordered with
      // every owner RMW, so each later one sees `switched` and goes to `refs` instead.
      outstanding += e->out.exchange(switched, std::memory_order_acq_rel);
    }
  }
  empty_cache(*s);
  const std::int64_t delta = outstanding - open_bias;
  // acq_rel: as in drop_ref.
  if (s->refs.fetch_add(delta, std::memory_order_acq_rel) + delta == 0) free_state(s);
}

}  // namespace
}  // namespace pool_detail

// --- pooled_event ------------------------------------------------------------------------------

pooled_event::pooled_event(pooled_event&& other) noexcept
    : state_(other.state_), native_(other.native_) {
  other.state_ = nullptr;
  other.native_ = nullptr;
}

pooled_event& pooled_event::operator=(pooled_event&& other) noexcept {
  if (this != &other) {
    release();
    state_ = other.state_;
    native_ = other.native_;
    other.state_ = nullptr;
    other.native_ = nullptr;
  }
  return *this;
}

pooled_event::~pooled_event() { release(); }

int pooled_event::device() const noexcept { return state_ ? state_->device : -1; }

event_class pooled_event::klass() const noexcept {
  return state_ ? state_->klass : event_class::plain;
}

void pooled_event::release() noexcept {
  if (native_ == nullptr) return;
  pool_detail::pool_state* s = state_;
  device::native_event ev = native_;
  state_ = nullptr;
  native_ = nullptr;
  pool_detail::release(*s, ev);
}

// --- event_pool --------------------------------------------------------------------------------

event_pool::event_pool(device::backend& backend, int device, event_class klass,
                       pool_options options)
    : state_(nullptr) {
  if (options.batch == 0) {
    throw error(make_error_code(errc::invalid_argument),
                "evr::event_pool(device " + std::to_string(device) + ", class " + to_string(klass) +
                    "): batch must be at least 1");
  }
  if (static_cast<unsigned>(klass) >= static_cast<unsigned>(event_class_count)) {
    throw error(make_error_code(errc::invalid_argument),
                "evr::event_pool(device " + std::to_string(device) + "): invalid event class " +
                    std::to_string(static_cast<unsigned>(klass)));
  }
  state_ = new pool_detail::pool_state(backend, device, klass, options.batch);
  pool_detail::thread_entry* e = options.initial ? pool_detail::entry_for(*state_) : nullptr;
  for (std::size_t i = 0; i < options.initial; ++i) {
    device::native_event ev = nullptr;
    std::error_code ec = backend.create_event(device, state_->flags, ev);
    if (ec || ev == nullptr) {
      pool_detail::close(state_);
      state_ = nullptr;
      throw error(ec ? ec : make_error_code(errc::invalid_argument),
                  "evr::event_pool(device " + std::to_string(device) + ", class " +
                      to_string(klass) + "): creating initial event " + std::to_string(i + 1) +
                      " of " + std::to_string(options.initial));
    }
    state_->created.fetch_add(1, std::memory_order_relaxed);
    if (!pool_detail::put(*state_, e, ev)) pool_detail::destroy_event(*state_, ev);
  }
}

event_pool::~event_pool() {
  if (state_) pool_detail::close(state_);
}

pooled_event event_pool::acquire() {
  std::error_code ec;
  pooled_event ev = acquire(ec);
  if (ec) {
    throw error(ec, "evr::event_pool::acquire(device " + std::to_string(state_->device) +
                        ", class " + to_string(state_->klass) + ")");
  }
  return ev;
}

pooled_event event_pool::acquire(std::error_code& ec) noexcept {
  device::native_event ev = pool_detail::acquire(*state_, ec);
  if (ev == nullptr) return {};
  return pooled_event(state_, ev);
}

device::native_event event_pool::acquire_native(std::error_code& ec) noexcept {
  return pool_detail::acquire(*state_, ec);
}

void event_pool::release_native(device::native_event event) noexcept {
  if (event != nullptr) pool_detail::release(*state_, event);
}

void event_pool::discard_native(device::native_event event) noexcept {
  // Accounted like a release, but the event is destroyed instead of cached (see the header).
  if (event == nullptr) return;
  pool_detail::thread_entry* e = pool_detail::entry_for(*state_);
  pool_detail::destroy_event(*state_, event);
  pool_detail::drop_ref(*state_, e);
}

void event_pool::empty_cache() noexcept {
  {
    std::lock_guard<std::mutex> lock(pool_detail::registry_mutex());
    pool_detail::note_peak(*state_,
                           static_cast<std::uint64_t>(pool_detail::in_use_locked(*state_)));
  }
  pool_detail::empty_cache(*state_);
}

pool_stats event_pool::stats() const noexcept {
  pool_detail::pool_state& s = *state_;
  pool_stats st;
  std::lock_guard<std::mutex> lock(pool_detail::registry_mutex());
  // relaxed everywhere: a snapshot (see pool_stats).
  std::uint64_t acquires = s.folded_acquires.load(std::memory_order_relaxed);
  std::uint64_t spares = 0;
  for (const pool_detail::thread_entry* e = s.entries; e; e = e->next) {
    acquires += e->acquires.load(std::memory_order_relaxed);
    if (e->spare.load(std::memory_order_relaxed) != nullptr) ++spares;
  }
  st.in_use = static_cast<std::uint64_t>(pool_detail::in_use_locked(s));
  pool_detail::note_peak(s, st.in_use);
  st.created = s.created.load(std::memory_order_relaxed);
  st.destroyed = s.destroyed.load(std::memory_order_relaxed);
  st.cached = s.cache.size_approx() + spares;
  st.peak_in_use = s.peak.load(std::memory_order_relaxed);
  st.acquires = acquires;
  st.growths = s.growths.load(std::memory_order_relaxed);
  return st;
}

int event_pool::device() const noexcept { return state_->device; }
event_class event_pool::klass() const noexcept { return state_->klass; }
device::backend& event_pool::backend() const noexcept { return state_->backend; }

}  // namespace evr
