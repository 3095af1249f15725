// bench/bench_device.hpp — what the benchmarks need from a device: a backend and a "gate" kernel
// that holds a stream until the host opens it (the method of ../shared/probes/gpu_limits.cu).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include <evr/device/backend.hpp>

namespace evr::bench {

class bench_device {
 public:
  virtual ~bench_device() = default;
  virtual device::backend& backend() = 0;
  /// "cuda" or "sim", and a line naming the device.
  virtual std::string name() const = 0;
  virtual std::string describe() const = 0;
  /// Gates: independent flags (one 64-byte line each) that gate kernels spin on until the host
  /// opens them; gate 0 always exists. Makes gates 0..count-1 usable; must not be called while a
  /// gate kernel may still be running.
  virtual void reserve_gates(std::size_t count) = 0;
  /// Closes gate `gate` (and clears the ack) for the next sample.
  virtual void close_gate(std::size_t gate = 0) = 0;
  /// Enqueues on `stream` a one-thread kernel spinning until open_gate(gate); with `ack`, the
  /// kernel writes the ack word (host-visible) just before it exits.
  virtual void launch_gate(device::native_stream stream, bool ack, std::size_t gate = 0) = 0;
  /// The same gate kernel, signalling `done` (an evr::signal_slot's ref) as it ends instead of
  /// writing the ack: the kernel of a device-signalled wait.
  virtual void launch_gate_signalling(device::native_stream stream, std::size_t gate,
                                      const signal_ref& done) = 0;
  /// The gate kernel as library work in a CUDA graph: a graph of the plain gate kernel and, as its
  /// last node, evr's signal kernel (backend::enqueue_signal), made once per (stream, gate, slot)
  /// and launched. The simulated device has no graphs: there it is launch_gate_signalling.
  virtual void launch_gate_graph_signalling(device::native_stream stream, std::size_t gate,
                                            const signal_ref& done) = 0;
  virtual void open_gate(std::size_t gate = 0) = 0;
  /// The ack word the gate kernel writes (floor measurement); each gate has its own.
  virtual bool acked(std::size_t gate = 0) const = 0;
  /// Enqueues a kernel that runs about `microseconds` on `stream`.
  virtual void launch_busy(device::native_stream stream, unsigned microseconds) = 0;
  /// Enqueues a near-empty kernel.
  virtual void launch_tiny(device::native_stream stream) = 0;
};

/// "cuda" (needs a GPU and the kernels), "sim", or "auto" (cuda when available). Throws
/// std::runtime_error naming what is missing.
std::unique_ptr<bench_device> make_bench_device(const std::string& which);

}  // namespace evr::bench
