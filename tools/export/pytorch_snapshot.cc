// tools/export/pytorch_snapshot.cc: PyTorchSnapshotPickle. Three steps per device:
//   1. its events: the input's, in order, those after the state's time dropped;
//   2. its final state: the input's segments, or the trace replayed (ReplayState);
//   3. the pickle: segments and blocks (a block with a sampled stack: its site's frames,
//      then the stack's), then the events translated to PyTorch's actions
//      (TranslateEvents), with each site's frames written once and referred to after
//      (PickleWriter's memo).
#include "tools/export/pytorch_snapshot.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "allocator/block.h"
#include "allocator/site.h"
#include "allocator/stack_sampler.h"
#include "allocator/string_view_bridge.h"
#include "tools/export/pickle_writer.h"

namespace devmem::memtrace {
namespace {

// --- the final state, rebuilt from a trace --------------------------------------------

struct Range {
  size_t size = 0;
  Stream stream;
  bool expandable = false;
};

struct LiveBlock {
  size_t size = 0;
  size_t requested = 0;
  Stream stream;
  SiteId site = kUnknownSite;
};

BlockInfo FreeBlock(uintptr_t addr, size_t size, Stream stream) {
  BlockInfo b;
  b.addr = addr;
  b.size = size;
  b.stream = stream;
  return b;
}

// Replays `events` (one device's): the segments mapped at the end, and the blocks
// allocated at the end. Frees and unmaps of what the trace never saw are ignored.
AllocatorSnapshot ReplayState(DeviceId device, const std::vector<const TraceEvent*>& events) {
  std::map<uintptr_t, Range> ranges;
  std::map<uintptr_t, LiveBlock> live;
  for (const TraceEvent* e : events) {
    switch (e->action) {
      case AllocAction::kAlloc:
        live[e->addr] = LiveBlock{e->size, e->requested, e->stream, e->site};
        break;
      case AllocAction::kFree:
        live.erase(e->addr);
        break;
      case AllocAction::kSegmentAlloc:
        ranges[e->addr] = Range{e->size, e->stream, false};
        break;
      case AllocAction::kSegmentFree:
        ranges.erase(e->addr);
        break;
      case AllocAction::kSegmentMap: {
        // An expandable run grows: merge with the mapped runs it touches, as
        // memory_viz does.
        uintptr_t start = e->addr;
        size_t size = e->size;
        auto next = ranges.find(start + size);
        if (next != ranges.end() && next->second.expandable && next->second.stream == e->stream) {
          size += next->second.size;
          ranges.erase(next);
        }
        auto it = ranges.lower_bound(start);
        if (it != ranges.begin()) {
          auto prev = std::prev(it);
          if (prev->second.expandable && prev->second.stream == e->stream &&
              prev->first + prev->second.size == start) {
            start = prev->first;
            size += prev->second.size;
            ranges.erase(prev);
          }
        }
        ranges[start] = Range{size, e->stream, true};
        break;
      }
      case AllocAction::kSegmentUnmap: {
        auto it = ranges.upper_bound(e->addr);
        if (it == ranges.begin()) break;
        --it;
        const uintptr_t run = it->first;
        const Range r = it->second;
        const uintptr_t end = e->addr + e->size;
        if (end > run + r.size) break;  // not inside a run the trace saw
        ranges.erase(it);
        if (e->addr > run) ranges[run] = Range{e->addr - run, r.stream, true};
        if (end < run + r.size) ranges[end] = Range{run + r.size - end, r.stream, true};
        break;
      }
      default:
        break;
    }
  }
  // A live block in no known segment (its segment came before the trace's window):
  // a segment of its own extent, so that the blocks tile their segments.
  for (const auto& [addr, b] : live) {
    auto it = ranges.upper_bound(addr);
    const bool inside = it != ranges.begin() &&
                        std::prev(it)->first + std::prev(it)->second.size >= addr + b.size;
    if (!inside) ranges[addr] = Range{b.size, b.stream, false};
  }
  AllocatorSnapshot out;
  out.device = device;
  for (const auto& [addr, r] : ranges) {
    SegmentInfo s;
    s.addr = addr;
    s.size = r.size;
    s.stream = r.stream;
    s.expandable = r.expandable;
    s.small_pool = !r.expandable && r.size <= internal::kSmallBuffer;
    uintptr_t at = addr;
    const uintptr_t end = addr + r.size;
    for (auto b = live.lower_bound(addr); b != live.end() && b->first < end; ++b) {
      if (b->first + b->second.size > end) break;
      if (b->first > at) s.blocks.push_back(FreeBlock(at, b->first - at, r.stream));
      BlockInfo live_block;
      live_block.addr = b->first;
      live_block.size = b->second.size;
      live_block.requested = b->second.requested;
      live_block.state = BlockState::kAllocated;
      live_block.stream = b->second.stream;
      live_block.site = b->second.site;
      s.blocks.push_back(live_block);
      at = b->first + b->second.size;
    }
    if (at < end) s.blocks.push_back(FreeBlock(at, end - at, r.stream));
    out.segments.push_back(std::move(s));
  }
  return out;
}

// --- writing ----------------------------------------------------------------------------

class Writer {
 public:
  explicit Writer(const SiteMap& sites) : sites_(sites) {}

