// The allocator for an operation that keeps a completion handler while it waits (a lane waiter,
// a GPU wait written by hand): the handler's associated allocator, or -- for the default,
// std::allocator, which a coroutine's handler has -- Asio's per-thread recycling allocator, as
// Asio's own operations do. So once an io thread's cache is warm, such an operation allocated and
// freed on that thread costs no malloc.
#pragma once

#include <memory>
#include <type_traits>

#include <asio/associated_allocator.hpp>
#include <asio/recycling_allocator.hpp>

/// The allocator of T for an operation holding a Handler (see the file comment).
template <typename Handler, typename T>
using op_allocator_t =
    std::conditional_t<std::is_same_v<asio::associated_allocator_t<Handler>, std::allocator<void>>,
                       asio::recycling_allocator<T>,
                       typename std::allocator_traits<
                           asio::associated_allocator_t<Handler>>::template rebind_alloc<T>>;

/// The allocator of T for an operation holding `h`.
template <typename T, typename Handler>
op_allocator_t<Handler, T> op_allocator(const Handler& h) {
  if constexpr (std::is_same_v<asio::associated_allocator_t<Handler>, std::allocator<void>>) {
    return op_allocator_t<Handler, T>();
  } else {
    return op_allocator_t<Handler, T>(asio::get_associated_allocator(h));
  }
}
