// runtime/oom.cc: OOM dump files and OOM callbacks (see oom.h).
#include "runtime/oom.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/snapshot.h"
#include "runtime/json.h"
#include "runtime/trace.h"

namespace devmem {
namespace {

int64_t UnixNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FileDeviceName(DeviceId d) {
  if (d.type == DeviceType::kCpu) return "cpu";
  return absl::StrCat(std::string(DeviceTypeName(d.type)), d.index);
}

// Writes `text` to dir/name through a temporary file and rename(). Errors on stderr.
bool WriteAtomically(const std::string& dir, const std::string& name, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // fine if it exists
  const std::string final_path = (std::filesystem::path(dir) / name).string();
  const std::string tmp_path = (std::filesystem::path(dir) / ("." + name + ".tmp")).string();
  {
    std::ofstream out(tmp_path, std::ios::out | std::ios::trunc | std::ios::binary);
    if (!out) {
      std::fprintf(stderr, "devmem: cannot write OOM dump %s\n", tmp_path.c_str());
      return false;
    }
    out << text << '\n';
    out.flush();
    if (!out) {
      std::fprintf(stderr, "devmem: error writing OOM dump %s\n", tmp_path.c_str());
      out.close();
      std::filesystem::remove(tmp_path, ec);
      return false;
    }
  }
  std::filesystem::rename(tmp_path, final_path, ec);
  if (ec) {
    std::fprintf(stderr, "devmem: cannot rename OOM dump to %s: %s\n", final_path.c_str(),
                 ec.message().c_str());
    std::filesystem::remove(tmp_path, ec);
    return false;
  }
  return true;
}

}  // namespace

// --- OomDumper ---------------------------------------------------------------------------

OomDumper::OomDumper(std::string dir, int64_t min_interval_ns)
    : dir_(std::move(dir)), min_interval_ns_(min_interval_ns) {}

int64_t OomDumper::skipped() const {
  MutexLock lock(&mu_);
  return skipped_;
}

std::string OomDumper::MaybeDump(const OomReport& report, const CachingAllocator& allocator,
                                 const TraceRing* trace) noexcept {
  try {
    const int64_t now = NowNs();
    {
      MutexLock lock(&mu_);
      auto it = last_dump_ns_.find(report.device);
      if (it != last_dump_ns_.end() && now - it->second < min_interval_ns_) {
        ++skipped_;
        return "";
      }
      last_dump_ns_[report.device] = now;
    }
    RuntimeSnapshot snap;
    snap.time_ns = NowNs();
    snap.unix_time_ns = UnixNowNs();
    snap.devices.push_back(allocator.snapshot());
    std::vector<TraceEvent> events;
    if (trace != nullptr) {
      const uint64_t next = trace->next_seq();
      const uint64_t after = next > kOomDumpTraceEvents + 1 ? next - 1 - kOomDumpTraceEvents : 0;
      events = trace->since(after);
    }
    const std::string text =
        OomDumpToJson(snap, report, trace != nullptr ? &events : nullptr);
    const std::string stem =
        absl::StrCat("devmem-oom-", FileDeviceName(report.device), "-",
                     snap.unix_time_ns / 1'000'000, "-", static_cast<int64_t>(getpid()));
    // Two dumps of one device in one millisecond (only with a tiny min_interval_ns)
    // get "-2", "-3", ... rather than overwrite each other.
    std::string name = stem + ".json";
    std::error_code ec;
    for (int n = 2; std::filesystem::exists(std::filesystem::path(dir_) / name, ec); ++n) {
      name = absl::StrCat(stem, "-", n, ".json");
    }
    if (!WriteAtomically(dir_, name, text)) return "";
    const std::string path = (std::filesystem::path(dir_) / name).string();
    std::fprintf(stderr, "devmem: out of memory on %s; dump written to %s\n",
                 report.device.ToString().c_str(), path.c_str());
    return path;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "devmem: OOM dump failed: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "devmem: OOM dump failed\n");
  }
  return "";
}

// --- OomCallbackList ---------------------------------------------------------------------

struct OomCallbackList::Entry {
  OomCallback fn;
  bool removed = false;  // guarded by the list's mu_
  int running = 0;       // calls in progress; guarded by the list's mu_
};

namespace {
// The entry whose callback this thread is running, so that remove() from inside it
// does not wait for itself.
thread_local const void* tls_running_entry = nullptr;
}  // namespace

OomCallbackList::OomCallbackList() = default;
OomCallbackList::~OomCallbackList() = default;

int OomCallbackList::add(OomCallback callback) {
  auto entry = std::make_shared<Entry>();
  entry->fn = std::move(callback);
  MutexLock lock(&mu_);
  const int id = next_id_++;
  entries_.emplace(id, std::move(entry));
  return id;
}

bool OomCallbackList::remove(int id) {
  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  std::shared_ptr<Entry> entry = std::move(it->second);
  entries_.erase(it);
  entry->removed = true;
  if (tls_running_entry == entry.get()) return true;  // removing itself
  done_.wait(lock, [&] { return entry->running == 0; });
  return true;
}

size_t OomCallbackList::size() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

void OomCallbackList::run(const OomReport& report) noexcept {
  std::vector<std::shared_ptr<Entry>> list;
  try {
    MutexLock lock(&mu_);
    list.reserve(entries_.size());
    for (const auto& [id, entry] : entries_) list.push_back(entry);
  } catch (...) {
    return;  // out of host memory while copying the list: skip the callbacks
  }
  for (const std::shared_ptr<Entry>& entry : list) {
    {
      MutexLock lock(&mu_);
      if (entry->removed) continue;
      ++entry->running;
    }
    const void* outer = std::exchange(tls_running_entry, entry.get());
    try {
      entry->fn(report);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "devmem: an OOM callback threw: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "devmem: an OOM callback threw\n");
    }
    tls_running_entry = outer;
    {
      MutexLock lock(&mu_);
      --entry->running;
    }
    done_.notify_all();
  }
}

}  // namespace devmem
