// runtime/flight_recorder.cc: the flight record's writer (see flight_recorder.h; the
// layout: flight_record_format.h).
//
// Every word of the mapping is written through std::atomic_ref, so that a reader mapping
// the same file, or a test in this process, racing a writer is defined behaviour. A
// seqlock record's "busy" mark is a relaxed store and every word after it a release
// store: a reader whose load sees any of the new words also sees the mark (or the
// commit), the ordering a release fence after the mark gave (the seqlock writer's half
// of Boehm's protocol; the reader's half is in flight_record_reader.cc), in a form
// ThreadSanitizer models (GCC's -Wtsan: it does not model atomic_thread_fence). On x86
// a release store is the plain store a relaxed one is: the hot path's instructions are
// the same (callgrind). After a death order is no question at all: a SIGKILL loses no
// store that was made, so the file holds a prefix of each thread's stores in program
// order, and program order is what these stores keep. Each lane has one writer at a
// time (flight_recorder.h), so nothing here is a read-modify-write of shared memory.
#include "runtime/flight_recorder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/site.h"
#include "allocator/snapshot.h"
#include "runtime/flight_record_format.h"
#include "runtime/thread_lanes.h"
#include "runtime/trace.h"

namespace devmem {
namespace {

using namespace flight;  // NOLINT: the format's names are this file's vocabulary

// A word of a record, after its busy mark (or of one that has none).
inline void Put(uint64_t* w, uint64_t v) {
  std::atomic_ref<uint64_t>(*w).store(v, std::memory_order_release);
}
inline uint64_t Get(const uint64_t* w) {
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(w)).load(std::memory_order_relaxed);
}
inline void Commit(uint64_t* w, uint64_t v) {
  std::atomic_ref<uint64_t>(*w).store(v, std::memory_order_release);
}
inline void MarkBusy(uint64_t* w) {
  std::atomic_ref<uint64_t>(*w).store(kBusy, std::memory_order_relaxed);
}
inline uint64_t U(int64_t v) { return static_cast<uint64_t>(v); }

std::string Errno(int e) { return std::strerror(e); }

// Opens `path` for the record: a new file, or an existing regular file of this user
// with one link (see flight_recorder.h). *created says which (to undo on error).
absl::StatusOr<int> OpenRecordFile(const std::string& path, bool* created) {
  *created = false;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) {
    *created = true;
    return fd;
  }
  if (errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create ", path, ": ", Errno(errno)));
  }
  fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::PermissionDeniedError(
          absl::StrCat(path, " is a symbolic link: refusing to write through it"));
    }
    return absl::FailedPreconditionError(absl::StrCat("cannot open ", path, ": ", Errno(errno)));
  }
  struct stat st {};
  std::string why;
  if (fstat(fd, &st) != 0) {
    why = absl::StrCat("cannot stat it: ", Errno(errno));
  } else if (!S_ISREG(st.st_mode)) {
    why = "it exists and is not a regular file";
  } else if (st.st_uid != geteuid()) {
    why = absl::StrCat("it belongs to uid ", st.st_uid, ", not to this process's user (uid ",
                       geteuid(), ")");
  } else if (st.st_nlink != 1) {
    why = absl::StrCat("it has ", st.st_nlink, " hard links (another name could be a file "
                       "someone else reads)");
  }
  if (!why.empty()) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat("refusing ", path, ": ", why));
  }
  return fd;
}

// Cuts `s` to at most `n` bytes without splitting a UTF-8 sequence.
std::string_view CutUtf8(std::string_view s, size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

}  // namespace

namespace {
// The hot path's lookup: the last recorder this thread recorded into (its uid), its
// lane index there, and the thread's number as a ring slot packs it. One struct, so
// that Record finds the thread's block once; constinit and trivially destructible, so
// reading it is thread-pointer-relative loads, no TLS wrapper call.
// `fast` is the uid only when the lane is the thread's own (not the shared last one),
// else 0, so that one compare takes the hot path; `offset` is the lane's byte offset in
// a FlightDevice's lanes_ (no multiply on the hot path).
struct ThreadLane {
  uint64_t fast = 0;
  uint64_t thread_bits = 0;  // TraceThreadNumber() << 32
  uint64_t uid = 0;
  size_t offset = 0;
  uint32_t lane = 0;
};
constinit thread_local ThreadLane tls_flight;
}  // namespace

