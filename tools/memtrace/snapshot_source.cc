// tools/memtrace/snapshot_source.cc: loads a snapshot from a file or a live process, mapping
// failures onto memtrace's exit statuses (tools/memtrace/memtrace_commands.h).
#include "tools/memtrace/snapshot_source.h"

#include <cstdio>

#include "tools/http/http_get.h"
#include "tools/memtrace/memtrace_commands.h"

namespace devmem::memtrace {

bool IsUrl(const std::string& source) { return source.rfind("http://", 0) == 0; }

std::string SnapshotUrl(const std::string& source) {
  const size_t slash = source.find('/', 7);
  if (slash == std::string::npos) return source + "/debug/snapshot";
  if (slash == source.size() - 1) return source + "debug/snapshot";
  return source;
}

int LoadSnapshot(const std::string& command, const std::string& source,
                 const std::string& token_file, LoadedSnapshot* out) {
  auto fail = [&](const absl::Status& st, int code) {
    std::fprintf(stderr, "memtrace %s: %s\n", command.c_str(), std::string(st.message()).c_str());
    return code;
  };
  if (!IsUrl(source)) {
    if (!token_file.empty()) {
      std::fprintf(stderr, "memtrace %s: --token-file is ignored for a file source\n",
                   command.c_str());
    }
    absl::StatusOr<Snapshot> snap = ReadSnapshotFile(source);
    if (!snap.ok()) return fail(snap.status(), kExitBadInput);
    out->snap = std::move(*snap);
    return kExitOk;
  }
  std::string token;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> t = ReadTokenFile(token_file);
    if (!t.ok()) return fail(t.status(), kExitBadInput);
    token = std::move(*t);
  }
  const std::string url = SnapshotUrl(source);
  absl::StatusOr<std::string> body = HttpGetOk(url, token);
  if (!body.ok()) {
    return fail(body.status(), body.status().code() == absl::StatusCode::kInvalidArgument
                                   ? kExitBadInput
                                   : kExitUnreachable);
  }
  absl::StatusOr<Snapshot> snap = ParseSnapshot(*body, url);
  if (!snap.ok()) return fail(snap.status(), kExitBadInput);
  out->snap = std::move(*snap);
  out->text = std::move(*body);
  return kExitOk;
}

}  // namespace devmem::memtrace
