// evr/callbacks/detail/callback_exception.hpp — what evr does with an exception thrown by user code
// that it runs on the reactor thread (an on_complete callback, a gpu_waiter handler delivered
// inline_on_reactor).
//
// There is no caller there to hand the exception to, and letting it escape would end the process
// (the reactor's completion path is noexcept) or stop every other wait of the reactor. So the
// exception is caught, reported on stderr with its what(), and dropped; the wait counts as
// delivered (its callback ran, partly) and the reactor goes on. Callbacks should still not throw:
// whatever they did not finish stays undone.
#pragma once

#include <cstdio>
#include <exception>

namespace evr::detail {

/// Reports the exception being handled (call only inside a catch block). `who` names the kind of
/// callback, e.g. "an on_complete callback". Never throws.
inline void report_callback_exception(const char* who) noexcept {
  try {
    throw;
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "evr: %s threw on the reactor thread: %s (dropped; callbacks must not throw)\n",
                 who, e.what());
  } catch (...) {
    std::fprintf(stderr,
                 "evr: %s threw on the reactor thread: an exception not derived from "
                 "std::exception (dropped; callbacks must not throw)\n",
                 who);
  }
}

}  // namespace evr::detail
