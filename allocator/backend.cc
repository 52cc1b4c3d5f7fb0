// allocator/backend.cc: the stream-callback marker of backend.h (the rest of the Backend
// contract is an interface).
#include "allocator/backend.h"

namespace devmem {
namespace internal {
// Per thread; only its own thread reads or writes it.
constinit thread_local bool tls_in_stream_callback = false;
}  // namespace internal
using internal::tls_in_stream_callback;

StreamCallbackScope::StreamCallbackScope() : previous_(tls_in_stream_callback) {
  tls_in_stream_callback = true;
}

StreamCallbackScope::~StreamCallbackScope() { tls_in_stream_callback = previous_; }

}  // namespace devmem