  PickleWriter& p() { return p_; }

  // The frames of `site`, then those of a sampled stack (`stack_frames`, with `stack`
  // its id; nullptr: none), written once per (site, stack) and referred to after.
  void Frames(SiteId site, StackId stack = kNoStack,
              const std::vector<std::string>* stack_frames = nullptr) {
    if (stack_frames == nullptr) stack = kNoStack;
    auto it = frames_.find({site, stack});
    if (it != frames_.end()) {
      p_.Ref(it->second);
      return;
    }
    p_.BeginList();
    if (site != kUnknownSite) {
      auto info = sites_.find(site);
      if (info == sites_.end()) {
        Frame("??", 0, absl::StrCat("site ", site, " (not in the file's site table)"));
      } else {
        const SiteInfo& s = info->second;
        std::string name = s.function.empty() ? "??" : s.function;
        if (s.kind != SiteKind::kAlloc) absl::StrAppend(&name, " (", Av(SiteKindName(s.kind)), ")");
        Frame(s.file, s.line, name);
        // Innermost first, as PyTorch's frames: the user's ScopedSite frame after.
        if (s.has_outer()) {
          Frame(s.outer_file, s.outer_line,
                s.outer_function.empty() ? "??" : s.outer_function);
        }
        if (!s.tag.empty()) Frame("devmem tag", 0, s.tag);
      }
    }
    // A sampled stack names functions (or addresses) only: no file, no line; "??" is
    // what PyTorch writes for a frame of unknown file.
    if (stack_frames != nullptr) {
      for (const std::string& f : *stack_frames) Frame("??", 0, f);
    }
    p_.EndList();
    frames_.emplace(std::pair(site, stack), p_.Memoize());
  }

  void Key(std::string_view k) { p_.Str(k); }

 private:
  void Frame(std::string_view file, uint32_t line, std::string_view name) {
    p_.BeginDict();
    Key("filename");
    p_.Str(file);
    Key("line");
    p_.Int(line);
    Key("name");
    p_.Str(name);
    p_.EndDict();
  }

