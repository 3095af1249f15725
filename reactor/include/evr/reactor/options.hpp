// evr/reactor/options.hpp — how a reactor learns of completions and how it idles.
#pragma once

#include <chrono>
#include <cstddef>

namespace evr {

/// How the reactor learns that the work before a wait is done. One strategy per reactor.
enum class strategy {
  /// Records a pooled event per wait and queries events (cudaEventQuery). Per stream, one query of
  /// the oldest pending event says "still pending"; when it is done the newest is queried, and if
  /// that is done too every wait of the stream retires with two queries (else: bisection).
  poll,
  /// Enqueues a 64-bit write of the wait's sequence number to a per-stream word in mapped host
  /// memory (cuStreamWriteValue64). The sweep reads memory, no driver call; a slow stream query
  /// per stream (fault_probe_interval) catches sticky faults, since a faulted stream never writes.
  fence,
  /// Enqueues a host function per wait (cudaLaunchHostFunc) that counts and wakes the reactor, so
  /// the reactor sleeps until woken. Slow (~75 us on an H100) but costs no CPU while waiting. A
  /// fault probe as for fence catches faults (host functions never run after one).
  host_func,
  /// The default: fence marks; the reactor spins while waits are young, then yields, then sleeps
  /// growing up to max_sleep; once the oldest wait of a stream is older than doorbell_after it
  /// arms one host-function doorbell on that stream and sleeps up to fault_probe_interval.
  adaptive,
};

const char* to_string(strategy s) noexcept;

struct reactor_options {
  evr::strategy strategy = strategy::adaptive;
  /// After the last progress the reactor busy-polls this long (lowest latency, one core busy).
  std::chrono::nanoseconds spin_window = std::chrono::microseconds(50);
  /// ... then polls with a yield between sweeps this long ...
  std::chrono::nanoseconds yield_window = std::chrono::microseconds(200);
  /// ... then sleeps between sweeps, doubling from 10 us up to this cap (a submission wakes it).
  std::chrono::nanoseconds max_sleep = std::chrono::microseconds(1000);
  /// adaptive: age of a stream's oldest wait after which a host-function doorbell is armed.
  std::chrono::nanoseconds doorbell_after = std::chrono::milliseconds(5);
  /// fence / host_func / adaptive: how often each stream with pending waits is probed for faults
  /// (one stream query); also the longest sleep while every pending stream has a doorbell.
  std::chrono::nanoseconds fault_probe_interval = std::chrono::milliseconds(10);
  /// stop(): how long pending waits may still complete normally before they are aborted.
  std::chrono::nanoseconds shutdown_drain = std::chrono::seconds(2);
  /// Waits on user events (stream unknown) queried per sweep at most, round robin.
  std::size_t loose_query_budget = 64;
  /// Distinct streams the reactor can track (a lock-free table of twice this size is allocated).
  std::size_t max_streams = 4096;
  /// fence / adaptive: fence markers pending on one device beyond which new waits on that device
  /// record a pooled event instead. The driver queues only so many stream memory operations
  /// behind unfinished work (about 1021 on the H100) and then blocks the enqueuing thread inside
  /// cuStreamWriteValue64; event records were seen not to block at 8192.
  std::size_t max_pending_fences = 512;
  /// Events created per pool growth (pools of the reactor's own events).
  std::size_t pool_batch = 64;
};

}  // namespace evr
