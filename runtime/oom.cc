// runtime/oom.cc: OOM dump files and OOM callbacks (see oom.h).
#include "runtime/oom.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

// A descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now; false (errno set) when close reports a write error.
  bool Close() {
    const int fd = std::exchange(fd_, -1);
    return fd < 0 || close(fd) == 0;
  }

 private:
  int fd_;
};

std::string Errno(int e) { return std::strerror(e); }

// 16 hex digits from the kernel's random source: a name another user cannot guess.
absl::StatusOr<std::string> RandomHex() {
  uint64_t bits = 0;
  if (getrandom(&bits, sizeof(bits), 0) != static_cast<ssize_t>(sizeof(bits))) {
    return absl::InternalError(absl::StrCat("getrandom: ", Errno(errno)));
  }
  return absl::StrFormat("%016x", bits);
}

// Creates `dir` (mode 0700; missing parents with the default mode) when it does not
// exist. An existing one is left as it is: the ownership check decides about it.
void CreateDumpDirectory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "dumps/" -> "dumps"
  if (std::filesystem::exists(p, ec)) return;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  (void)mkdir(p.c_str(), 0700);  // EEXIST from a race is fine; open() reports the rest
}

}  // namespace

std::string UnsafeDumpDirectoryReason(const struct stat& st, uid_t euid) {
  if (!S_ISDIR(st.st_mode)) return "it is not a directory";
  if (st.st_uid != euid && st.st_uid != 0) {
    return absl::StrCat("it is owned by uid ", st.st_uid, ", not by this process's user (uid ",
                        euid, ") or root");
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::StrFormat(
        "it is writable by %s without the sticky bit (mode %04o), so another user could "
        "replace the dumps; chmod o-w,g-w or +t it",
        (st.st_mode & S_IWOTH) != 0 ? "others" : "its group", st.st_mode & 07777);
  }
  return "";
}

std::string DumpDirectoryProblem(const std::string& dir) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return "";  // created at the first dump
    return absl::StrCat("cannot stat ", dir, ": ", Errno(errno));
  }
  if (const std::string why = UnsafeDumpDirectoryReason(st, geteuid()); !why.empty()) {
    return absl::StrCat(dir, ": ", why);
  }
  return "";
}

absl::StatusOr<std::string> WriteDumpFile(const std::string& dir, const std::string& stem,
                                          std::string_view text) {
  CreateDumpDirectory(dir);
  Fd dir_fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the OOM dump directory ", dir, ": ", Errno(errno)));
  }
  // Checked on the descriptor every later step uses, so no rename of `dir` in between
  // can substitute another directory.
  struct stat st {};
  if (fstat(dir_fd.get(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot stat the OOM dump directory ", dir, ": ", Errno(errno)));
  }
  if (const std::string why = UnsafeDumpDirectoryReason(st, geteuid()); !why.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("refusing the OOM dump directory ", dir, ": ", why));
  }
  absl::StatusOr<std::string> random = RandomHex();
  if (!random.ok()) return random.status();
  const std::string tmp = absl::StrCat(".devmem-oom-", *random, ".tmp");
  const std::string tmp_path = (std::filesystem::path(dir) / tmp).string();
  Fd out(openat(dir_fd.get(), tmp.c_str(),
                O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (out.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create OOM dump ", tmp_path, ": ", Errno(errno)));
  }
  auto fail = [&](std::string what, int e) {
    unlinkat(dir_fd.get(), tmp.c_str(), 0);
    return absl::InternalError(absl::StrCat(what, " ", tmp_path, ": ", Errno(e)));
  };
  for (std::string_view part : {text, std::string_view("\n")}) {
    while (!part.empty()) {
      const ssize_t n = write(out.get(), part.data(), part.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return fail("error writing OOM dump", n < 0 ? errno : EIO);
      part.remove_prefix(static_cast<size_t>(n));
    }
  }
  if (!out.Close()) return fail("error writing OOM dump", errno);
  // Publish under the first free name; never replace what is there (another dump, or
  // a symlink someone planted on a predictable name).
  constexpr int kMaxNames = 1000;
  for (int n = 1; n <= kMaxNames; ++n) {
    const std::string name =
        n == 1 ? absl::StrCat(stem, ".json") : absl::StrCat(stem, "-", n, ".json");
    int rc = renameat2(dir_fd.get(), tmp.c_str(), dir_fd.get(), name.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
      // The filesystem has no RENAME_NOREPLACE: a hard link fails the same way on an
      // existing name.
      rc = linkat(dir_fd.get(), tmp.c_str(), dir_fd.get(), name.c_str(), 0);
      if (rc == 0) unlinkat(dir_fd.get(), tmp.c_str(), 0);
    }
    if (rc == 0) return (std::filesystem::path(dir) / name).string();
    if (errno != EEXIST) {
      return fail(absl::StrCat("cannot name OOM dump ",
                               (std::filesystem::path(dir) / name).string(), " from"),
                  errno);
    }
  }
  return fail(absl::StrCat("no free name ", stem, "[-N].json for OOM dump"), EEXIST);
}


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
    // get "-2", "-3", ... rather than overwrite each other (WriteDumpFile).
    absl::StatusOr<std::string> written = WriteDumpFile(dir_, stem, text);
    if (!written.ok()) {
      std::fprintf(stderr, "devmem: out of memory on %s; no dump written: %s\n",
                   report.device.ToString().c_str(),
                   std::string(written.status().message()).c_str());
      return "";
    }
    const std::string& path = *written;
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