  const SiteMap& sites_;
  PickleWriter p_;
  absl::flat_hash_map<std::pair<SiteId, StackId>, uint32_t> frames_;
};

// A device's sampled stacks by id (a stack shared by two sites is one id, one frame list).
using StackFramesById = absl::flat_hash_map<StackId, const std::vector<std::string>*>;
StackFramesById StacksOf(const AllocatorSnapshot& d) {
  StackFramesById out;
  for (const SampledStack& g : d.sampled_stacks) {
    if (g.stack != kNoStack && !g.frames.empty()) out.emplace(g.stack, &g.frames);
  }
  return out;
}

bool NoSegmentEvents(const std::vector<const TraceEvent*>& events) {
  for (const TraceEvent* e : events) {
    if (e->action == AllocAction::kSegmentAlloc || e->action == AllocAction::kSegmentMap) {
      return false;
    }
  }
  return true;
}

std::string_view TorchState(BlockState s) {
  switch (s) {
    case BlockState::kAllocated: return "active_allocated";
    case BlockState::kPending: return "active_pending_free";
    case BlockState::kFree: return "inactive";
    case BlockState::kThreadCached: return "inactive";  // never in a snapshot
  }
  return "inactive";
}

void WriteSegment(Writer& w, int index, const SegmentInfo& s, const StackFramesById& stacks,
                  size_t* blocks) {
  PickleWriter& p = w.p();
  uint64_t allocated = 0, active = 0, requested = 0;
  for (const BlockInfo& b : s.blocks) {
    if (b.state == BlockState::kFree) continue;
    active += b.size;
    requested += b.requested;
    if (b.state == BlockState::kAllocated) allocated += b.size;
  }
  p.BeginDict();
  w.Key("device");
  p.Int(index);
  w.Key("address");
  p.UInt(s.addr);
  w.Key("total_size");
  p.UInt(s.size);
  w.Key("allocated_size");
  p.UInt(allocated);
  w.Key("active_size");
  p.UInt(active);
  w.Key("requested_size");
  p.UInt(requested);
  w.Key("stream");
  p.UInt(s.stream.handle);
  w.Key("segment_type");
  p.Str(s.small_pool ? "small" : "large");
  w.Key("segment_pool_id");
  p.BeginTuple();
  p.Int(0);
  p.Int(0);
  p.EndTuple();
  w.Key("is_expandable");
  p.Bool(s.expandable);
  w.Key("frames");
  w.Frames(kUnknownSite);
  w.Key("blocks");
  p.BeginList();
  for (const BlockInfo& b : s.blocks) {
    p.BeginDict();
    w.Key("address");
    p.UInt(b.addr);
    w.Key("size");
    p.UInt(b.size);
    w.Key("requested_size");
    p.UInt(b.state == BlockState::kFree ? 0 : b.requested);
    w.Key("state");
    p.Str(TorchState(b.state));
    w.Key("frames");
    if (b.state == BlockState::kFree) {
      w.Frames(kUnknownSite);
    } else {
      auto stack = b.stack == kNoStack ? stacks.end() : stacks.find(b.stack);
      w.Frames(b.site, b.stack, stack == stacks.end() ? nullptr : stack->second);
    }
    p.EndDict();
    ++*blocks;
  }
  p.EndList();
  p.EndDict();
}

void Entry(Writer& w, std::string_view action, const TraceEvent& e, uint64_t size,
           const uint64_t* device_free = nullptr) {
  PickleWriter& p = w.p();
  p.BeginDict();
  w.Key("action");
  p.Str(action);
  w.Key("addr");
  p.UInt(e.addr);
  w.Key("size");
  p.UInt(size);
  w.Key("stream");
  p.UInt(e.stream.handle);
  w.Key("time_us");
  p.Int(e.time_ns / 1000);
  if (device_free != nullptr) {
    w.Key("device_free");
    p.UInt(*device_free);
  }
  w.Key("frames");
  w.Frames(e.site);
  p.EndDict();
}

// One device's events in PyTorch's actions. devmem's free is PyTorch's free_requested;
// PyTorch then always records free_completed, devmem only for a free that waited for
// other streams (its later free_completed). So a free is pending when devmem's
// free_completed for that address follows before the address is allocated again, or
// when the state at the end holds the block as pending; otherwise free_completed is
// written right after free_requested (memory_viz shows the pair as one "free").
// Sizes are the requested bytes, as PyTorch's trace entries have them.
//
// A trace without segment events (an imported one) gets a segment per block, allocated
// just before it and freed just after it, matching ReplayState's segments: memory_viz's
// segment view needs every block inside a segment at every step.
size_t TranslateEvents(Writer& w, const std::vector<const TraceEvent*>& events,
                       const absl::flat_hash_set<uintptr_t>& pending_at_end,
                       const std::optional<PyTorchExportInput::Oom>& oom, bool oom_here,
                       bool block_segments) {
  // Backwards: for each free, whether a free_completed of its address comes next.
  std::vector<bool> pending(events.size(), false);
  absl::flat_hash_map<uintptr_t, AllocAction> next_at;
  for (size_t i = events.size(); i-- > 0;) {
    const TraceEvent& e = *events[i];
    if (e.action == AllocAction::kFree) {
      auto it = next_at.find(e.addr);
      pending[i] = it == next_at.end() ? pending_at_end.contains(e.addr)
                                       : it->second == AllocAction::kFreeCompleted;
    }
    if (e.action == AllocAction::kAlloc || e.action == AllocAction::kFreeCompleted ||
        e.action == AllocAction::kFree) {
      next_at[e.addr] = e.action;
    }
  }
  size_t n = 0;
  bool oom_seen = false;
  absl::flat_hash_map<uintptr_t, uint64_t> requested;  // of live blocks, by address
  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = *events[i];
    const uint64_t asked = e.requested != 0 ? e.requested : e.size;
    switch (e.action) {
      case AllocAction::kAlloc:
        requested[e.addr] = asked;
        if (block_segments) {
          Entry(w, "segment_alloc", e, e.size);
          ++n;
        }
        Entry(w, "alloc", e, asked);
        ++n;
        break;
      case AllocAction::kFree:
        Entry(w, "free_requested", e, asked);
        ++n;
        if (!pending[i]) {
          Entry(w, "free_completed", e, asked);
          ++n;
          requested.erase(e.addr);
          if (block_segments) {
            Entry(w, "segment_free", e, e.size);
            ++n;
          }
        }
        break;
      case AllocAction::kFreeCompleted: {
        auto it = requested.find(e.addr);
        Entry(w, "free_completed", e, it != requested.end() ? it->second : e.size);
        if (it != requested.end()) requested.erase(it);
        ++n;
        if (block_segments) {
          Entry(w, "segment_free", e, e.size);
          ++n;
        }
        break;
      }
      case AllocAction::kSegmentAlloc: Entry(w, "segment_alloc", e, e.size); ++n; break;
      case AllocAction::kSegmentFree: Entry(w, "segment_free", e, e.size); ++n; break;
      case AllocAction::kSegmentMap: Entry(w, "segment_map", e, e.size); ++n; break;
      case AllocAction::kSegmentUnmap: Entry(w, "segment_unmap", e, e.size); ++n; break;
      case AllocAction::kOom: {
        const uint64_t free = oom_here ? oom->driver_free : 0;
        Entry(w, "oom", e, asked, &free);
        oom_seen = true;
        ++n;
        break;
      }
      default:
        break;  // arena_open/arena_close: PyTorch has no such action
    }
  }
  if (oom_here && !oom_seen) {
    // A dump without tracing: its report is the one event known.
    TraceEvent e;
    e.stream = oom->stream;
    e.site = oom->site;
    e.time_ns = events.empty() ? 0 : events.back()->time_ns;
    Entry(w, "oom", e, oom->requested_bytes, &oom->driver_free);
    ++n;
  }
  return n;
}

}  // namespace

