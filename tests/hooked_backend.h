// tests/hooked_backend.h: a Backend that forwards every call to another one and runs a
// test's hook first where one is set. Tests use it to order threads by what the
// allocator does (release a blocked stream the moment the allocator starts waiting for
// it) instead of by sleeping, and to make one call fail.
//
//   auto hooked = std::make_unique<testutil::HookedBackend>(MakeSimBackend(config));
//   hooked->before_synchronize_stream = [&](Stream s) { blocker.Release(); };
//   CachingAllocator a(std::move(hooked), config);
//
// Thread-safety: as the wrapped backend's. Set the hooks before the backend is shared
// with other threads (the allocator calls them from any thread: segment allocations,
// maps, unmaps, frees and the event waits before them with its device lock released,
// the rest under it); a hook must not call into the allocator.
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <utility>

#include "allocator/backend.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/sim_backend.h"
#include "tests/test_util.h"

namespace devmem::testutil {

class HookedBackend : public Backend {
 public:
  explicit HookedBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  Backend& inner() const { return *inner_; }

  // Run before the forwarded call.
  std::function<void(Stream)> before_synchronize_stream;
  std::function<void(Event)> before_synchronize_event;
  std::function<void()> before_mem_info;
  // Events: creations (record_event), reuses, queries and releases, for counting them.
  std::function<void(Stream)> before_record_event;
  std::function<void(Event, Stream)> before_rerecord_event;
  std::function<void(Event)> before_event_done;
  std::function<void(Event)> before_release_event;
  // Replace the forwarded call when set.
  std::function<absl::StatusOr<void*>(size_t)> reserve_address_instead;
  std::function<absl::StatusOr<void*>(size_t)> allocate_segment_instead;
  std::function<absl::Status(void*, size_t)> map_instead;
  std::function<void(void*, size_t)> unmap_instead;
  std::function<void(void*, size_t)> free_segment_instead;

  DeviceId device() const override { return inner_->device(); }
  Capabilities caps() const override { return inner_->caps(); }
  DeviceInfo info() const override { return inner_->info(); }
  absl::StatusOr<void*> allocate_segment(size_t bytes) override {
    if (allocate_segment_instead) return allocate_segment_instead(bytes);
    return inner_->allocate_segment(bytes);
  }
  void free_segment(void* p, size_t bytes) override {
    if (free_segment_instead) return free_segment_instead(p, bytes);
    inner_->free_segment(p, bytes);
  }
  MemInfo mem_info() override {
    if (before_mem_info) before_mem_info();
    return inner_->mem_info();
  }
  absl::StatusOr<Stream> create_stream() override { return inner_->create_stream(); }
  void destroy_stream(Stream s) override { inner_->destroy_stream(s); }
  absl::Status launch_host_fn(Stream s, std::function<void()> fn) override {
    return inner_->launch_host_fn(s, std::move(fn));
  }
  Event record_event(Stream s) override {
    if (before_record_event) before_record_event(s);
    return inner_->record_event(s);
  }
  bool event_done(Event e) override {
    if (before_event_done) before_event_done(e);
    return inner_->event_done(e);
  }
  void synchronize_event(Event e) override {
    if (before_synchronize_event) before_synchronize_event(e);
    inner_->synchronize_event(e);
  }
  void release_event(Event e) override {
    if (before_release_event) before_release_event(e);
    inner_->release_event(e);
  }
  bool rerecord_event(Event e, Stream s) override {
    if (before_rerecord_event) before_rerecord_event(e, s);
    return inner_->rerecord_event(e, s);
  }
  void synchronize_stream(Stream s) override {
    if (before_synchronize_stream) before_synchronize_stream(s);
    inner_->synchronize_stream(s);
  }
  size_t granularity() const override { return inner_->granularity(); }
  absl::StatusOr<void*> reserve_address(size_t bytes) override {
    if (reserve_address_instead) return reserve_address_instead(bytes);
    return inner_->reserve_address(bytes);
  }
  void release_address(void* p, size_t bytes) override { inner_->release_address(p, bytes); }
  absl::Status map(void* p, size_t bytes) override {
    if (map_instead) return map_instead(p, bytes);
    return inner_->map(p, bytes);
  }
  void unmap(void* p, size_t bytes) override {
    if (unmap_instead) return unmap_instead(p, bytes);
    inner_->unmap(p, bytes);
  }
  CaptureState capture_state(Stream s) override { return inner_->capture_state(s); }
  absl::StatusOr<void*> allocate_segment_during_capture(size_t bytes) override {
    if (allocate_segment_instead) return allocate_segment_instead(bytes);
    return inner_->allocate_segment_during_capture(bytes);
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
