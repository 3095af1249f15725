// bench/idle_rows.hpp — the rows of `evr-bench idle`: each runs every lane of a workload as a
// closed loop (the next job launched once the previous one was seen done) with one way of
// waiting, and returns its samples (gate opened -> the waiting code knew) and CPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bench_device.hpp"
#include "idle_lanes.hpp"
#include "methods.hpp"
#include "stats.hpp"

namespace evr::bench {

/// How a posted row's completion reaches its io_context thread (gpu_waiter::set_delivery).
enum class io_delivery {
  post,             ///< delivery::post (the default: the thread polls near predicted completions)
  post_woken,       ///< delivery::post_woken (the reactor wakes the thread ahead)
  post_plain,       ///< delivery::post_plain (a plain post to a thread parked in run())
  post_plain_busy,  ///< delivery::post_plain to a thread that never sleeps (poll() in a loop)
};
const char* to_string(io_delivery d) noexcept;  ///< "post", "woken", "plain", "busy"

/// The floor: the gate kernel writes an ack to mapped memory as it ends; a thread spins on it.
row_result run_floor(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes,
                     const workload& w);

/// evr with method `m`, its callback run inline on the reactor thread (on_complete); one driver
/// thread launches the jobs. CPU: the reactor thread's.
row_result run_evr_inline(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes,
                          const workload& w, const evr_method& m);

/// evr with method `m` through a gpu_waiter on an io_context run by one thread, which also runs
/// the closed loops (its handler launches the lane's next job and waits for it, as a server's
/// coroutine does). CPU: the reactor thread's plus the io thread's outside the user's work (the
/// launches): every thread evr adds or wakes.
row_result run_evr_posted(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes,
                          const workload& w, const evr_method& m, io_delivery how);

/// What a user writes without evr: a thread per stream that launches its work and blocks.
struct baseline {
  std::string key, name;
  enum class how { blocking_sync_event, host_func_promise, stream_synchronize } kind;
};
/// CPU: the waiting threads' CPU clocks over their waits.
row_result run_baseline(bench_device& dev, std::vector<std::unique_ptr<lane>>& lanes,
                        const workload& w, const baseline& b);

/// The floor of one gate at a time after a 200 us sleep (the method of `evr-bench latency`).
series measure_floor(bench_device& dev, int samples);

}  // namespace evr::bench