absl::StatusOr<std::string> PyTorchSnapshotPickle(const PyTorchExportInput& input,
                                                  const PyTorchExportOptions& options,
                                                  PyTorchExportSummary* summary) {
  // The devices, and their states and events.
  std::map<DeviceId, const AllocatorSnapshot*> states;
  std::map<DeviceId, std::vector<const TraceEvent*>> events;
  if (input.state) {
    for (const AllocatorSnapshot& d : input.state->devices) states[d.device] = &d;
  }
  for (const TraceEvent& e : input.trace) events[e.device];
  std::set<DeviceId> devices;
  for (const auto& [d, _] : states) devices.insert(d);
  for (const auto& [d, _] : events) devices.insert(d);
  if (input.oom) devices.insert(input.oom->device);
  if (options.device) {
    if (!devices.contains(*options.device)) {
      std::string have;
      for (const DeviceId& d : devices) absl::StrAppend(&have, have.empty() ? "" : ", ", d.ToString());
      return absl::InvalidArgumentError(absl::StrCat(
          "device ", options.device->ToString(), " is not in the input (it has ",
          have.empty() ? "no device" : have, ")"));
    }
    devices = {*options.device};
  }
  std::map<int, DeviceId> by_index;
  for (const DeviceId& d : devices) {
    auto [it, fresh] = by_index.emplace(d.index, d);
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(
          it->second.ToString(), " and ", d.ToString(), " are both device ", d.index,
          " in PyTorch's format, which numbers devices by index alone; choose one with "
          "--device"));
    }
  }
  for (const TraceEvent& e : input.trace) {
    if (!devices.contains(e.device)) continue;
    auto st = states.find(e.device);
    // The state is the end: events after it are not part of what led there.
    if (st != states.end() && st->second->time_ns != 0 && e.time_ns > st->second->time_ns) continue;
    events[e.device].push_back(&e);
  }
  std::map<DeviceId, AllocatorSnapshot> rebuilt;
  for (const DeviceId& d : devices) {
    if (!states.contains(d)) {
      rebuilt[d] = ReplayState(d, events[d]);
      states[d] = &rebuilt[d];
    }
  }

  PyTorchExportSummary sum;
  sum.state_from_trace = !input.state.has_value();
  Writer w(input.sites);
  PickleWriter& p = w.p();
  p.BeginDict();
  w.Key("segments");
  p.BeginList();
  for (const DeviceId& d : devices) {
    const StackFramesById stacks = StacksOf(*states[d]);
    for (const SegmentInfo& s : states[d]->segments) {
      WriteSegment(w, d.index, s, stacks, &sum.blocks);
      ++sum.segments;
    }
  }
  p.EndList();
  w.Key("device_traces");
  p.BeginList();
  const int num_devices = by_index.empty() ? 0 : by_index.rbegin()->first + 1;
  for (int i = 0; i < num_devices; ++i) {
    p.BeginList();
    auto d = by_index.find(i);
    if (d != by_index.end()) {
      absl::flat_hash_set<uintptr_t> pending_at_end;
      for (const SegmentInfo& s : states[d->second]->segments) {
        for (const BlockInfo& b : s.blocks) {
          if (b.state == BlockState::kPending) pending_at_end.insert(b.addr);
        }
      }
      const bool oom_here = input.oom && input.oom->device == d->second;
      const bool block_segments = !input.state && NoSegmentEvents(events[d->second]);
      sum.trace_entries += TranslateEvents(w, events[d->second], pending_at_end, input.oom,
                                           oom_here, block_segments);
    }
    p.EndList();
  }
  p.EndList();
  p.EndDict();
  for (const auto& [_, d] : by_index) sum.devices.push_back(d.ToString());
  if (summary != nullptr) *summary = std::move(sum);
  return p.Finish();
}

}  // namespace devmem::memtrace
