// tensor/storage.h: one buffer of device memory, shared by every tensor that views it.
//
// Example:
//   auto alloc = AllocatorFor(DeviceId{DeviceType::kSim, 0});  // a shared_ptr
//   StoragePtr s = Storage::Allocate(alloc, 4096, Stream{},
//                                    InternSite(loc, SiteKind::kAlloc));
//   StoragePtr t = s;  // one more reference: a relaxed increment, no allocation
//   s.reset();         // t still holds it
//   t.reset();         // the last reference: the block goes back to `alloc` now
//
//   // Memory from another library, freed by its own deleter when the last view dies:
//   StoragePtr f = Storage::WrapForeign(p, n, DeviceId{}, [](void* p) { std::free(p); });
//
// Ownership: a Storage is created with one reference, owned by the StoragePtr that
// creation returns, and deleted when the last StoragePtr to it is destroyed or reset.
// It owns exactly one of: an allocator block (freed through the allocator that made
// it, with the size it asked for: CachingAllocator::free(ptr, size); the storage keeps
// that allocator alive with a shared_ptr unless the runtime keeps it until exit
// (AllocatorRef, runtime/runtime.h), so a storage may outlive a test's allocator
// override); foreign memory with a deleter (called once, with data()); or
// foreign memory it does not own (nothing is done at the end).
//
// Why intrusive (the model is PyTorch's c10/util/intrusive_ptr.h): the count lives in
// the Storage itself, so creating a storage is one heap allocation (no shared_ptr
// control block) and a handle is one pointer, which keeps Tensor copies and views
// cheap (tensor_copy_ns, slice_ns in the benchmark).
//
// Memory orders, and why each is enough:
//   * Increment: relaxed. A thread can only copy a handle it already holds, so the
//     Storage is already visible to it, and the count cannot reach 0 meanwhile (the
//     handle being copied keeps it >= 1). Nothing else needs ordering with the copy.
//   * Decrement: acq_rel. Release: this thread's earlier uses of the storage and its
//     data (writes through a view, kernel launches) happen-before the decrement, so
//     they are ordered before the delete that follows on whichever thread brings the
//     count to 0. Acquire: the thread that brings it to 0 sees every other thread's
//     released uses before it frees the memory. (A release decrement plus an acquire
//     fence on the last one is equivalent and cheaper on weak-memory CPUs; acq_rel is
//     used because ThreadSanitizer does not model standalone fences.)
//   * Unique-owner fast path: if an acquire load reads 1, this handle is the only
//     reference in the program. No other thread can increment (it would need a handle
//     to copy, and there is none but ours; reading our handle while we destroy it is
//     a data race on the handle, the caller's bug, exactly as with shared_ptr), so the
//     count can be taken as 0 without the read-modify-write. The load is acquire so
//     that the last release-decrement by another thread (which made it 1) is ordered
//     before the free. This saves the locked RMW for temporaries (op outputs that die
//     unshared), the common case.
//
// Thread-safety: distinct StoragePtr objects may be copied, moved and destroyed
// concurrently from any threads, even when they point to the same Storage. One
// StoragePtr object must not be written while another thread reads it (the usual rule
// for shared_ptr). Storage's accessors are const and immutable after creation.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/functional/any_invocable.h"
#include "allocator/caching_allocator.h"
#include "allocator/site.h"
#include "allocator/types.h"
#include "runtime/runtime.h"

namespace devmem {

class StoragePtr;

class Storage {
 public:
  // Called once, with data(), when the last reference to a foreign storage dies. It
  // must not throw.
  using Deleter = absl::AnyInvocable<void(void*)>;

  // What the storage was created to hold, for snapshots (tensor/live_storages.h):
  // the element type's name and the shape of the tensor that asked for it.
  struct Contents {
    std::string_view dtype;  // a static string (DTypeName), "" when unknown
    absl::InlinedVector<int64_t, 6> shape;
  };

  // Allocates `bytes` on `stream` from `allocator` and records `site` on the block.
  // Throws what CachingAllocator::allocate throws (OutOfMemoryError, ...); nothing is
  // held then. bytes == 0 gives a storage with data() == nullptr. A storage with a
  // block is listed in LiveStorages (so snapshots can say how many tensors share it
  // and what it holds) until it is destroyed.
  static StoragePtr Allocate(std::shared_ptr<CachingAllocator> allocator, size_t bytes,
                             Stream stream, SiteId site, Contents contents = {});
  // The same from an AllocatorRef (AllocatorRefFor): no reference count is taken when
  // `allocator.owner` is null (the runtime keeps that allocator until exit).
  static StoragePtr Allocate(AllocatorRef allocator, size_t bytes, Stream stream,
                             SiteId site, Contents contents = {});

