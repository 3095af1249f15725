// evr/reactor/options.hpp — how a reactor learns of completions and how it idles. Each option
// says what it does and what it costs; measured figures are in docs/benchmarks.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string_view>

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
  /// the reactor sleeps until woken. Slow (the driver's host-function thread adds tens of us) but
  /// costs no CPU while waiting. A fault probe as for fence catches faults (host functions never
  /// run after one).
  host_func,
  /// The default: fence marks, the predictive idle policy (idle_mode::predictive), and, for a
  /// wait the prediction does not cover (the first waits of a stream, a missed prediction) once it
  /// is older than doorbell_after, one host-function doorbell on its stream so that the driver
  /// wakes the reactor instead of naps.
  adaptive,
};

/// The strategy's name: "poll", "fence", "host_func" or "adaptive" (static storage).
const char* to_string(strategy s) noexcept;
/// "poll", "fence", "host_func" or "adaptive"; std::nullopt for anything else.
std::optional<evr::strategy> strategy_from_string(std::string_view name) noexcept;

/// How the reactor thread waits while waits are pending (strategy::host_func always sleeps until
/// a host function wakes it, whatever this says).
enum class idle_mode {
  /// Learns per stream how long the GPU takes to reach a wait, sleeps until shortly before the
  /// earliest predicted completion, then polls until it arrives (hybrid polling). Near the
  /// polling floor for steady work of any length at a fraction of a core; irregular work is
  /// polled every poll_period inside the range it was seen to take. The default.
  predictive,
  /// Busy-polls spin_window after the last progress, yields yield_window, then naps doubling from
  /// 10 us up to max_sleep. Cheap, but work of a millisecond or more is found up to max_sleep
  /// late. Kept for comparison.
  ladder,
  /// Never sleeps while waits are pending: the lowest latency, one core busy.
  spin,
};

/// The idle mode's name: "predictive", "ladder" or "spin" (static storage).
const char* to_string(idle_mode m) noexcept;
/// "predictive", "ladder" or "spin"; std::nullopt for anything else.
std::optional<idle_mode> idle_mode_from_string(std::string_view name) noexcept;

