// tools/memtrace/memtrace_diff.cc: `memtrace diff A B`: leak hunting. Per (device, site), the
// live bytes and buffer counts in snapshot A and in snapshot B, largest change first.
// Sites are matched by their text, not their ids (ids belong to the process that wrote
// the file). --fail-on-growth BYTES makes it a CI check: exit status 1 when the total
// growth (the sum of the sites that grew, so a leak is not hidden by a site that shrank
// elsewhere) exceeds BYTES.
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "allocator/config.h"
#include "nlohmann/json.hpp"
#include "tools/inspect/inspect_format.h"
#include "tools/memtrace/memtrace_commands.h"
#include "tools/inspect/site_usage.h"
#include "tools/memtrace/snapshot_source.h"

namespace devmem::memtrace {
namespace {

using ojson = nlohmann::ordered_json;

struct DiffOptions {
  std::string a, b, token_file, device, site, fail_on_growth;
  size_t top = 20;
  bool json = false;
};

int RunDiff(const DiffOptions& o) {
  std::optional<uint64_t> limit;
  if (!o.fail_on_growth.empty()) {
    absl::StatusOr<size_t> n = ParseSize(o.fail_on_growth);
    if (!n.ok()) {
      std::fprintf(stderr, "memtrace diff: --fail-on-growth \"%s\": %s\n",
                   o.fail_on_growth.c_str(), std::string(n.status().message()).c_str());
      return kExitBadInput;
    }
    limit = *n;
  }
  // The two reads are independent: overlapping them halves the wait on large files.
  LoadedSnapshot a, b;
  int rc_b = kExitOk;
  std::thread read_b([&] { rc_b = LoadSnapshot("diff", o.b, o.token_file, &b); });
  const int rc_a = LoadSnapshot("diff", o.a, o.token_file, &a);
  read_b.join();
  if (rc_a != kExitOk) return rc_a;
  if (rc_b != kExitOk) return rc_b;
  BufferQuery q;
  q.device = o.device;
  q.site = o.site;
  DiffTotals t;
  const std::vector<SiteDelta> rows = DiffSites(a.snap, b.snap, q, &t);
  const size_t n = o.top == 0 ? rows.size() : std::min(o.top, rows.size());
  const bool failed = limit && t.grew_bytes > *limit;
  if (o.json) {
    ojson sites = ojson::array();
    for (size_t i = 0; i < n; ++i) {
      const SiteDelta& r = rows[i];
      sites.push_back(ojson{{"device", r.device}, {"where", r.where}, {"copy", r.copy},
                            {"bytes_a", r.bytes_a}, {"bytes_b", r.bytes_b},
                            {"delta_bytes", r.delta_bytes()}, {"count_a", r.count_a},
                            {"count_b", r.count_b}, {"delta_count", r.delta_count()}});
    }
    ojson out{{"a", o.a}, {"b", o.b}, {"live_bytes_a", t.bytes_a}, {"live_bytes_b", t.bytes_b},
              {"net_bytes", SignedDelta(t.bytes_a, t.bytes_b)},
              {"grew_bytes", t.grew_bytes}, {"shrank_bytes", t.shrank_bytes},
              {"grew_sites", t.grew_sites}, {"shrank_sites", t.shrank_sites},
              {"unchanged_sites", t.unchanged_sites}, {"changed_sites", rows.size()},
              {"returned", n}, {"sites", std::move(sites)}};
    if (limit) {
      out["fail_on_growth_bytes"] = *limit;
      out["failed"] = failed;
    }
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::printf("A  %s: %s live\nB  %s: %s live\n", o.a.c_str(), Bytes(t.bytes_a).c_str(),
                o.b.c_str(), Bytes(t.bytes_b).c_str());
    std::printf("net %s; grew %s at %llu sites, shrank %s at %llu sites, %llu unchanged\n\n",
                FormatDelta(SignedDelta(t.bytes_a, t.bytes_b))
                    .c_str(),
                Bytes(t.grew_bytes).c_str(), static_cast<unsigned long long>(t.grew_sites),
                Bytes(t.shrank_bytes).c_str(), static_cast<unsigned long long>(t.shrank_sites),
                static_cast<unsigned long long>(t.unchanged_sites));
    if (rows.empty()) {
      std::printf("no site changed\n");
    } else {
      TextTable table({"<DEVICE", "DELTA", "A", "B", "COUNT A", "COUNT B", "DELTA COUNT",
                       "<SITE"});
      for (size_t i = 0; i < n; ++i) {
        const SiteDelta& r = rows[i];
        const int64_t dc = r.delta_count();
        table.Add({r.device, FormatDelta(r.delta_bytes()), Bytes(r.bytes_a), Bytes(r.bytes_b),
                   std::to_string(r.count_a), std::to_string(r.count_b),
                   (dc > 0 ? "+" : "") + std::to_string(dc), r.where});
      }
      std::printf("%s", table.Render().c_str());
      if (n < rows.size()) {
        std::printf("(%zu more changed sites; --top 0 shows all)\n", rows.size() - n);
      }
    }
    if (limit) {
      std::printf("\n%s: growth %s %s the limit %s\n", failed ? "FAIL" : "ok",
                  Bytes(t.grew_bytes).c_str(), failed ? "exceeds" : "is within",
                  Bytes(*limit).c_str());
    }
  }
  return failed ? kExitNo : kExitOk;
}

}  // namespace

void AddDiffCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<DiffOptions>();
  CLI::App* cmd = app.add_subcommand(
      "diff", "What grew and what shrank, per site, between two snapshots (leak hunting)");
  cmd->add_option("a", o->a, "the earlier snapshot: a file or http://HOST:PORT")->required();
  cmd->add_option("b", o->b, "the later snapshot: a file or http://HOST:PORT")->required();
  cmd->add_option("--fail-on-growth", o->fail_on_growth,
                  "exit status 1 when the sites that grew add up to more than this, e.g. 64MiB");
  cmd->add_option("--token-file", o->token_file, "file holding the bearer token (for URLs)");
  cmd->add_option("--device", o->device, "only this device, e.g. sim:0");
  cmd->add_option("--site", o->site, "only sites whose text contains this");
  cmd->add_option("--top", o->top, "rows to show (default 20; 0: all)");
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->callback([o, exit_code] { *exit_code = RunDiff(*o); });
}

}  // namespace devmem::memtrace
