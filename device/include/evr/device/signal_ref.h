/* evr/device/signal_ref.h — what a kernel needs to signal an evr::signal_slot: three addresses
 * on the device, constant for the slot's life (a kernel captured in a CUDA graph may signal on
 * every replay). Plain C++ without includes, so that CUDA sources compile it as they are
 * (<evr/device/signal.cuh> has the device functions that use it; evr/pool/signal_pool.hpp the
 * host side).
 */
#pragma once

namespace evr {

/// The device side of a signal slot: pass it to a kernel by value.
struct signal_ref {
  /// Device memory: how many times the slot was signalled (the kernel counts here, atomically).
  unsigned long long* counter;
  /// Device memory: blocks of the current launch that have finished (signal_from_last_block).
  unsigned int* blocks;
  /// The device address of a word in mapped host memory that the reactor reads: the count.
  unsigned long long* word;
};

}  // namespace evr