/// Every duration must be >= 0 and spin_fraction and poll_budget in [0, 1]; the reactor's
/// constructor refuses anything else with std::invalid_argument naming the option.
struct reactor_options {
  /// How the reactor learns that a wait's work is done; see strategy.
  evr::strategy strategy = strategy::adaptive;
  /// How the reactor waits while waits are pending; see idle_mode.
  idle_mode idle = idle_mode::predictive;
  /// predictive: how long a stream's waits are busy-polled before its model has learned anything
  /// (its first few waits): short work is found at once; longer work is then looked at with naps
  /// of a quarter of its age. ladder: busy-poll this long after the last progress.
  std::chrono::nanoseconds spin_window = std::chrono::microseconds(50);
  /// ladder: then poll with a yield between sweeps this long ...
  std::chrono::nanoseconds yield_window = std::chrono::microseconds(200);
  /// ladder: ... then nap between sweeps, doubling from 10 us up to this cap. predictive: the
  /// longest nap while a stream's model is learning or after a missed prediction.
  std::chrono::nanoseconds max_sleep = std::chrono::microseconds(1000);
  /// predictive: the nap between looks while a completion is expected but its time is too
  /// uncertain to spin through (irregular work): the period of the poll tick. Each nap costs the
  /// reactor a few us of CPU (a futex wait and wake), and the completion is found half a period
  /// late on average. Many streams on the tick stretch it (poll_looks_per_second).
  std::chrono::nanoseconds poll_period = std::chrono::microseconds(50);
  /// predictive: spin through the window in which a completion is expected when the work is
  /// steady: the spread of its recent service times is at most this fraction of the longest (or
  /// at most two poll_periods); otherwise poll the window every poll_period. Spinning costs about
  /// the spread per completion. Higher: lower latency for jittery work, more CPU.
  double spin_fraction = 0.25;
  /// predictive: streams looked at per second, at most, on the poll tick (the one sweep, every
  /// poll_period, that looks at every stream whose irregular work is in its window); 0: no limit.
  /// With more streams on the tick than poll_period allows at this rate, the ticks are spaced
  /// further apart: 64 streams at the default are looked at every 160 us instead of 50; up to 20
  /// streams, the default changes nothing. Why: with event markers (more busy streams than
  /// hardware queues) each look is a driver query, and looking at many streams of irregular work
  /// every poll_period takes most of a core. Higher: lower latency for many streams of irregular
  /// work, more CPU.
  std::size_t poll_looks_per_second = 400000;
  /// predictive: the share of one core that the poll tick's sweeps may take, measured (each
  /// tick's sweep is timed); 0 (default): no limit. The ticks are then spaced by the sweep's mean
  /// time / poll_budget, so a tick's sweep of many busy streams (tens of us) spaces them by
  /// milliseconds at a small budget: latency of the same order. For users who must bound the CPU
  /// whatever the latency.
  double poll_budget = 0.0;
  /// predictive: how long before the earliest predicted completion the reactor is awake and
  /// polling. A thread that has just woken runs its first microseconds slower (cold caches, a
  /// core coming out of an idle state), which shows as latency when the completion comes at once.
  /// Costs this much spinning per predicted completion.
  std::chrono::nanoseconds prespin = std::chrono::microseconds(10);
  /// predictive: the longest single sleep that ends right before a predicted completion. A
  /// longer sleep towards a window is cut short so that its last `final_sleep` is slept again on
  /// its own. Why: how late a timed sleep wakes grows with its length on some hosts (the idle
  /// state the core enters; a virtual CPU halted for long), and a late wake-up is a late
  /// completion (docs/notebook.md, "Where the tail comes from"). Costs one more wake-up (a few
  /// us of CPU) per predicted completion of work longer than it. 0: no cut.
  std::chrono::nanoseconds final_sleep = std::chrono::microseconds(250);
  /// Batching under load: after a pass that delivered completions, the reactor naps until
  /// `coalesce` after that pass began (a submission or a host function ends the nap early), so
  /// that the next pass finds a batch instead of the one or two completions the GPU produced
  /// since. Why: a GPU that works through a queue of markers completes one every microsecond or
  /// two, and a reactor that keeps up pays a whole pass (sweep, delivery) for each. Costs up to
  /// `coalesce` plus the host's timer lateness of latency for completions that come while it
  /// naps; only passes that delivered are followed by such a nap, so a lone completion is found
  /// as before. 0 (default): sweep again at once. For throughput-bound users (stress tests, batch
  /// pipelines), not for latency-bound ones.
  std::chrono::nanoseconds coalesce{0};
  /// adaptive: age of a wait that the prediction does not cover after which one host-function
  /// doorbell is armed on its stream (ladder: age of the stream's oldest wait). For a stream
  /// whose work was learned (a missed prediction), at least twice its longest work: a doorbell
  /// delays the stream's next work until it has run.
  std::chrono::nanoseconds doorbell_after = std::chrono::milliseconds(5);
  /// fence / host_func / adaptive: how often each stream with pending waits is probed for faults
  /// (one stream query) when it makes no progress; the reactor never sleeps past a probe that is
  /// due.
  std::chrono::nanoseconds fault_probe_interval = std::chrono::milliseconds(10);

