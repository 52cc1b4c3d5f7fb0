// tools/memtrace/memtrace_watch.cc: `memtrace watch URL`: a top-like view of a running process:
// every --interval seconds it fetches /debug/snapshot and redraws a table of devices
// and the top sites. On a terminal the screen is cleared between frames and 'q' (or
// Ctrl-C) quits: stdin is put in non-canonical, no-echo mode and polled, and restored
// on the way out. Off a terminal (tests, pipes) frames are separated by a blank line,
// and --iterations N bounds the run. --json prints one JSON object per frame (JSON Lines).
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <csignal>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "tools/inspect/inspect_format.h"
#include "tools/memtrace/memtrace_commands.h"
#include "tools/inspect/site_usage.h"
#include "tools/memtrace/snapshot_source.h"

namespace devmem::memtrace {
namespace {

using ojson = nlohmann::ordered_json;

volatile std::sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

struct WatchOptions {
  std::string url, token_file;
  double interval = 2.0;
  size_t top = 15;
  long iterations = 0;  // 0: until 'q'
  bool json = false;
};

// Puts a terminal stdin in non-canonical no-echo mode while alive.
class RawStdin {
 public:
  RawStdin() {
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    active_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  ~RawStdin() {
    if (active_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  bool active() const { return active_; }

 private:
  termios saved_{};
  bool active_ = false;
};

// Waits up to `seconds`; true when the user asked to quit ('q', 'Q', Ctrl-C).
bool WaitOrQuit(double seconds, bool read_keys) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
  for (;;) {
    if (g_interrupted) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{STDIN_FILENO, POLLIN, 0};
    const int timeout = static_cast<int>(std::min<long long>(left.count(), 200));
    if (!read_keys) {
      ::poll(nullptr, 0, timeout);
      continue;
    }
    if (::poll(&p, 1, timeout) > 0 && (p.revents & POLLIN)) {
      char c = 0;
      if (::read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q')) return true;
    }
  }
}

std::string Frame(const WatchOptions& o, const Snapshot& snap) {
  std::string out;
  char line[256];
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof(when), "%H:%M:%S", std::localtime(&now));
  std::snprintf(line, sizeof(line), "memtrace watch %s  %s  every %.1fs  (q quits)\n\n",
                o.url.c_str(), when, o.interval);
  out += line;
  TextTable dev({"<DEVICE", "TOTAL", "DRIVER FREE", "ALLOCATED", "RESERVED", "LIVE BUFFERS",
                 "OOMS"});
  for (const SnapDevice& d : snap.devices) {
    uint64_t live = 0;
    for (const SnapBlock& b : d.blocks) live += b.state == BlockKind::kAllocated;
    dev.Add({d.device, Bytes(d.total_bytes), Bytes(d.free_bytes),
             Bytes(static_cast<uint64_t>(std::max<int64_t>(0, d.allocated_bytes))),
             Bytes(static_cast<uint64_t>(std::max<int64_t>(0, d.reserved_bytes))),
             std::to_string(live), std::to_string(d.num_ooms)});
  }
  out += dev.Render() + "\n";
  BufferTotals totals;
  const std::vector<SiteGroup> groups = GroupBySite(snap, BufferQuery{}, &totals);
  TextTable sites({"<DEVICE", "COUNT", "BYTES", "SHARE", "OLDEST", "<SITE"});
  for (size_t i = 0; i < std::min(o.top, groups.size()); ++i) {
    const SiteGroup& g = groups[i];
    sites.Add({g.device->device, std::to_string(g.count), Bytes(g.bytes),
               FormatShare(g.bytes, g.device->total_bytes), FormatAge(g.oldest_age_ns),
               snap.Site(g.site).where});
  }
  out += sites.Render();
  if (groups.empty()) out += "(no live buffers)\n";
  return out;
}

ojson FrameJson(const Snapshot& snap, size_t top) {
  ojson devices = ojson::array();
  for (const SnapDevice& d : snap.devices) {
    uint64_t live = 0;
    for (const SnapBlock& b : d.blocks) live += b.state == BlockKind::kAllocated;
    devices.push_back(ojson{{"device", d.device}, {"total_bytes", d.total_bytes},
                            {"free_bytes", d.free_bytes}, {"allocated_bytes", d.allocated_bytes},
                            {"reserved_bytes", d.reserved_bytes}, {"live_buffers", live},
                            {"num_ooms", d.num_ooms}});
  }
  ojson sites = ojson::array();
  const std::vector<SiteGroup> groups = GroupBySite(snap, BufferQuery{}, nullptr);
  for (size_t i = 0; i < std::min(top, groups.size()); ++i) {
    const SiteGroup& g = groups[i];
    sites.push_back(ojson{{"device", g.device->device}, {"where", snap.Site(g.site).where},
                          {"count", g.count}, {"bytes", g.bytes}});
  }
  return ojson{{"time_ns", snap.time_ns}, {"devices", std::move(devices)},
               {"sites", std::move(sites)}};
}

int RunWatch(const WatchOptions& o) {
  if (!IsUrl(o.url)) {
    std::fprintf(stderr, "memtrace watch: \"%s\": expected the URL of a running process "
                 "(http://HOST:PORT)\n", o.url.c_str());
    return kExitBadInput;
  }
  if (!(o.interval >= 0.05 && o.interval <= 3600)) {
    std::fprintf(stderr, "memtrace watch: --interval %g: expected 0.05..3600 seconds\n",
                 o.interval);
    return kExitBadInput;
  }
  if (o.iterations < 0) {
    std::fprintf(stderr, "memtrace watch: --iterations %ld: expected >= 0\n", o.iterations);
    return kExitBadInput;
  }
  const bool tty_out = isatty(STDOUT_FILENO) && !o.json;
  RawStdin raw;
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigaction(SIGINT, &sa, nullptr);
  for (long i = 0; o.iterations == 0 || i < o.iterations; ++i) {
    LoadedSnapshot loaded;
    if (int rc = LoadSnapshot("watch", o.url, o.token_file, &loaded); rc != kExitOk) return rc;
    if (o.json) {
      std::printf("%s\n", FrameJson(loaded.snap, o.top).dump().c_str());
    } else {
      const std::string frame = Frame(o, loaded.snap);
      std::printf("%s%s", tty_out ? "\x1b[H\x1b[2J" : (i > 0 ? "\n" : ""), frame.c_str());
    }
    std::fflush(stdout);
    if (o.iterations != 0 && i + 1 == o.iterations) break;
    if (WaitOrQuit(o.interval, raw.active())) break;
  }
  return kExitOk;
}

}  // namespace

void AddWatchCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<WatchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "watch", "A live, top-like view of a running process's devices and top sites");
  cmd->add_option("url", o->url, "http://HOST:PORT of the process")->required();
  cmd->add_option("--token-file", o->token_file, "file holding the bearer token (http_token_file)");
  cmd->add_option("--interval", o->interval, "seconds between refreshes (default 2)");
  cmd->add_option("--top", o->top, "sites to show (default 15)");
  cmd->add_option("--iterations", o->iterations,
                  "stop after this many refreshes (default 0: until q or Ctrl-C)");
  cmd->add_flag("--json", o->json, "one JSON object per refresh (JSON Lines)");
  cmd->callback([o, exit_code] { *exit_code = RunWatch(*o); });
}

}  // namespace devmem::memtrace
