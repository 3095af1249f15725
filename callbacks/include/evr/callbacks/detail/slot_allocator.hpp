// evr/callbacks/detail/slot_allocator.hpp — an allocator that hands out one fixed slot of memory
// while it is free, and the heap otherwise. Not public.
//
// Why: what the front end posts (a wait's delivery function, a poll host's polls) is allocated on
// one thread and freed on another, so a thread's recycling cache never gets it back; one posted
// function at a time per slot needs no allocation at all (Asio frees a posted function's memory
// before it calls it, so a chain that re-posts itself needs one slot).
//
// `Slot` is a small copyable handle with
//   void* take(std::size_t bytes, std::size_t align) noexcept  // its bytes, or nullptr (taken,
//                                                              // too small, too little alignment)
//   bool give_back(void* p) noexcept                           // false: p is not its bytes
//   bool operator==(const Slot&) const noexcept
// Thread safety: whatever Slot's take and give_back guarantee.
#pragma once

#include <cstddef>
#include <memory>

namespace evr::detail {

template <typename T, typename Slot>
class slot_allocator {
 public:
  using value_type = T;
  explicit slot_allocator(Slot s) noexcept : slot_(s) {}
  template <typename U>
  slot_allocator(const slot_allocator<U, Slot>& other) noexcept : slot_(other.slot_) {}  // NOLINT
  template <typename U>
  struct rebind {
    using other = slot_allocator<U, Slot>;
  };

  T* allocate(std::size_t n) {
    if (void* p = slot_.take(sizeof(T) * n, alignof(T))) return static_cast<T*>(p);
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (!slot_.give_back(p)) std::allocator<T>().deallocate(p, n);
  }
  template <typename U>
  bool operator==(const slot_allocator<U, Slot>& o) const noexcept {
    return slot_ == o.slot_;
  }
  template <typename U>
  bool operator!=(const slot_allocator<U, Slot>& o) const noexcept {
    return !(slot_ == o.slot_);
  }

 private:
  template <typename U, typename S>
  friend class slot_allocator;
  Slot slot_;
};

}  // namespace evr::detail
