// evr/pool.hpp — everything in pool/: event pools (one device and class), the per-backend set of
// pools, and the id-based registry for language bindings. Each header below also compiles alone.
#pragma once

#include <evr/pool/event_pool.hpp>  // event_class, pool_options, pool_stats, pooled_event, event_pool
#include <evr/pool/event_registry.hpp>  // event_registry: ids for bindings (acquire/record/wait/...)
#include <evr/pool/pool_set.hpp>  // pool_set: one pool per (device, class), created on first use
