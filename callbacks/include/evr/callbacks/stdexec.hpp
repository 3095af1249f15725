// evr/callbacks/stdexec.hpp — evr::gpu_sender for NVIDIA's stdexec (opt-in: includes stdexec).
//
//   #include <evr/callbacks/stdexec.hpp>
//   stdexec::sync_wait(evr::async_wait<evr::stdexec_protocol>(reactor, stream));
//   auto s = evr::async_wait<evr::stdexec_protocol>(reactor, stream)
//          | stdexec::continues_on(pool.get_scheduler())   // off the reactor thread
//          | stdexec::then([] { ... });
//
// stdexec recognises a sender only through its own vocabulary: `sender_concept` must derive from
// stdexec::sender_t (or stdexec::enable_sender be specialised), and the completion signatures
// must be a stdexec::completion_signatures of stdexec's set_value_t / set_error_t /
// set_stopped_t. evr::basic_gpu_sender takes that vocabulary as its Protocol; this header names
// stdexec's. Nothing else of evr includes stdexec, and evr's build does not need it:
// scripts/ci/check-stdexec.sh builds and runs a program against a stdexec checkout.
//
// Checked with stdexec from 2026 (g++ 12 and clang 14 where stdexec builds with them; see
// scripts/ci/check-stdexec.sh). Older stdexec (2024-2025) spells the same names.
#pragma once

#include <stdexec/execution.hpp>

#include <evr/callbacks/sender.hpp>

namespace evr {

/// stdexec's vocabulary, for evr::basic_gpu_sender (evr::async_wait<evr::stdexec_protocol>).
struct stdexec_protocol {
  using sender_concept = stdexec::sender_t;                    ///< stdexec's sender tag
  using operation_state_concept = stdexec::operation_state_t;  ///< stdexec's operation state tag
  using set_value_t = stdexec::set_value_t;                    ///< value completion
  using set_error_t = stdexec::set_error_t;                    ///< error completion
  using set_stopped_t = stdexec::set_stopped_t;                ///< stopped completion
  using get_env_t = stdexec::get_env_t;                        ///< a receiver's environment
  using get_stop_token_t = stdexec::get_stop_token_t;          ///< an environment's stop token
  /// stdexec's completion-signatures template.
  template <class... Signatures>
  using completion_signatures = stdexec::completion_signatures<Signatures...>;
};

/// evr's GPU completion sender in stdexec's vocabulary.
using stdexec_gpu_sender = basic_gpu_sender<stdexec_protocol>;

}  // namespace evr
