// runtime/size_histogram.cc: lock-free per-device power-of-two size counts.
//
// Slots are claimed with a compare-and-swap on their key, so two devices reporting
// their first event at once take different slots; a device's later events find its
// slot by a linear scan over the claimed ones (a handful of devices: a few loads).
#include "runtime/size_histogram.h"

#include <algorithm>
#include <bit>

namespace devmem {

int SizeHistogram::BucketOf(size_t bytes) {
  if (bytes <= UpperBound(0)) return 0;
  // The smallest n with 2^n >= bytes.
  const int log2_ceil = static_cast<int>(std::bit_width(static_cast<uint64_t>(bytes) - 1));
  return std::min(log2_ceil - kMinLog2, kNumFiniteBuckets);
}

SizeHistogram::SizeHistogram() = default;
SizeHistogram::~SizeHistogram() = default;

SizeHistogram& SizeHistogram::Process() {
  static SizeHistogram* const instance = new SizeHistogram();
  return *instance;
}

uint32_t SizeHistogram::EncodeDevice(DeviceId device) {
  // type in the top byte, index + 1 below it, so that no device encodes to 0.
  return (static_cast<uint32_t>(device.type) << 24) |
         ((static_cast<uint32_t>(device.index) + 1) & 0xFFFFFF);
}

DeviceId SizeHistogram::DecodeDevice(uint32_t key) {
  return DeviceId{static_cast<DeviceType>(key >> 24), static_cast<int>((key & 0xFFFFFF) - 1)};
}

SizeHistogram::Slot* SizeHistogram::slot_for(DeviceId device) {
  const uint32_t key = EncodeDevice(device);
  for (Slot& slot : slots_) {
    uint32_t seen = slot.key.load(std::memory_order_acquire);
    if (seen == key) return &slot;
    if (seen == 0) {
      // Claim it; if another device won the race, keep scanning (it may have been
      // this same device, reported from another thread: compare again).
      if (slot.key.compare_exchange_strong(seen, key, std::memory_order_acq_rel)) {
        return &slot;
      }
      if (seen == key) return &slot;
    }
  }
  return nullptr;
}

void SizeHistogram::on_event(const AllocEvent& event) {
  if (event.action == AllocAction::kAlloc) record(event.device, event.requested);
}

void SizeHistogram::record(DeviceId device, size_t requested) {
  Slot* slot = slot_for(device);
  if (slot == nullptr) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Relaxed: these are independent counters; nothing is published through them.
  slot->buckets[static_cast<size_t>(BucketOf(requested))].fetch_add(
      1, std::memory_order_relaxed);
  slot->sum_bytes.fetch_add(requested, std::memory_order_relaxed);
}

std::vector<SizeHistogram::Counts> SizeHistogram::counts() const {
  std::vector<Counts> out;
  for (const Slot& slot : slots_) {
    const uint32_t key = slot.key.load(std::memory_order_acquire);
    if (key == 0) continue;
    Counts& c = out.emplace_back();
    c.device = DecodeDevice(key);
    for (int i = 0; i < kNumBuckets; ++i) {
      c.buckets[i] = slot.buckets[i].load(std::memory_order_relaxed);
      c.count += c.buckets[i];
    }
    c.sum_bytes = slot.sum_bytes.load(std::memory_order_relaxed);
  }
  std::sort(out.begin(), out.end(),
            [](const Counts& a, const Counts& b) { return a.device < b.device; });
  return out;
}

}  // namespace devmem
