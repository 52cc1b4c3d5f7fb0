// tools/http/live_trace.cc: pages through /debug/trace (tools/http/live_trace.h).
#include "tools/http/live_trace.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tools/http/http_get.h"

namespace devmem::memtrace {
namespace {

absl::StatusOr<uint64_t> CountHeader(const HttpResponse& r, const std::string& url,
                                     const char* name) {
  const std::string* v = r.Header(name);
  uint64_t n = 0;
  if (v == nullptr || !absl::SimpleAtoi(*v, &n)) {
    return absl::UnavailableError(absl::StrCat(
        "GET ", url, ": header ", name, " missing or not a count (",
        v == nullptr ? std::string("absent") : "\"" + v->substr(0, 40) + "\"",
        "): not a devmem trace endpoint?"));
  }
  return n;
}

}  // namespace

absl::StatusOr<LiveTrace> FetchLiveTrace(const std::string& base_url, const std::string& token,
                                         uint64_t max_pages, uint64_t page) {
  LiveTrace out;
  uint64_t since = 0;
  bool with_header = true;
  for (;;) {
    if (out.pages == max_pages) {
      return absl::UnavailableError(absl::StrCat(base_url, "/debug/trace: still more events after ",
                                                 max_pages, " pages of ", page));
    }
    const std::string url = absl::StrCat(base_url, "/debug/trace?since=", since,
                                         "&limit=", page, with_header ? "&header=1" : "");
    absl::StatusOr<HttpResponse> r = HttpGetOkResponse(url, token);
    // A process older than header=1 refuses the parameter (400; since and limit are
    // ours and valid): read its events without site names rather than nothing.
    if (!r.ok() && with_header && out.pages == 0 &&
        absl::StrContains(r.status().message(), ": HTTP 400 ")) {
      with_header = false;
      continue;
    }
    if (!r.ok()) return r.status();
    // A server without the paging headers (an older devmem) sent everything it had.
    const std::string* more = r->Header("x-devmem-more");
    if (r->Header("x-devmem-missed") != nullptr) {
      absl::StatusOr<uint64_t> missed = CountHeader(*r, url, "x-devmem-missed");
      if (!missed.ok()) return missed.status();
      out.missed += *missed;
    }
    ++out.pages;
    out.text += r->body;
    if (!out.text.empty() && out.text.back() != '\n') out.text.push_back('\n');
    if (more == nullptr || *more != "1") break;
    absl::StatusOr<uint64_t> next = CountHeader(*r, url, "x-devmem-next-since");
    if (!next.ok()) return next.status();
    if (*next <= since) {
      return absl::UnavailableError(absl::StrCat("GET ", url, ": X-Devmem-More is 1 but "
                                                 "X-Devmem-Next-Since (", *next,
                                                 ") did not move forward"));
    }
    since = *next;
  }
  return out;
}

}  // namespace devmem::memtrace