  // Wraps memory that devmem did not allocate, on `device`. With a deleter the storage
  // owns the memory and calls deleter(data) at the end; without one it never frees it
  // (the caller keeps it alive for as long as any tensor views it).
  static StoragePtr WrapForeign(void* data, size_t bytes, DeviceId device,
                                Deleter deleter = nullptr, Stream stream = {});

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  DeviceId device() const { return device_; }
  // The stream the block was allocated on (where it may be used at once).
  Stream stream() const { return stream_; }
  // The allocator that owns the block; nullptr for foreign memory.
  CachingAllocator* allocator() const { return allocator_; }
  bool is_foreign() const { return allocator_ == nullptr; }
  const Contents& contents() const { return contents_; }

  // Number of references. Exact when no other thread is copying or dropping one;
  // otherwise a value it had at some moment (for tests, debugging and snapshots).
  uint64_t use_count() const { return refcount_.load(std::memory_order_relaxed); }

  // Announces that work on `stream` uses this memory, so that its free waits for that
  // work (CachingAllocator::record_stream). A no-op for foreign memory and for
  // empty storages.
  void record_stream(Stream stream) const;

 private:
  friend class StoragePtr;

  Storage(void* data, size_t bytes, DeviceId device, Stream stream,
          AllocatorRef allocator, Deleter deleter) noexcept;
  // Frees the memory (allocator block or deleter). Never throws: a failure is reported
  // on stderr, since it means the allocator's books and ours disagree.
  ~Storage();

  // Invariant: refcount_ >= 1 while any StoragePtr points here; the Storage is deleted
  // by the StoragePtr whose release takes it from 1 to 0.
  std::atomic<uint64_t> refcount_{1};
  void* const data_;
  const size_t bytes_;
  const DeviceId device_;
  const Stream stream_;
  CachingAllocator* const allocator_;  // null for foreign memory
  // Keeps allocator_ alive; null when the runtime keeps it until exit (AllocatorRef).
  const std::shared_ptr<CachingAllocator> allocator_owner_;
  Deleter deleter_;                                    // only for owned foreign memory
  Contents contents_;   // set before the storage is published, then immutable
  bool listed_ = false; // in LiveStorages (set before publication, then immutable)
  // LiveStorages' intrusive list links (tensor/live_storages.h): read and written only
  // under the lock of shard live_shard_, which is fixed when the storage is listed.
  friend class LiveStorages;
  Storage* live_prev_ = nullptr;
  Storage* live_next_ = nullptr;
  uint32_t live_shard_ = 0;
};

// The handle: an owning pointer to a Storage with an intrusive count (see above).
// Cheap to copy (one relaxed increment) and to move (no atomic at all).
class StoragePtr {
 public:
  StoragePtr() noexcept = default;
  StoragePtr(const StoragePtr& other) noexcept : ptr_(other.ptr_) {
    if (ptr_ != nullptr) ptr_->refcount_.fetch_add(1, std::memory_order_relaxed);
  }
  StoragePtr(StoragePtr&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)) {}
  StoragePtr& operator=(const StoragePtr& other) noexcept {
    // Increment first, so that self-assignment and a chain that ends in this storage
    // never drop the count to 0 in between.
    StoragePtr copy(other);
    swap(copy);
    return *this;
  }
  StoragePtr& operator=(StoragePtr&& other) noexcept {
    StoragePtr moved(std::move(other));
    swap(moved);
    return *this;
  }
  ~StoragePtr() { reset(); }

  void reset() noexcept {
    if (ptr_ != nullptr) {
      Release(ptr_);
      ptr_ = nullptr;
    }
  }
  void swap(StoragePtr& other) noexcept { std::swap(ptr_, other.ptr_); }

  Storage* get() const noexcept { return ptr_; }
  Storage* operator->() const noexcept { return ptr_; }
  Storage& operator*() const noexcept { return *ptr_; }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }
  // 0 for an empty handle.
  uint64_t use_count() const noexcept { return ptr_ == nullptr ? 0 : ptr_->use_count(); }

  friend bool operator==(const StoragePtr& a, const StoragePtr& b) {
    return a.ptr_ == b.ptr_;
  }

 private:
  friend class Storage;
  // Adopts a Storage created with refcount 1.
  explicit StoragePtr(Storage* adopted) noexcept : ptr_(adopted) {}

  static void Release(Storage* s) noexcept {
    // Fast path: the only reference (see the header comment for why the acquire load
    // is enough). Otherwise the acq_rel decrement; whoever takes it to 0 deletes.
    if (s->refcount_.load(std::memory_order_acquire) == 1 ||
        s->refcount_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      Destroy(s);
    }
  }
  // Out of line: freeing is the cold path and pulls in the allocator.
  static void Destroy(Storage* s) noexcept;

  Storage* ptr_ = nullptr;
};

}  // namespace devmem
