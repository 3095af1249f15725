// python/src/completion_sink.hpp — how a completion leaves the reactor thread without the GIL.
//
// The reactor thread never takes the GIL. Its inline on_complete callback stores the outcome in a
// `completion` node and pushes it onto a `completion_sink`: a lock-free intrusive stack (Treiber
// push, exchange-all take) with an eventfd that is written only by the push that finds the stack
// empty. Two kinds of sink exist:
//   * one per asyncio event loop: the loop watches the eventfd (loop.add_reader) and its reader,
//     drain_on_loop(), takes the whole batch and resolves the asyncio futures, under the GIL, on
//     the loop's thread;
//   * one process-wide resolver sink, served by the resolver thread: it takes the GIL once per
//     batch to resolve concurrent.futures.Future objects (evr.wait_future) and to drop the
//     references kept by evr.release_after.
//
// Lifetime: a node owns one reference to a Python object (`obj`), which is only ever touched
// under the GIL. A sink whose loop has closed is closed (close() under the GIL takes what is left
// and marks the stack closed); a push onto a closed sink forwards the node to the resolver sink,
// so that its reference is still dropped under the GIL. Once the resolver has stopped (interpreter
// exit), such nodes are leaked on purpose: a reference cannot be dropped without the GIL.
//
// Thread safety: push() from any thread (never blocks, never allocates, never takes the GIL);
// take() and close() only by the sink's consumer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <system_error>

#include <Python.h>

#include <evr/reactor/wait_target.hpp>

namespace evr_py {

struct completion {
  enum class kind : std::uint8_t {
    asyncio_future,     ///< resolve an asyncio.Future on its loop (skipped if cancelled)
    concurrent_future,  ///< resolve a concurrent.futures.Future (skipped if cancelled)
    release,            ///< only drop the reference (evr.release_after)
  };
  completion* next = nullptr;  ///< stack link, written before the release CAS of push()
  PyObject* obj = nullptr;     ///< one owned reference; GIL only
  std::error_code ec;          ///< the outcome, written by the reactor thread before push()
  kind what = kind::asyncio_future;
  // loop_waker's bookkeeping (asyncio futures only): all but pushed_ns on the loop's thread.
  std::int64_t pushed_ns = 0;     ///< the reactor thread's clock reading just before push()
  std::int64_t submitted_ns = 0;  ///< when the wait was submitted
  std::uintptr_t key = 0;         ///< the predictor's key: the target's handle
  std::int64_t wake_at = 0;       ///< its wake-up time (0: none); kept after leaving the schedule
  std::uint64_t wake_ticket = 0;
  std::int64_t spin_until = 0;
  // A probed wait (evr::wait_target::probed): the fence word its loop reads while polling
  // (empty: not probed). Readable while *reactor_alive (GIL).
  evr::wait_probe probe;
  /// The loop's last look at the probe that found the work not done yet (the submission before
  /// the first look; loop thread): the work ended between it and the look that found it done.
  std::int64_t probe_short_ns = 0;
  std::shared_ptr<const bool> reactor_alive;
  /// A probed wait is finished by whoever comes first: the loop, whose probe saw the word (it
  /// resolves the future and drops `obj`; the reactor's callback, later, only frees the node),
  /// or the reactor's callback (it pushes the node as usual). Exchanged by both (acq_rel): the
  /// second one learns what the first did. Only probed nodes use it.
  enum settled_by : std::uint8_t { nobody = 0, the_loop = 1, the_reactor = 2 };
  std::atomic<std::uint8_t> settled{nobody};

  /// The probe says the work is done (GIL held; false once the reactor is gone).
  bool probe_reached() const noexcept {
    return probe && reactor_alive && *reactor_alive && probe.reached();
  }
};

class completion_sink {
 public:
  /// Creates the eventfd (non-blocking, close-on-exec). Throws std::system_error on failure.
  completion_sink();
  ~completion_sink();  ///< closes the eventfd; the stack must be empty (closed sinks are)
  completion_sink(const completion_sink&) = delete;
  completion_sink& operator=(const completion_sink&) = delete;

  int fd() const noexcept { return fd_; }

  /// Pushes `c`. Writes the eventfd only when the stack was empty. On a closed sink forwards `c`
  /// to the resolver sink (see the file comment). Thread-safe, lock-free, never takes the GIL.
  void push(completion* c) noexcept;

  /// Consumer: clears the eventfd, then takes every node, oldest first (nullptr when none). The
  /// eventfd is read before the exchange: a push after the exchange writes it again, so no wake-up
  /// is lost.
  completion* take() noexcept;
  /// Consumer: takes every node, oldest first, without reading the eventfd (no system call): for
  /// a poller on the loop's thread. The eventfd stays readable if a push wrote it; the loop's
  /// reader then runs once more and clears it (and finds what came since, or nothing).
  completion* take_nodes() noexcept;

  /// Consumer: marks the sink closed and returns what it still held, oldest first.
  completion* close() noexcept;

  /// A node is waiting to be taken (acquire: a true result makes the push visible to take()).
  bool has_pending() const noexcept;

  /// Blocks (no GIL held!) until the eventfd is readable or `timeout_ms` passed (-1: forever).
  void wait_readable(int timeout_ms) const noexcept;
  /// Writes the eventfd (wakes the consumer without a node).
  void notify() const noexcept;

 private:
  static completion* reverse(completion* list) noexcept;
  std::atomic<completion*> head_{nullptr};
  int fd_ = -1;
};

/// The resolver sink (never destroyed: the reactor thread may push to it until the process ends).
completion_sink& resolver_sink() noexcept;

/// Starts the resolver thread if it is not running (GIL held). Thread-safe under the GIL.
void start_resolver();
/// Stops the resolver thread after it has served everything pushed so far, and joins it. Call with
/// the GIL held: it is released while joining. Later completions for the resolver are leaked.
void stop_resolver();
bool resolver_running() noexcept;

/// Resolves and frees every node of `list` (GIL held). Python exceptions raised while resolving
/// (a future already done, a closed loop) are cleared: a completion has nobody to report to.
void resolve_all(completion* list) noexcept;
/// Drops the references of `list` without resolving anything, and frees it (GIL held).
void discard_all(completion* list) noexcept;
/// The loop's probe saw `c`'s work done before the reactor pushed it (GIL held): resolves its
/// future with success (unless cancelled) and drops the reference. Then hands the node to whoever
/// comes second: returns true when the reactor already pushed it (the loop's drain frees it, see
/// settled_by_loop), false when the reactor's callback will free it. `c` must not be touched after
/// a false return.
bool settle_from_probe(completion* c) noexcept;
/// A node the loop settled from its probe before the reactor pushed it: only to be freed.
inline bool settled_by_loop(const completion* c) noexcept { return c->obj == nullptr; }

/// The exception for `ec` (evr._errors makes it); a new reference, or nullptr with a Python error.
PyObject* make_exception(const std::error_code& ec) noexcept;
/// Sets the Python error for `ec` (for a refused wait).
void set_python_error(const std::error_code& ec) noexcept;
/// evr._errors._from_error_code(category, value, message); set once at import.
void set_error_factory(PyObject* factory) noexcept;

}  // namespace evr_py
