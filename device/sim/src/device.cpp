// sim::device: construction, destruction and identity (the parts are described in impl.hpp).
#include <stdexcept>
#include <string>

#include "impl.hpp"

namespace evr::sim {

namespace {
options checked(options opts) {
  if (opts.query_cost.count() < 0)
    throw std::invalid_argument("evr::sim::options::query_cost must not be negative (got " +
                                std::to_string(opts.query_cost.count()) + " ns)");
  return opts;
}
}  // namespace

device::device(options opts) : impl_(std::make_unique<impl>(checked(opts))) {}

device::~device() {
  // Every worker stops (pending work is dropped; a running body or host function finishes) and
  // is joined before the tables it uses go away.
  impl_->sched.stop_all();
}

run_mode device::mode() const noexcept { return impl_->opts.mode; }

std::string_view device::name() const noexcept { return "sim"; }

bool device::is_simulated() const noexcept { return true; }

std::string device::describe() const {
  return "simulated device x" + std::to_string(impl_->gpus) +
         (impl_->threaded() ? " (threaded)" : " (manual)");
}

}  // namespace evr::sim
