// bench/methods.hpp — the evr configurations the benchmarks compare, each with a stable key (for
// --methods and JSON) and a name a reader understands.
#pragma once

#include <string>
#include <vector>

#include <evr/reactor/options.hpp>

namespace evr::bench {

struct evr_method {
  std::string key;   ///< e.g. "default", "fence-spin"
  std::string name;  ///< e.g. "evr default (adaptive, predictive)"
  reactor_options options;
  /// The work's kernel signals an evr::signal_slot and the wait names it (a device-signalled
  /// wait), instead of a wait on the stream.
  bool signalled = false;
  /// With `signalled`: the work's kernel does not signal; it is a CUDA graph whose last node is
  /// evr's signal kernel (signal_slot::enqueue_signal: library work in a graph).
  bool graph = false;
};

/// The default; the default with device-signalled waits (the kernel signals, or a graph's last
/// node does); fence and poll spinning (the latency floor
/// of each mechanism, one core busy); host_func (no CPU while waiting, the driver's host-function
/// latency); adaptive with the older ladder idle policy (what the default was before the predictive
/// policy).
inline std::vector<evr_method> evr_methods() {
  std::vector<evr_method> m;
  m.push_back({"default", "evr default (adaptive, predictive)", reactor_options{}});
  m.push_back(
      {"signal", "evr default, device-signalled (kernel signals a slot)", reactor_options{}, true});
  m.push_back(
      {"graph-signal", "evr default, a graph's last node signals", reactor_options{}, true, true});
  reactor_options o;
  o.strategy = strategy::fence;
  o.idle = idle_mode::spin;
  m.push_back({"fence-spin", "evr fence, spinning", o});
  o.strategy = strategy::poll;
  m.push_back({"poll-spin", "evr poll, spinning", o});
  o = {};
  o.strategy = strategy::host_func;
  m.push_back({"host_func", "evr host_func", o});
  o = {};
  o.idle = idle_mode::ladder;
  m.push_back({"ladder", "evr adaptive, old ladder idle policy", o});
  return m;
}

}  // namespace evr::bench
