// runtime/trace_testing.h: fault injection into TraceRing's construction, for tests of
// its error paths (tests/runtime_trace_test.cc). Not for programs.
//
// Kept out of runtime/trace.h so that the header every allocation path includes does
// not change for a test hook.
#pragma once

namespace devmem::trace_internal {

// The calling thread's next TraceRing construction fails with std::bad_alloc where the
// ring registers itself for the threads' exits (the last step, which allocates), after
// its slots are mapped; the one after it is unaffected.
void FailNextRingRegistrationForTesting();

}  // namespace devmem::trace_internal
