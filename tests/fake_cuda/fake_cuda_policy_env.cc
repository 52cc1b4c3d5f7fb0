// tests/fake_cuda/fake_cuda_policy_env.cc: what makes devmem_fake_cuda_policy_tests the
// policy suite on the fake CUDA runtime, however the binary is started (ctest, or by
// hand): set before main, unless the caller set them.
//   DEVMEM_TEST_BACKEND=cuda         the suite's allocators on cuda:0 (tests/test_backend.h);
//   DEVMEM_FAKE_CUDA_LEAK_CHECK=0    its streams live as long as the process, as on the
//                                    sim (no case destroys one), which the fake's
//                                    exit-time leak check would count. The fake reads it
//                                    at its first call, long after this runs.
#include <cstdlib>

namespace {

[[maybe_unused]] const bool kPolicyEnv = [] {
  setenv("DEVMEM_TEST_BACKEND", "cuda", /*overwrite=*/0);
  setenv("DEVMEM_FAKE_CUDA_LEAK_CHECK", "0", /*overwrite=*/0);
  return true;
}();

}  // namespace