// A thread's lane index in every recorder it recorded into, given back when it exits to
// the recorders that still exist (runtime/thread_lanes.h).
struct FlightLaneCache {
  using Owner = FlightRecorder;
  using Lane = uint32_t;
  static void Release(FlightRecorder* recorder, Lane lane) { recorder->ReleaseLane(lane); }
  static void Forget() { tls_flight.uid = tls_flight.fast = 0; }
};
namespace {
using RecorderLanes = ThreadLanes<FlightLaneCache>;
}  // namespace

// --- FlightRecorder -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<FlightRecorder>> FlightRecorder::Create(
    const std::string& path, const Options& o) {
  if (o.device_slots == 0 || o.device_slots > kMaxDeviceSlots || o.lane_slots == 0 ||
      o.lane_slots > kMaxLaneSlots || o.ring_slots == 0 ||
      o.ring_slots > kMaxRingSlots || (o.ring_slots & (o.ring_slots - 1)) != 0 ||
      o.site_slots < 2 || o.site_slots > kMaxSiteSlots ||
      o.name_slot_bytes < kMinNameSlotBytes || o.name_slot_bytes > kMaxNameSlotBytes ||
      o.name_slot_bytes % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flight recorder ", path, ": bad layout options (devices 1..", kMaxDeviceSlots,
        ", lanes 1..", kMaxLaneSlots, ", ring a power of two up to ", kMaxRingSlots, ", sites 2..", kMaxSiteSlots,
        ", name slots a multiple of 8 in ", kMinNameSlotBytes, "..", kMaxNameSlotBytes, ")"));
  }
  const Layout layout{o.device_slots, o.ring_slots, o.site_slots, o.name_slot_bytes,
                      o.lane_slots};
  const size_t bytes = layout.file_bytes();
  bool created = false;
  absl::StatusOr<int> opened = OpenRecordFile(path, &created);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  auto fail = [&](std::string what, int e) {
    close(fd);
    if (created) unlink(path.c_str());
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", Errno(e)));
  };
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          path, " is the flight record of another running process (it holds the file's "
                "lock): give each process its own file"));
    }
    return fail(absl::StrCat("cannot lock ", path), errno);
  }
  if (!created && fchmod(fd, 0600) != 0) return fail(absl::StrCat("cannot chmod ", path), errno);
  // Truncated first, so that no byte of an earlier record survives in the new one.
  if (ftruncate(fd, 0) != 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return fail(absl::StrCat("cannot size ", path, " to ", bytes, " bytes"), errno);
  }
  if (const int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      e != 0 && e != EOPNOTSUPP && e != EINVAL) {
    return fail(absl::StrCat("cannot reserve ", bytes, " bytes on disk for ", path), e);
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return fail(absl::StrCat("cannot map ", path), errno);
  return std::unique_ptr<FlightRecorder>(
      new FlightRecorder(path, fd, static_cast<unsigned char*>(base), bytes, o));
}

FlightRecorder::FlightRecorder(std::string path, int fd, unsigned char* base, size_t bytes,
                               const Options& options)
    : path_(std::move(path)),
      fd_(fd),
      base_(base),
      bytes_(bytes),
      options_(options),
      name_limit_(options.site_slots - 1),
      uid_(RecorderLanes::NewUid()),
      named_(new std::atomic<uint8_t>[options.site_slots]) {
  for (uint32_t i = 0; i < options.site_slots; ++i) named_[i].store(0, std::memory_order_relaxed);
  // The header, magic last: a reader that sees the magic sees the whole header.
  auto u32 = [&](size_t at, uint32_t v) { std::memcpy(base_ + at, &v, 4); };
  auto u64 = [&](size_t at, uint64_t v) { std::memcpy(base_ + at, &v, 8); };
  u32(header::kVersion, kVersion);
  u32(header::kHeaderBytes, kHeaderBytes);
  u64(header::kFileBytes, bytes_);
  u32(header::kDeviceSlots, options.device_slots);
  u32(header::kRingSlots, options.ring_slots);
  u32(header::kSiteSlots, options.site_slots);
  u32(header::kNameSlotBytes, options.name_slot_bytes);
  u32(header::kPid, static_cast<uint32_t>(getpid()));
  // Stamps are trace clock ticks (flight_recorder.h, "Time"): TSC ticks, mapped by the
  // anchor here and the regions' clock points, or CLOCK_MONOTONIC ns (flag 0).
  const TraceClock::Mapping anchor = clock_.Map();
  u32(header::kFlags, clock_.uses_tsc() ? kFlagTsc : 0);
  u64(header::kStartUnixNs,
      U(std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::system_clock::now().time_since_epoch())
            .count()));
  u64(header::kStartMonoNs, U(NowNs()));
  u64(header::kTick0, clock_.uses_tsc() ? U(anchor.tick0) : 0);
  u64(header::kNs0, clock_.uses_tsc() ? U(anchor.ns0) : 0);
  u64(header::kByteOrder, kByteOrder);
  u32(header::kLaneSlots, options.lane_slots);
  u32(header::kReserved, 0);
  std::memcpy(base_ + header::kMagic, kMagic, sizeof(kMagic));
  u64(header::kCheck, FlightCheckBytes(0, base_, header::kCheck));
  // No fence: every later store into the mapping is a release store (Put, Commit), so
  // whoever sees one of them sees the header.
  if (clock_.uses_tsc()) ticker_ = std::thread([this] { Tick(); });  // clock points
  RecorderLanes::Register(uid_, this);
}