  /// stop(): how long pending waits may still complete normally before they are aborted.
  std::chrono::nanoseconds shutdown_drain = std::chrono::seconds(2);
  /// Waits on user events (stream unknown) queried per sweep at most, round robin.
  std::size_t loose_query_budget = 64;
  /// Distinct streams the reactor can track (a lock-free table of twice this size is allocated).
  std::size_t max_streams = 4096;
  /// fence / adaptive: fence markers pending on one device beyond which new waits on that device
  /// record a pooled event instead. The driver queues only so many stream memory operations
  /// behind unfinished work (about a thousand per device) and then blocks the enqueuing thread
  /// inside cuStreamWriteValue64; event records were seen not to block.
  std::size_t max_pending_fences = 512;
  /// delivery::post on an io_context: the context's thread finds near their predicted end also
  /// the waits whose marker is an event (a driver query per look), not only those of fence words
  /// (a memory read): the io thread queries its own waits and the reactor sleeps through their
  /// windows, instead of the reactor finding them and posting to a thread that is parked. Matters
  /// with more streams than hardware queues (max_fence_streams), where waits record events.
  /// false: the reactor finds event-marker waits and posts them.
  bool host_event_waits = true;
  /// delivery::post on an io_context: a pass of the context's thread over its due streams that
  /// has found a completion and has run this long stops, delivers what it found and leaves its
  /// other due looks to its next pass, which comes right after the completions' handlers. Why:
  /// the handlers run only once the pass has ended, and with event markers each look is a driver
  /// query (about half a microsecond): 16 streams in lockstep made each pass 8 us long, and every
  /// completion it found waited for the rest of it. Only passes that made driver queries, on a
  /// thread that is not saturated (its polls do not wait long behind other handlers): passes of
  /// memory reads (fence words, signals) are cheaper whole. 0: deliver after the first
  /// completion found.
  std::chrono::nanoseconds host_pass_deliver_after = std::chrono::microseconds(2);
  /// fence / adaptive: streams with waits per device up to which waits get fence markers; once a
  /// device has more streams that evr has waited on, new waits there record pooled events
  /// instead (the sweep queries them). A fence write holds the hardware queue it is in until the
  /// work before it on its stream is done, and the driver gives each stream one of a few
  /// hardware queues when the stream is made (8 unless CUDA_DEVICE_MAX_CONNECTIONS says
  /// otherwise, 32 at most): with more streams than queues, streams share queues, and fences
  /// would hold up unrelated streams' work (hundreds of us at p99 with 16 streams). Costs a driver
  /// query per look at such a stream instead of a memory read; a server with many streams sets
  /// CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts, or uses device-signalled waits
  /// (signal_slot). 0: the backend's number of hardware queues (CUDA: CUDA_DEVICE_MAX_CONNECTIONS
  /// or 8; simulated device: no limit). SIZE_MAX: no limit.
  std::size_t max_fence_streams = 0;
  /// fence / adaptive: past max_fence_streams, a new wait's fence word is written by evr's fence
  /// kernel (device::backend::write_fence_by_kernel: a programmatic dependent launch, compute
  /// capability 9.0) instead of an event being recorded, on devices that can run it. Behind a
  /// kernel the fence kernel holds no hardware queue, so a look stays a memory read however many
  /// streams are busy; behind a copy or a host function it waits in the queue until that work is
  /// done, as a fence write does. It costs the waiting thread a kernel launch (about 3.5 us on an
  /// H200) where an event record costs 0.2-0.5 us and the first query of a done event 1.4-4 us.
  /// The kernel is loaded where the program chooses, never by a wait: the reactor's constructor
  /// loads it on the devices the process already uses (their primary context is active), and
  /// reactor::prepare_device on any other; a device without it records events (so a reactor made
  /// before the process's first CUDA call uses the kernel only after prepare_device). poll and
  /// host_func never load it. CUDA's load of a module waits for the kernels running on the device
  /// and holds up other threads' CUDA calls meanwhile (bench/studies/module_load.cu), so make the
  /// reactor, or prepare the device, before launching kernels that wait for the host; the load
  /// happens once per device and process (the first time, 10-70 ms of the driver compiling it).
  /// Off by default: the launch moves the cost of a wait from whoever looks (the reactor, another
  /// core) to the waiting thread, and where that thread is the bottleneck (an asyncio loop with 64
  /// tasks of 0.5 ms work) it served 13 % fewer requests; turn it on for the latency of many
  /// streams (lockstep p50 halved).
  bool kernel_fences = false;
  /// Events created per pool growth (pools of the reactor's own events).
  std::size_t pool_batch = 64;
};

}  // namespace evr
