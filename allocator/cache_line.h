// allocator/cache_line.h: heap arrays on cache lines of their own (internal).
//
// What one thread writes on its hot path (a thread cache's bins, its counter window)
// must not share a cache line with what another thread writes, or every write of one
// takes the line from the other's cache (false sharing). The heap gives no such
// promise: malloc puts a block wherever it fits, next to any other thread's. A
// LineVector's storage starts on a 64-byte line and its size is rounded up to whole
// lines, so no other object lies on its lines, wherever the heap put it.
//
// Thread-safety: that of std::vector; the allocator is stateless.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace devmem::internal {

inline constexpr size_t kCacheLine = 64;

template <typename T>
struct LineAllocator {
  using value_type = T;

  LineAllocator() = default;
  template <typename U>
  LineAllocator(const LineAllocator<U>&) {}  // NOLINT: rebinding, as std::allocator

  T* allocate(size_t n) {
    if (n > (SIZE_MAX - kCacheLine) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(::operator new(Rounded(n), std::align_val_t{kCacheLine}));
  }
  // The unsized aligned delete: the sized one is declared only with sized deallocation
  // on (clang before 19 leaves it off by default, and the fuzz build uses clang 16).
  void deallocate(T* p, size_t /*n*/) { ::operator delete(p, std::align_val_t{kCacheLine}); }
  template <typename U>
  bool operator==(const LineAllocator<U>&) const {
    return true;
  }

 private:
  static size_t Rounded(size_t n) { return (n * sizeof(T) + kCacheLine - 1) & ~(kCacheLine - 1); }
};

template <typename T>
using LineVector = std::vector<T, LineAllocator<T>>;

}  // namespace devmem::internal
