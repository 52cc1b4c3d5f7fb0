// tests/hooked_backend.h: a Backend that forwards every call to another one and runs a
// test's hook first where one is set. Tests use it to order threads by what the
// allocator does (release a blocked stream the moment the allocator starts waiting for
// it) instead of by sleeping, and to make one call fail.
//
//   auto hooked = std::make_unique<testutil::HookedBackend>(MakeSimBackend(config));
//   HookedBackend* hooks = hooked.get();
//   CachingAllocator a(std::move(hooked), config);
//   StreamBlocker blocker(...);
//   testutil::HookGuard unhook =
//       hooks->before_synchronize_stream.Set([&](Stream s) { blocker.Release(); });
//
// A hook is set only for as long as the HookGuard that Set() returns lives. Why: a hook
// captures the test's locals (by reference, or a pointer to them), and the allocator
// that calls it usually outlives them: it is declared first, or is a fixture's, and its
// destructor frees segments, unmaps and releases events through the hooks. Left set
// when the test returns early (a failed ASSERT returns), a hook would run on dead
// locals. The guard is declared after the lambda it is given, so after every local the
// lambda can capture: it dies first, and clears the hook before they do.
//
// Thread-safety: the allocator calls hooks from any thread (segment allocations, maps,
// unmaps, frees and the event waits before them with its device lock released, the
// rest under it; the runtime's poller too), and a test may set or clear one meanwhile.
// A call runs the function that was set when it began; clearing (a guard's end,
// reset(), `= nullptr`) returns once no call of the function it cleared runs, so after
// it nothing can touch what that function captured. A hook must not call into the
// allocator, nor clear itself (the clear would wait for its own call).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "allocator/backend.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/sim_backend.h"
#include "tests/test_util.h"

namespace devmem::testutil {

// Clears the hooks it was given when it dies (or at reset()), the last set first; see
// above. Movable (the duty moves with it), not copyable. Owns nothing of the backend:
// it may outlive it (clearing a hook of a backend already destroyed does nothing).
class [[nodiscard]] HookGuard {
 public:
  HookGuard() = default;
  explicit HookGuard(std::function<void()> clear) { clears_.push_back(std::move(clear)); }
  HookGuard(HookGuard&& other) noexcept : clears_(std::move(other.clears_)) {
    other.clears_.clear();
  }
  HookGuard& operator=(HookGuard&& other) noexcept {
    if (this != &other) {
      reset();
      clears_ = std::move(other.clears_);
      other.clears_.clear();
    }
    return *this;
  }
  HookGuard(const HookGuard&) = delete;
  HookGuard& operator=(const HookGuard&) = delete;
  ~HookGuard() { reset(); }

  // Takes over `other`'s hooks too (one guard for several hooks).
  HookGuard& operator+=(HookGuard&& other) {
    for (auto& c : other.clears_) clears_.push_back(std::move(c));
    other.clears_.clear();
    return *this;
  }
  // Clears the hooks now (each waits for its calls in flight); the guard then guards
  // nothing.
  void reset() {
    while (!clears_.empty()) {
      std::function<void()> clear = std::move(clears_.back());
      clears_.pop_back();
      clear();
    }
  }

 private:
  std::vector<std::function<void()>> clears_;
};

template <typename Signature>
class Hook;

// One hook of a HookedBackend: at most one function, set by Set() for as long as the
// guard it returns lives. Thread-safety: see the top of the file; `state_->mu` guards
// which function is set and every function's count of calls in flight.
template <typename R, typename... Args>
class Hook<R(Args...)> {
 public:
  Hook() = default;
  Hook(const Hook&) = delete;
  Hook& operator=(const Hook&) = delete;

  // Sets `f` (replacing the function set, if any) until the guard dies. The guard
  // clears only its own function: one that a later Set replaced is left alone.
  template <typename F>
  [[nodiscard]] HookGuard Set(F f) {
    auto fn = std::make_shared<Fn>(std::function<R(Args...)>(std::move(f)));
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->fn = fn;
    }
    return HookGuard([state = state_, fn] { state->Clear(fn); });
  }
  // Clears whatever is set, once no call of it runs (the guard's end then does nothing).
  Hook& operator=(std::nullptr_t) {
    state_->Clear(nullptr);
    return *this;
  }
  explicit operator bool() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->fn != nullptr;
  }

  // The backend's side: runs the function set with `args` and returns its result, or
  // returns `otherwise()` when none is set.
  template <typename Otherwise>
  R RunOr(Otherwise&& otherwise, Args... args) const {
    std::shared_ptr<Fn> fn;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      fn = state_->fn;
      if (fn != nullptr) ++fn->running;
    }
    if (fn == nullptr) return otherwise();
    struct Done {  // counts the call out, also when the hook throws
      State& state;
      Fn& fn;
      ~Done() {
        std::lock_guard<std::mutex> lock(state.mu);
        if (--fn.running == 0) state.idle.notify_all();
      }
    } done{*state_, *fn};
    return fn->f(args...);
  }
  // The same for a hook that only runs before the forwarded call.
  void Run(Args... args) const {
    RunOr([] {}, args...);
  }

 private:
  struct Fn {
    explicit Fn(std::function<R(Args...)> f) : f(std::move(f)) {}
    const std::function<R(Args...)> f;
    int running = 0;  // calls in flight; guarded by State::mu
  };
  struct State {
    std::mutex mu;
    std::condition_variable idle;  // a function's last call in flight ended
    std::shared_ptr<Fn> fn;        // the function set, or null; guarded by `mu`

    // Clears `which` (any function when null) if it is still the one set, then waits
    // until none of its calls runs.
    void Clear(const std::shared_ptr<Fn>& which) {
      std::unique_lock<std::mutex> lock(mu);
      std::shared_ptr<Fn> cleared = which != nullptr ? which : fn;
      if (cleared == nullptr) return;
      if (fn == cleared) fn.reset();
      idle.wait(lock, [&] { return cleared->running == 0; });
    }
  };
  // Shared with the guards, which may outlive the backend.
  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

