// tools/http/live_trace.h: a running process's whole trace, read from its paged
// /debug/trace endpoint (runtime/http_server.h, docs/formats.md): pages of up to
// kLiveTracePage events, each asked with header=1 so that it starts with a header line
// naming the sites its events name, following X-Devmem-Next-Since until X-Devmem-More
// is 0 (or absent: a server that does not page sent all it had). The result is trace text (JSON Lines) that the trace readers take as it is:
// each page's header line adds to the site table. A process that refuses header=1 (older
// than it: HTTP 400 on the first page) is read without it, its sites then unnamed.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace devmem::memtrace {

inline constexpr uint64_t kLiveTracePage = 100000;  // the endpoint's maximum limit

struct LiveTrace {
  std::string text;     // header and event lines, page after page
  uint64_t pages = 0;
  uint64_t missed = 0;  // events overwritten before they were read (X-Devmem-Missed)
};

// Reads `base_url`'s ("http://HOST:PORT") trace from its start. Stops when the server
// says no more events are there, so a process that keeps allocating cannot hold it:
// at most `max_pages` pages (then an error naming the URL and the count), and a page
// that does not move X-Devmem-Next-Since forward is an error too. Errors name the URL.
// `page` is the limit asked per request (tests ask small pages).
absl::StatusOr<LiveTrace> FetchLiveTrace(const std::string& base_url, const std::string& token,
                                         uint64_t max_pages = 10000,
                                         uint64_t page = kLiveTracePage);

}  // namespace devmem::memtrace
