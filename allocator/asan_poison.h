// allocator/asan_poison.h: marks memory the allocator keeps but nothing may read
// (internal). Under AddressSanitizer, PoisonForAsan makes every access to the region
// an error ("use-after-poison", with the stack of the access) until UnpoisonForAsan;
// elsewhere both compile to nothing, so release builds pay no cost.
//
// Why: objects the allocator recycles itself (FreeIndex's spare Blocks, kept in slabs
// rather than deleted) stay valid memory to ASan, so a stale pointer to one would read
// plausible fields silently. Poisoned while unused, such a read is reported as a plain
// `delete` used to be.
//
// Contract: the region is memory this process owns; unpoison it before handing it to
// anyone (std::free included) and before running a destructor in it. ASan tracks
// 8-byte granules: a region that starts on one and whose size is a multiple of 8 is
// poisoned exactly (Blocks are 64-B aligned, 128 B).
#pragma once

#include <cstddef>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DEVMEM_ASAN 1
#endif
#endif
#if !defined(DEVMEM_ASAN) && defined(__SANITIZE_ADDRESS__)
#define DEVMEM_ASAN 1
#endif

#ifdef DEVMEM_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace devmem::internal {

// True in an AddressSanitizer build: tests of the poisoning skip themselves otherwise.
#ifdef DEVMEM_ASAN
inline constexpr bool kAsanPoisons = true;
#else
inline constexpr bool kAsanPoisons = false;
#endif

inline void PoisonForAsan([[maybe_unused]] const void* p, [[maybe_unused]] size_t bytes) {
#ifdef DEVMEM_ASAN
  ASAN_POISON_MEMORY_REGION(p, bytes);
#endif
}

inline void UnpoisonForAsan([[maybe_unused]] const void* p, [[maybe_unused]] size_t bytes) {
#ifdef DEVMEM_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, bytes);
#endif
}

}  // namespace devmem::internal
