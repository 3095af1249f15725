// /busy?us=D[&seed=S]: a kernel of known duration on a small slice of the GPU.
//
// One block of 32 threads computes busy_math's answer for `seed`, then spins on the GPU's clock
// (%globaltimer) until D microseconds have passed since it started, and writes the answer into
// mapped pinned host memory (no copy follows: one CUDA call per request), where the server checks
// it against busy_math::reference. One block uses a sliver of one SM, so
// many such kernels run at once on different streams: with D well above the few microseconds a
// request costs the CPU, the GPU's time, not the server's, decides how many requests finish per
// second. The synthetic knob of the server study (scripts/study/server-study.py).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "params.hpp"

namespace busy {

struct spec {
  std::uint32_t us = 0;  ///< how long the kernel runs, in microseconds
  std::uint32_t seed = 1;
};

/// Reads `us` (required, 1..max_us) and `seed` from decoded query parameters. On bad input returns
/// a message fit for a 400 response ("us must be a whole number from 1 to 100000, not 'abc'").
std::optional<std::string> parse(const params::list& query, std::uint32_t max_us, spec& out);

}  // namespace busy