FlightRecorder::~FlightRecorder() {
  RecorderLanes::Unregister(uid_);
  {
    std::lock_guard<std::mutex> lock(tick_mu_);
    stop_ = true;
  }
  tick_cv_.notify_all();
  if (ticker_.joinable()) {
    ticker_.join();
    WriteClockPoints();  // the last, farthest from the anchor: the best mapping
  }
  {
    MutexLock lock(&mu_);
    for (const std::unique_ptr<FlightDevice>& d : devices_) d->CheckpointAll();
  }
  munmap(base_, bytes_);
  close(fd_);
}

void FlightRecorder::Tick() {
  std::unique_lock<std::mutex> lock(tick_mu_);
  while (!stop_) {
    tick_cv_.wait_for(lock, std::chrono::milliseconds(kClockPointPeriodMs),
                      [this] { return stop_; });
    if (!stop_) WriteClockPoints();
  }
}

void FlightRecorder::WriteClockPoints() {
  // Tick, then ns, back to back: the point is within one clock read's jitter.
  const int64_t tick = clock_.Now();
  const int64_t ns = NowNs();
  const uint64_t seq = ++clock_seq_;
  MutexLock lock(&mu_);
  for (const std::unique_ptr<FlightDevice>& d : devices_) d->WriteClock(seq, tick, ns);
}

FlightDevice* FlightRecorder::AddAllocator(DeviceId device) {
  MutexLock lock(&mu_);
  if (devices_.size() >= options_.device_slots) {
    if (!warned_full_) {
      warned_full_ = true;
      std::fprintf(stderr,
                   "devmem: flight recorder %s: all %u allocator regions are taken; the "
                   "events of %s and later allocators are not recorded\n",
                   path_.c_str(), options_.device_slots, device.ToString().c_str());
    }
    return nullptr;
  }
  const Layout layout{options_.device_slots, options_.ring_slots, options_.site_slots,
                      options_.name_slot_bytes, options_.lane_slots};
  const uint32_t d = static_cast<uint32_t>(devices_.size());
  unsigned char* region = base_ + layout.device_offset(d);
  devices_.push_back(std::unique_ptr<FlightDevice>(new FlightDevice(this, region, device)));
  uint64_t* page = reinterpret_cast<uint64_t*>(region);
  const uint64_t ident = device::kIdentUsed | static_cast<uint64_t>(device.type) << 16 |
                         (static_cast<uint64_t>(device.index) & 0xffff);
  Put(page + device::kIdentCheck / 8, FlightCheck(kSeedIdent, ident, d));
  Commit(page + device::kIdent / 8, ident);
  return devices_.back().get();
}

