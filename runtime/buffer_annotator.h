// runtime/buffer_annotator.h: what layers above the allocator know about live buffers.
//
// The allocator knows a live buffer's address, size, stream, site and age; the tensor
// layer (above the runtime) knows how many tensors share it and what it holds. A layer
// registers one BufferAnnotator with Runtime::set_buffer_annotator; Runtime::snapshot()
// asks it about every live buffer, after the allocators' locks are released, and the
// snapshot JSON carries the answers (docs/formats.md, "tensor" on live buffers).
//
// Thread-safety: annotate() may be called from any thread (HTTP handlers, the demo)
// while the annotating layer allocates and frees concurrently; an address it no longer
// knows is simply left out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "allocator/types.h"

namespace devmem {

struct BufferAnnotation {
  uint64_t refcount = 0;        // references to the buffer (tensor handles sharing it)
  std::string dtype;            // element type, e.g. "float32"
  std::vector<int64_t> shape;   // the shape the buffer was created with
  friend bool operator==(const BufferAnnotation&, const BufferAnnotation&) = default;
};

// Annotations of one device's live buffers, by address.
using BufferAnnotations = absl::flat_hash_map<uintptr_t, BufferAnnotation>;

class BufferAnnotator {
 public:
  virtual ~BufferAnnotator() = default;
  // Adds to *out an annotation for each address in `addrs` (live buffers of `device`)
  // that this layer owns.
  virtual void annotate(DeviceId device, const std::vector<uintptr_t>& addrs,
                        BufferAnnotations* out) const = 0;
};

}  // namespace devmem