class HookedBackend : public Backend {
 public:
  explicit HookedBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  Backend& inner() const { return *inner_; }

  // Run before the forwarded call.
  Hook<void(Stream)> before_synchronize_stream;
  Hook<void(Event)> before_synchronize_event;
  Hook<void()> before_mem_info;
  // Events: creations (record_event), reuses, queries and releases, for counting them.
  Hook<void(Stream)> before_record_event;
  Hook<void(Event, Stream)> before_rerecord_event;
  Hook<void(Event)> before_event_done;
  Hook<void(Event)> before_release_event;
  // Replace the forwarded call when set.
  Hook<absl::StatusOr<void*>(size_t)> reserve_address_instead;
  Hook<absl::StatusOr<void*>(size_t)> allocate_segment_instead;
  Hook<absl::Status(void*, size_t)> map_instead;
  Hook<void(void*, size_t)> unmap_instead;
  Hook<void(void*, size_t)> free_segment_instead;

  DeviceId device() const override { return inner_->device(); }
  Capabilities caps() const override { return inner_->caps(); }
  DeviceInfo info() const override { return inner_->info(); }
  absl::StatusOr<void*> allocate_segment(size_t bytes) override {
    return allocate_segment_instead.RunOr([&] { return inner_->allocate_segment(bytes); }, bytes);
  }
  void free_segment(void* p, size_t bytes) override {
    free_segment_instead.RunOr([&] { inner_->free_segment(p, bytes); }, p, bytes);
  }
  MemInfo mem_info() override {
    before_mem_info.Run();
    return inner_->mem_info();
  }
  absl::StatusOr<Stream> create_stream() override { return inner_->create_stream(); }
  void destroy_stream(Stream s) override { inner_->destroy_stream(s); }
  absl::Status launch_host_fn(Stream s, std::function<void()> fn) override {
    return inner_->launch_host_fn(s, std::move(fn));
  }
  Event record_event(Stream s) override {
    before_record_event.Run(s);
    return inner_->record_event(s);
  }
  bool event_done(Event e) override {
    before_event_done.Run(e);
    return inner_->event_done(e);
  }
  void synchronize_event(Event e) override {
    before_synchronize_event.Run(e);
    inner_->synchronize_event(e);
  }
  void release_event(Event e) override {
    before_release_event.Run(e);
    inner_->release_event(e);
  }
  bool rerecord_event(Event e, Stream s) override {
    before_rerecord_event.Run(e, s);
    return inner_->rerecord_event(e, s);
  }
  void synchronize_stream(Stream s) override {
    before_synchronize_stream.Run(s);
    inner_->synchronize_stream(s);
  }
  size_t granularity() const override { return inner_->granularity(); }
  absl::StatusOr<void*> reserve_address(size_t bytes) override {
    return reserve_address_instead.RunOr([&] { return inner_->reserve_address(bytes); }, bytes);
  }
  void release_address(void* p, size_t bytes) override { inner_->release_address(p, bytes); }
  absl::Status map(void* p, size_t bytes) override {
    return map_instead.RunOr([&] { return inner_->map(p, bytes); }, p, bytes);
  }
  void unmap(void* p, size_t bytes) override {
    unmap_instead.RunOr([&] { inner_->unmap(p, bytes); }, p, bytes);
  }
  CaptureState capture_state(Stream s) override { return inner_->capture_state(s); }
  absl::StatusOr<void*> allocate_segment_during_capture(size_t bytes) override {
    return allocate_segment_instead.RunOr(
        [&] { return inner_->allocate_segment_during_capture(bytes); }, bytes);
  }
  size_t release_handle_reserve() override { return inner_->release_handle_reserve(); }
  size_t handle_reserve_bytes() const override { return inner_->handle_reserve_bytes(); }
  DriverCallStats driver_calls() const override { return inner_->driver_calls(); }
  SharingSupport sharing() const override { return inner_->sharing(); }
  absl::Status enable_peer_access(int peer) override {
    return inner_->enable_peer_access(peer);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

// MakeSimAllocator with a HookedBackend around the sim; *hooks receives it (owned by
// the allocator). t.sim is the sim inside.
inline SimAllocator MakeHookedSimAllocator(std::string_view conf, HookedBackend** hooks,
                                           size_t default_capacity = kGiB) {
  SimAllocator t;
  t.config = MakeSimConfig(conf, default_capacity);
  auto hooked = std::make_unique<HookedBackend>(MakeSimBackend(t.config, /*index=*/0));
  t.sim = dynamic_cast<SimBackend*>(&hooked->inner());
  *hooks = hooked.get();
  t.alloc = std::make_unique<CachingAllocator>(std::move(hooked), t.config);
  return t;
}

}  // namespace devmem::testutil
