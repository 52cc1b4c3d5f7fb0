// tests/consumer/consumer.cc: devmem's C++ libraries as another project uses them. A
// caching allocator on a 64 MiB sim device, and a tensor on the runtime's default
// device (DEVMEM_CONF, set by the test to the sim device). Exit status 0 when every
// figure is what it must be; otherwise the figure that is not, on stderr.
#include <cstdio>
#include <cstring>

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "devmem/devmem_version.h"
#include "tensor/factories.h"
#include "tensor/ops.h"

int main() {
  devmem::Config config;
  config.backend = devmem::BackendKind::kSim;
  config.sim_capacity = size_t{64} << 20;
  devmem::CachingAllocator alloc(devmem::MakeSimBackend(config), config);
  void* p = alloc.allocate(size_t{1} << 20);
  const int64_t allocated = alloc.stats().allocated_bytes[devmem::kAggregatePool].current;
  alloc.free(p);
  if (allocated != (int64_t{1} << 20)) {
    std::fprintf(stderr, "consumer_cxx: allocated_bytes %lld, expected 1 MiB\n",
                 static_cast<long long>(allocated));
    return 1;
  }
  devmem::Tensor t = devmem::ones({4, 4});
  const float sum = devmem::sum(t).item<float>();
  if (sum != 16.0f) {
    std::fprintf(stderr, "consumer_cxx: sum of ones(4, 4) is %g on %s\n", sum,
                 t.ToString().c_str());
    return 1;
  }
  std::printf("consumer_cxx: devmem %s ok (%s)\n", DEVMEM_VERSION, t.ToString().c_str());
  return 0;
}