uint32_t FlightRecorder::ThisThreadLane() {
  if (tls_flight.uid == uid_) return tls_flight.lane;
  uint32_t lane;
  if (const uint32_t* held = RecorderLanes::Find(uid_)) {
    lane = *held;
  } else {
    lane = AcquireLane();
    RecorderLanes::Remember(uid_, lane);  // out of memory: never given back (no crash)
  }
  tls_flight.uid = uid_;
  tls_flight.lane = lane;
  tls_flight.offset = size_t{lane} * sizeof(FlightDevice::Lane);
  tls_flight.fast = lane == options_.lane_slots - 1 ? 0 : uid_;
  tls_flight.thread_bits = uint64_t{TraceThreadNumber()} << 32;
  return lane;
}

uint32_t FlightRecorder::AcquireLane() {
  MutexLock lock(&mu_);
  const uint32_t shared = options_.lane_slots - 1;
  if (!free_lanes_.empty()) {
    const uint32_t lane = free_lanes_.back();
    free_lanes_.pop_back();
    return lane;
  }
  if (next_lane_ < shared) return next_lane_++;
  return shared;
}

void FlightRecorder::ReleaseLane(uint32_t lane) {
  // The lane keeps its state (its numbers, its shares): the next thread that takes it
  // goes on from there, after this one's events (the mutex orders the two).
  MutexLock lock(&mu_);
  if (lane == options_.lane_slots - 1) return;  // the shared lane stays shared
  try {
    free_lanes_.push_back(lane);
  } catch (...) {  // out of memory: the lane is lost to later threads
  }
}

