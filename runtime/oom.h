// runtime/oom.h: what the runtime does when an allocation fails for good: it writes a
// dump file (OomDumper) and calls the program's callbacks (OomCallbackList).
//
//   OomDumper dumper("/var/tmp/devmem");          // config.oom_dump_dir
//   std::string path = dumper.MaybeDump(report, allocator, trace);
//
// Dump files are named devmem-oom-<device>-<unix_ms>-<pid>.json, with the device
// written without its colon ("sim0", "cuda1", "cpu": colons upset scp and some
// filesystems). Each holds the snapshot of the failing device (runtime/json.h,
// docs/formats.md), the most recent trace events when a ring is given, and the
// OomReport under "oom". The file is written under a temporary name in the same
// directory and renamed, so a reader never sees half a dump.
//
// Safety in a shared directory (WriteDumpFile): the directory is opened once and every
// later step works relative to that descriptor (openat/renameat2), so swapping the
// path for a symlink halfway changes nothing. The directory must belong to the
// process's effective user (or to root) and, if group or others may write to it, have
// the sticky bit; otherwise no dump is written and stderr says why. A missing
// directory is created with mode 0700. The temporary file has an unpredictable name
// (".devmem-oom-<16 random hex>.tmp"), is created with O_CREAT|O_EXCL|O_NOFOLLOW and
// mode 0600, and is published without replacing anything (renameat2 RENAME_NOREPLACE,
// or link+unlink where the filesystem lacks it): a file or symlink already holding the
// final name is left alone and the dump takes the next free "-2", "-3", ... name.
//
// Rate limit: at most one dump per device per `min_interval_ns` (one second unless
// given): a program that catches OutOfMemoryError and retries in a loop must not fill
// the disk. OOMs inside the interval are counted (skipped()) but not dumped.
//
// Neither class throws from the OOM path: errors (unwritable directory, full disk, a
// callback that throws) go to stderr.
//
// Thread-safety: every method may be called from any thread. They run from
// AllocatorObserver::on_oom, after the allocator released its device lock, so they may
// take the allocator's lock again (snapshot) and do I/O.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "allocator/caching_allocator.h"
#include "allocator/mutex.h"
#include "allocator/oom_report.h"
#include "allocator/types.h"

namespace devmem {

class TraceRing;

inline constexpr int64_t kOomDumpIntervalNs = 1'000'000'000;  // one dump per second
inline constexpr size_t kOomDumpTraceEvents = 4096;  // newest events kept in a dump

// Why a dump directory with status `st` is not safe to write into for the effective
// user `euid`, or "" when it is: not a directory; owned by someone other than `euid`
// or root; writable by group or others without the sticky bit.
std::string UnsafeDumpDirectoryReason(const struct stat& st, uid_t euid);

// What would stop dumps into `dir` now ("" when nothing: it is safe, or does not exist
// yet and will be created): the runtime warns at start-up, so that a bad oom_dump_dir
// is known before the first OOM rather than at it.
std::string DumpDirectoryProblem(const std::string& dir);

// Writes `text` and a newline to a new file `dir`/`stem`.json (or `stem`-2.json, ...
// when that name is taken), safely against other users of a shared `dir` (see the file
// comment). Returns the path written; the error names the directory or file and the
// reason, and leaves no temporary file behind.
absl::StatusOr<std::string> WriteDumpFile(const std::string& dir, const std::string& stem,
                                          std::string_view text);

class OomDumper {
 public:
  explicit OomDumper(std::string dir, int64_t min_interval_ns = kOomDumpIntervalNs);

  // Writes a dump of `allocator` (the one that failed) for `report`, with the newest
  // kOomDumpTraceEvents events of `trace` when it is not null. Returns the file's path,
  // or "" when rate-limited or on error (then a line on stderr). Never throws.
  std::string MaybeDump(const OomReport& report, const CachingAllocator& allocator,
                        const TraceRing* trace) noexcept;

  const std::string& dir() const { return dir_; }
  // OOMs not dumped because of the rate limit.
  int64_t skipped() const;

 private:
  const std::string dir_;
  const int64_t min_interval_ns_;
  mutable Mutex mu_;
  std::map<DeviceId, int64_t> last_dump_ns_ ABSL_GUARDED_BY(mu_);
  int64_t skipped_ ABSL_GUARDED_BY(mu_) = 0;
};

using OomCallback = std::function<void(const OomReport&)>;

// The program's OOM callbacks. Each is called once per OutOfMemoryError (not rate
// limited), on the thread whose allocation failed, before the exception is thrown; the
// report is the one the exception will carry. A callback must not allocate on the
// device that just failed (it would likely fail again).
class OomCallbackList {
 public:
  OomCallbackList();
  ~OomCallbackList();

  // Returns an id for remove(); ids are never reused.
  int add(OomCallback callback);
  // Removes the callback and waits until no call of it is running on another thread,
  // so state it captured may be destroyed afterwards (a callback may remove itself:
  // that does not wait). False when `id` is unknown.
  bool remove(int id);
  // Calls every callback with `report`; exceptions are caught and reported on stderr.
  void run(const OomReport& report) noexcept;
  size_t size() const;

 private:
  struct Entry;
  mutable Mutex mu_;
  CondVar done_;
  std::map<int, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  int next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace devmem