void FlightRecorder::NameSite(SiteId site) noexcept {
  uint8_t expected = 0;
  if (!named_[site].compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  try {
    const SiteInfo info = GetSite(site);
    const size_t room = options_.name_slot_bytes - kNameSlotHeaderBytes;
    const std::string_view tag = CutUtf8(info.tag, std::min<size_t>(64, room / 4));
    const std::string_view file = CutUtf8(info.file, std::min<size_t>(128, (room - tag.size()) / 2));
    const std::string_view function = CutUtf8(info.function, room - tag.size() - file.size());
    unsigned char* slot = base_ + kHeaderBytes + size_t{site} * options_.name_slot_bytes;
    uint64_t* w = reinterpret_cast<uint64_t*>(slot);
    // No fence after the busy state: a name slot goes 0, 1, 2 once, so a reader skips
    // it until the commit of 2 (release, after the strings) and never takes a mix.
    Put(w, 1);
    Put(w + 1, uint64_t{site} | uint64_t{info.line} << 32);
    Put(w + 2, uint64_t{file.size()} | uint64_t{function.size()} << 16 |
                   uint64_t{tag.size()} << 32 | uint64_t{static_cast<uint8_t>(info.kind)} << 48);
    // The strings: written as bytes, but nobody reads this slot before the commit below
    // (a reader that races sees state 1 and skips it).
    unsigned char* text = slot + kNameSlotHeaderBytes;
    std::memcpy(text, file.data(), file.size());
    std::memcpy(text + file.size(), function.data(), function.size());
    std::memcpy(text + file.size() + function.size(), tag.data(), tag.size());
    const size_t n = file.size() + function.size() + tag.size();
    uint64_t h = FlightCheckBytes(kSeedName, slot + 8, 16);
    h ^= FlightCheckBytes(kSeedName, text, n);
    Put(w + 3, h);
    Commit(w, 2);
    named_[site].store(2, std::memory_order_release);
  } catch (...) {
    // Out of memory while reading the site: left unnamed (flag 1: never retried).
  }
}

// --- FlightDevice ---------------------------------------------------------------------

FlightDevice::FlightDevice(FlightRecorder* recorder, unsigned char* region, DeviceId device)
    : recorder_(recorder),
      uid_(recorder->uid_),
      page_(reinterpret_cast<uint64_t*>(region)),
      device_bits_(static_cast<uint64_t>(device.type) << 8 |
                   (static_cast<uint64_t>(device.index) & 0xffff) << 16),
      ring_mask_(recorder->options_.ring_slots - 1),
      site_slots_(recorder->options_.site_slots),
      checkpoint_events_(CheckpointEvents(recorder->options_.ring_slots)),
      checkpoint_mask_(checkpoint_events_ - 1),
      lanes_(new Lane[recorder->options_.lane_slots]),
      // calloc: all zero, and (this size comes from mmap) resident only where touched.
      shares_(static_cast<SiteShare*>(std::calloc(
          size_t{recorder->options_.lane_slots} * recorder->options_.site_slots,
          sizeof(SiteShare)))),
      dirty_(new uint32_t[size_t{recorder->options_.lane_slots} * checkpoint_events_]) {
  if (shares_ == nullptr) throw std::bad_alloc();
  const FlightRecorder::Options& o = recorder->options_;
  const Layout layout{o.device_slots, o.ring_slots, o.site_slots, o.name_slot_bytes,
                      o.lane_slots};
  for (uint32_t l = 0; l < o.lane_slots; ++l) {
    Lane& lane = lanes_[l];
    lane.shares = shares_.get() + size_t{l} * site_slots_;
    lane.dirty = dirty_.get() + size_t{l} * checkpoint_events_;
    unsigned char* at = region + kDevicePageBytes + l * layout.lane_bytes();
    lane.page = reinterpret_cast<uint64_t*>(at);
    lane.sites = reinterpret_cast<uint64_t*>(at + kLanePageBytes);
    lane.ring = reinterpret_cast<uint64_t*>(at + kLanePageBytes +
                                            size_t{o.site_slots} * kRecordBytes);
    lane.shared = l == o.lane_slots - 1;
  }
}

// The entry's older copy (both 0: never written, all words 0: copy 0) is overwritten,
// so that a death inside this write leaves the newer one whole (the format's "Torn
// writes"). Cold: once per changed share per checkpoint.
void FlightDevice::WriteEntry(Lane& lane, uint32_t i, uint64_t seq) {
  const SiteShare& share = lane.shares[i];
  uint64_t* entry = lane.sites + 8 * size_t{i};
  const uint64_t c = Get(entry + site::kCopyWords) < Get(entry) ? 1 : 0;
  const uint64_t b = U(share.bytes);
  const uint64_t k = static_cast<uint32_t>(share.counts[0] - share.counts[1]);
  const uint64_t a = share.counts[0];
  uint64_t* w = entry + site::kCopyWords * c;
  MarkBusy(w);
  Put(w + 1, b);
  Put(w + 2, k | uint64_t{FlightCheck32(FlightCheck(kSeedSite ^ (uint64_t{i} << 8) ^ c, seq, b,
                                                    k, a))}
                     << 32);
  Put(w + 3, a);
  Commit(w, seq);
}

void FlightDevice::Checkpoint(Lane& lane, uint64_t seq) {
  for (uint32_t n = 0; n < lane.dirty_count; ++n) WriteEntry(lane, lane.dirty[n], seq);
  lane.dirty_count = 0;
  ++lane.epoch;
}

void FlightDevice::CheckpointAll() {
  for (uint32_t l = 0; l < recorder_->options_.lane_slots; ++l) {
    Lane& lane = lanes_[l];
    if (lane.dirty_count > 0) Checkpoint(lane, lane.next_seq - 1);
  }
}

void FlightDevice::WritePeak(Lane& lane, uint64_t seq) {
  lane.peak = lane.live;
  const uint64_t c = lane.peak_copy;
  lane.peak_copy ^= 1;
  uint64_t* w = lane.page + lane::kPeak / 8 + 8 * c;
  MarkBusy(w);
  Put(w + 1, U(lane.peak));
  Put(w + 7, FlightCheck(kSeedPeak ^ c, seq, U(lane.peak)));
  Commit(w, seq);
}

void FlightDevice::WriteCold(uint64_t seq) {
  uint64_t* w = page_ + device::kCold / 8 + 8 * cold_copy_;
  const uint64_t c = cold_copy_;
  cold_copy_ ^= 1;
  const uint64_t packed = static_cast<uint32_t>(segments_) | U(ooms_) << 32;
  MarkBusy(w);
  Put(w + 1, U(reserved_));
  Put(w + 2, U(peak_reserved_));
  Put(w + 3, packed);
  Put(w + 4, U(mapped_));
  Put(w + 5, U(device_allocs_));
  Put(w + 6, U(device_frees_));
  Put(w + 7, FlightCheck(kSeedCold ^ c, seq, U(reserved_), U(peak_reserved_), packed,
                         U(mapped_), U(device_allocs_), U(device_frees_)));
  Commit(w, seq);
}

void FlightDevice::WriteClock(uint64_t seq, int64_t tick, int64_t ns) {
  uint64_t* w = page_ + device::kClock / 8 + 8 * clock_copy_;
  clock_copy_ ^= 1;
  MarkBusy(w);
  Put(w + 1, U(tick));
  Put(w + 2, U(ns));
  Put(w + 7, FlightCheck(kSeedClock, seq, U(tick), U(ns)));
  Commit(w, seq);
}

void FlightDevice::RecordCold(const AllocEvent& e) {
  const auto size = static_cast<int64_t>(e.size);
  switch (e.action) {
    case AllocAction::kSegmentAlloc:
      reserved_ += size;
      peak_reserved_ = std::max(peak_reserved_, reserved_);
      ++segments_;
      ++device_allocs_;
      try {
        regular_segments_[e.addr] = e.size;
      } catch (...) {  // out of memory: the segment count may then be off by one
      }
      break;
    case AllocAction::kSegmentMap:
      reserved_ += size;
      mapped_ += size;
      peak_reserved_ = std::max(peak_reserved_, reserved_);
      ++device_allocs_;
      break;
    case AllocAction::kSegmentFree:
      reserved_ -= size;
      ++device_frees_;
      if (regular_segments_.erase(e.addr) > 0) {
        --segments_;
      } else {
        mapped_ -= size;  // a whole expandable run released
      }
      break;
    case AllocAction::kSegmentUnmap:
      reserved_ -= size;
      mapped_ -= size;
      ++device_frees_;
      break;
    case AllocAction::kOom:
      ++ooms_;
      break;
    default:
      break;
  }
  if (e.action >= AllocAction::kSegmentAlloc && e.action <= AllocAction::kOom) {
    WriteCold(++cold_seq_);
  }
  if (recorder_->NeedsName(e.site)) recorder_->NameSite(e.site);
}

inline void FlightDevice::Write(Lane& lane, const AllocEvent& e) {
  // Register pressure is this function's cost: every value live across the ring's
  // stores beyond the nine registers a call may clobber costs a save and a restore. So
  // the event's words are read where they are stored, each xor-ed into the check at
  // once (keeping all seven live until the check spilled them), and the action, site
  // and size read again after the slot for the summaries (three loads, against two
  // saves and restores: one instruction an event fewer under callgrind,
  // tools/bench/flight_recorder.cc's pairs). The thread's number, set with the lane
  // (ThisThreadLane), is read first, while few values are live.
  const uint64_t packed =
      static_cast<uint64_t>(e.action) | device_bits_ | tls_flight.thread_bits;
  const uint64_t s = lane.next_seq++;
  uint64_t* const block_order = e.block_order;
  uint64_t* const pool_order = e.pool_order;
  // 1. The stamp (flight_recorder.h, "Order"): the coarse tick (one relaxed load), raised
  // past the lane's last event and the event's causal predecessors; it becomes theirs.
  // The lane's, read after the lane was found: a lane passes to a new thread when its
  // thread exits, and its stamps must not go back.
  uint64_t tick = std::max(static_cast<uint64_t>(TraceClock::Coarse()), lane.last + 1);
  if (block_order != nullptr) tick = std::max(tick, *block_order + 1);
  if (pool_order != nullptr) tick = std::max(tick, *pool_order + 1);
  lane.last = tick;
  if (block_order != nullptr) *block_order = tick;
  if (pool_order != nullptr) *pool_order = tick;
  // 2. The ring slot (a seqlock: busy, the words, the number), check FlightCheck(seed,
  // s, tick, packed, stream, addr, size, requested) built as the words are stored.
  uint64_t* w = lane.ring + 8 * ((s - 1) & ring_mask_);
  const SiteId site = e.site;
  uint64_t h = (kSeedRing ^ site) ^ s;
  auto put = [&](int i, uint64_t v) {
    Put(w + i, v);
    h ^= Rotl(v, 7 * i);
    // An empty asm that "changes" h: the check stays one chain in the order of the
    // stores, so each word dies at its store. Without it GCC reassociates the xors
    // into a tree that keeps four rotated words live at once, and saves and restores
    // two callee-saved registers for them (callgrind: 121 -> 117 instructions an
    // event). No instruction is emitted for it.
    asm("" : "+r"(h));
  };
  MarkBusy(w);
  put(1, tick);
  put(2, packed);
  put(3, e.stream.handle);
  put(4, e.addr);
  put(5, e.size);
  put(6, e.requested);
  Put(w + 7, uint64_t{site} | uint64_t{FlightCheck32(FlightCheckMix(h))} << 32);
  Commit(w, s);
  // 3. The summaries the event changes: the lane's share of the site (in this
  // process's memory: the file's entry is the checkpoint's copy), its peak (only when
  // it rises), or the segment stats. Every event counts toward the checkpoint: the
  // ring's slots are what its invariant is about (a checkpoint after the events s with
  // s & checkpoint_mask_ == 0). The rare cases (a checkpoint's event, a segment event,
  // the lane's first event of a site in an epoch, a new peak) are tail calls out of
  // line, each taken on its own test, so that the hot path keeps its values in the
  // registers a call would clobber and carries no mask of what is left to do.
  const auto action = static_cast<uint8_t>(e.action);
  if (action > static_cast<uint8_t>(AllocAction::kFree) || (s & checkpoint_mask_) == 0)
      [[unlikely]] {
    return Finish(lane, e, s);
  }
  // The site read again (not kept live across the slot's stores: see above).
  const SiteId again = e.site;
  const uint32_t i = again < site_slots_ ? again : site_slots_ - 1;
  SiteShare& share = lane.shares[i];
  if (share.epoch != lane.epoch) [[unlikely]] return List(lane, i, e, s);
  Add(lane, share, action, e.size, s);
}

inline void FlightDevice::Add(Lane& lane, SiteShare& share, uint8_t action, size_t size,
                              uint64_t seq) {
  static_assert(static_cast<int>(AllocAction::kAlloc) == 0 &&
                static_cast<int>(AllocAction::kFree) == 1);
  // +size for an alloc, -size for a free, without a branch: neg is 0 or all ones.
  const int64_t neg = -static_cast<int64_t>(action);
  const int64_t delta = (static_cast<int64_t>(size) ^ neg) - neg;
  share.bytes += delta;
  share.counts[action] += 1;
  lane.live += delta;
  // A free never raises it: live <= peak held before the event.
  if (lane.live > lane.peak) [[unlikely]] return WritePeak(lane, seq);
}

void FlightDevice::List(Lane& lane, uint32_t i, const AllocEvent& e, uint64_t seq) {
  SiteShare& share = lane.shares[i];
  // Listed once an epoch: at most one share an event and a checkpoint every
  // checkpoint_events_ events, so the list has room.
  const bool first = share.epoch == 0;  // the lane's first event of the site
  share.epoch = lane.epoch;
  lane.dirty[lane.dirty_count++] = i;
  Add(lane, share, static_cast<uint8_t>(e.action), e.size, seq);
  // The name flags are shared by the lanes; sites past the last slot, which share it,
  // have no name.
  if (first && recorder_->NeedsName(e.site)) recorder_->NameSite(e.site);
}

void FlightDevice::Finish(Lane& lane, const AllocEvent& e, uint64_t seq) {
  const auto action = static_cast<uint8_t>(e.action);
  if (action <= static_cast<uint8_t>(AllocAction::kFree)) {
    const SiteId site = e.site;
    const uint32_t i = site < site_slots_ ? site : site_slots_ - 1;
    SiteShare& share = lane.shares[i];
    if (share.epoch != lane.epoch) {
      List(lane, i, e, seq);
    } else {
      Add(lane, share, action, e.size, seq);
    }
  } else {
    RecordCold(e);  // and its site's name, if any
  }
  // After the event's share: the checkpoint's entries are as of this event.
  if ((seq & checkpoint_mask_) == 0) Checkpoint(lane, seq);
}

void FlightDevice::RecordShared(Lane& lane, const AllocEvent& e) {
  MutexLock lock(&lane.mu);
  Write(lane, e);
}

void FlightDevice::RecordSlow(const AllocEvent& e) {
  // The thread's lane in this recorder (taken on its first event), now in tls_flight.
  Lane& lane = lanes_[recorder_->ThisThreadLane()];
  if (lane.shared) return RecordShared(lane, e);
  Write(lane, e);
}

void FlightDevice::Record(const AllocEvent& e) {
  if (tls_flight.fast != uid_) [[unlikely]] return RecordSlow(e);
  Write(*reinterpret_cast<Lane*>(reinterpret_cast<unsigned char*>(lanes_.get()) +
                                 tls_flight.offset),
        e);
}

}  // namespace devmem
