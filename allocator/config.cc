// allocator/config.cc: parsing, printing and documenting devmem's Config.
//
// One table (Keys() below) drives everything: each key's parser, its canonical printer
// and its documentation. ParseConfig, ToString and ConfigKeys() all walk that table,
// so a key cannot be parseable but undocumented, or documented but not printed.
//
// Grammar (a superset of PYTORCH_CUDA_ALLOC_CONF's):
//   config := "" | item ("," item)*
//   item   := WS* key WS* ":" WS* value WS*
//   value  := bare | '"' (char | '\"' | '\\')* '"'
// A bare value runs to the next comma; whitespace around it is dropped. A quoted value
// is taken literally (commas, quotes and edge whitespace included), so that ToString
// can print any string field and read it back. An empty string (or only whitespace)
// sets nothing; an empty item (",,", or a leading or trailing comma) is an error that
// names its position, since it is usually a variable that expanded to nothing.
//
// Every function here is pure and thread-safe (ConfigFromEnv reads the environment,
// which is as thread-safe as the program's use of setenv).
#include "allocator/config.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "allocator/string_view_bridge.h"
#include "allocator/types.h"

namespace devmem {

std::string_view ExpandableModeName(ExpandableMode mode) {
  switch (mode) {
    case ExpandableMode::kAuto: return "auto";
    case ExpandableMode::kOff: return "false";
    case ExpandableMode::kOn: return "true";
  }
  return "?";
}

std::string_view BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto: return "auto";
    case BackendKind::kCuda: return "cuda";
    case BackendKind::kSim: return "sim";
    case BackendKind::kCpu: return "cpu";
  }
  return "unknown";
}

namespace {

constexpr size_t kTiB = size_t{1} << 40;
constexpr size_t kPiB = size_t{1} << 50;

std::string_view Trim(std::string_view s) { return Sv(absl::StripAsciiWhitespace(Av(s))); }
std::string_view TrimLeft(std::string_view s) {
  return Sv(absl::StripLeadingAsciiWhitespace(Av(s)));
}
std::string_view TrimRight(std::string_view s) {
  return Sv(absl::StripTrailingAsciiWhitespace(Av(s)));
}
std::string Lower(std::string_view s) { return absl::AsciiStrToLower(Av(s)); }

// Quotes `text` for an error message: "abc", with control characters and quotes
// escaped so that a message is always one line. Text longer than kMaxQuoted bytes is
// cut there and its length given ("aaaa..." (10240 bytes)): a message names the input,
// it need not hold all of a 10 KB value.
constexpr size_t kMaxQuoted = 64;
std::string Quote(std::string_view text) {
  if (text.size() <= kMaxQuoted) {
    return absl::StrCat("\"", absl::CHexEscape(Av(text)), "\"");
  }
  return absl::StrCat("\"", absl::CHexEscape(Av(text.substr(0, kMaxQuoted))), "\"... (",
                      text.size(), " bytes)");
}

// ---------------------------------------------------------------------------------
// Scalar parsers. Each returns "" on success, or the reason the value is bad, phrased
// to follow `value "..."` in a message ("is not an integer").

std::string ParseUnsigned(std::string_view text, uint64_t* out) {
  if (text.empty()) return "is empty; expected an unsigned integer";
  if (text.front() == '-') return "is negative; expected an unsigned integer";
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out, 10);
  if (ec == std::errc::result_out_of_range) return "is too large (overflows 64 bits)";
  if (ec != std::errc() || ptr != end) return "is not an integer";
  return "";
}

std::string ParseUnsignedInRange(std::string_view text, uint64_t lo, uint64_t hi,
                                 uint64_t* out) {
  std::string why = ParseUnsigned(text, out);
  if (!why.empty()) return why;
  if (*out < lo || *out > hi) return absl::StrCat("is out of range (", lo, " .. ", hi, ")");
  return "";
}

// Rejects NaN and infinities: from_chars accepts "nan" and "inf", which no knob means.
std::string ParseFiniteDouble(std::string_view text, double* out) {
  if (text.empty()) return "is empty; expected a number";
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  if (ec == std::errc::result_out_of_range) return "is out of range for a double";
  if (ec != std::errc() || ptr != end) return "is not a number";
  if (!std::isfinite(*out)) return "is not a finite number";
  if (*out == 0) *out = 0;  // -0 prints as "-0"; keep one zero
  return "";
}

std::string ParseBool(std::string_view text, bool* out) {
  std::string lower = Lower(text);
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") {
    *out = true;
    return "";
  }
  if (lower == "false" || lower == "0" || lower == "no" || lower == "off") {
    *out = false;
    return "";
  }
  return "is not a boolean (expected true/false, 1/0, yes/no or on/off)";
}

// Sizes: digits, an optional fraction, optional spaces, an optional binary unit. The
// result must be a whole number of bytes ("1.5KiB" is 1536; "0.3KiB" is an error).
std::string ParseSizeImpl(std::string_view text, size_t* out) {
  text = Trim(text);
  constexpr std::string_view kExpected =
      "is not a size (expected a byte count with an optional unit B, KiB, MiB, GiB or "
      "TiB, e.g. 512, 2MiB, 1.5GiB)";
  if (text.empty()) return std::string(kExpected);
  if (text.front() == '-') return "is negative; expected a size";
  size_t i = 0;
  while (i < text.size() && absl::ascii_isdigit(text[i])) ++i;
  std::string_view int_digits = text.substr(0, i);
  std::string_view frac_digits;
  if (i < text.size() && text[i] == '.') {
    size_t start = ++i;
    while (i < text.size() && absl::ascii_isdigit(text[i])) ++i;
    frac_digits = text.substr(start, i - start);
  }
  if (int_digits.empty() && frac_digits.empty()) return std::string(kExpected);
  std::string_view unit = TrimLeft(text.substr(i));

  static constexpr std::array<std::pair<std::string_view, size_t>, 14> kUnits = {{
      {"", 1},           {"b", 1},
      {"k", kKiB},       {"kb", kKiB},     {"kib", kKiB},
      {"m", kMiB},       {"mb", kMiB},     {"mib", kMiB},
      {"g", kGiB},       {"gb", kGiB},     {"gib", kGiB},
      {"t", kTiB},       {"tb", kTiB},     {"tib", kTiB},
  }};
  std::string lower_unit = Lower(unit);
  size_t multiplier = 0;
  for (const auto& [name, value] : kUnits) {
    if (lower_unit == name) multiplier = value;
  }
  if (multiplier == 0) return std::string(kExpected);

  uint64_t int_part = 0;
  if (!int_digits.empty()) {
    auto [ptr, ec] = std::from_chars(int_digits.data(),
                                     int_digits.data() + int_digits.size(), int_part);
    if (ec != std::errc()) return "is too large (overflows 64 bits)";
  }
  // 128-bit arithmetic: int_part < 2^64 and multiplier <= 2^40, so no product of two
  // factors below overflows; fractions are limited to 18 digits (< 2^60) for the same
  // reason.
  using u128 = unsigned __int128;
  u128 total = u128{int_part} * multiplier;
  if (!frac_digits.empty()) {
    if (frac_digits.size() > 18) return "has too many decimal places (at most 18)";
    uint64_t frac = 0;
    std::from_chars(frac_digits.data(), frac_digits.data() + frac_digits.size(), frac);
    u128 scale = 1;
    for (size_t d = 0; d < frac_digits.size(); ++d) scale *= 10;
    u128 frac_bytes = u128{frac} * multiplier;
    if (frac_bytes % scale != 0) return "is not a whole number of bytes";
    total += frac_bytes / scale;
  }
  if (total > std::numeric_limits<size_t>::max()) return "is too large (overflows 64 bits)";
  *out = static_cast<size_t>(total);
  return "";
}

// ---------------------------------------------------------------------------------
// Canonical printers. Each prints a value that its parser reads back exactly.

// The largest binary unit that divides `bytes` exactly: "16GiB", "1536KiB", "1000".
std::string FormatSizeExact(size_t bytes) {
  static constexpr std::array<std::pair<std::string_view, size_t>, 4> kUnits = {{
      {"TiB", kTiB}, {"GiB", kGiB}, {"MiB", kMiB}, {"KiB", kKiB}}};
  if (bytes == 0) return "0";
  for (const auto& [name, unit] : kUnits) {
    if (bytes % unit == 0) return absl::StrCat(bytes / unit, Av(name));
  }
  return absl::StrCat(bytes);
}

// The shortest text that from_chars reads back as the same double.
std::string FormatDouble(double value) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, ptr);
}

bool NeedsQuotes(std::string_view s) {
  if (s.empty()) return false;
  if (absl::ascii_isspace(s.front()) || absl::ascii_isspace(s.back())) return true;
  return s.find_first_of(",\"\\") != std::string_view::npos;
}

std::string FormatString(std::string_view s) {
  if (!NeedsQuotes(s)) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

// ---------------------------------------------------------------------------------
// The key table.

struct KeySpec {
  std::string_view key;
  std::string_view type;
  std::string_view default_value;  // canonical form; ParseConfig("key:default") == {}
  std::string_view meaning;
  // Sets the field from `value`; returns "" or the reason (see the parsers above).
  std::string (*parse)(std::string_view value, Config* config);
  std::string (*format)(const Config& config);
};

std::string ParseBackend(std::string_view value, Config* c) {
  std::string lower = Lower(value);
  for (BackendKind kind :
       {BackendKind::kAuto, BackendKind::kCuda, BackendKind::kSim, BackendKind::kCpu}) {
    if (lower == BackendKindName(kind)) {
      c->backend = kind;
      return "";
    }
  }
  return "is not a backend (expected auto, cuda, sim or cpu)";
}

std::string ParseLatencyUs(std::string_view value, uint64_t* ns) {
  uint64_t us = 0;
  std::string why = ParseUnsignedInRange(value, 0, 1'000'000, &us);
  if (why.empty()) *ns = us * 1000;
  return why;
}

std::string ParseMaxSplit(std::string_view value, Config* c) {
  std::string lower = Lower(value);
  if (lower == "none" || lower == "inf") {
    c->max_split_size = std::numeric_limits<size_t>::max();
    return "";
  }
  // The upper bound keeps the byte count representable in DeviceStats::max_split_size
  // (an int64).
  constexpr uint64_t kMaxMiB = uint64_t{std::numeric_limits<int64_t>::max()} / kMiB;
  uint64_t mb = 0;
  std::string why = ParseUnsigned(value, &mb);
  if (!why.empty()) {
    if (why == "is not an integer") return "is not an integer number of MiB or \"none\"";
    return why;
  }
  if (mb < 20) return "is too small (at least 20 MiB, or \"none\")";
  if (mb > kMaxMiB) return absl::StrCat("is too large (at most ", kMaxMiB, ")");
  c->max_split_size = static_cast<size_t>(mb) * kMiB;
  return "";
}

std::string ParseHttp(std::string_view value, Config* c) {
  if (value.empty()) {
    c->http.clear();
    return "";
  }
  constexpr std::string_view kShape =
      "is not ADDRESS:PORT (e.g. 127.0.0.1:9400, localhost:0, [::1]:9400)";
  std::string_view address;
  std::string_view port;
  if (value.front() == '[') {
    size_t close = value.find(']');
    if (close == std::string_view::npos) return std::string(kShape);
    address = value.substr(1, close - 1);
    std::string_view rest = value.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return std::string(kShape);
    port = rest.substr(1);
    if (address.empty()) return "has an empty address";
    // An IPv6 literal, with an optional zone after '%' ("fe80::1%eth0").
    size_t percent = address.find('%');
    std::string_view literal = address.substr(0, percent);
    bool ok = literal.find(':') != std::string_view::npos;
    for (char ch : literal) {
      ok = ok && (absl::ascii_isxdigit(ch) || ch == ':' || ch == '.');
    }
    if (percent != std::string_view::npos) {
      std::string_view zone = address.substr(percent + 1);
      ok = ok && !zone.empty();
      for (char ch : zone) {
        ok = ok && (absl::ascii_isalnum(ch) || ch == '-' || ch == '_' || ch == '.');
      }
    }
    if (!ok) return "has a bracketed address that is not an IPv6 address";
  } else {
    size_t colon = value.rfind(':');
    if (colon == std::string_view::npos) return std::string(kShape);
    address = value.substr(0, colon);
    port = value.substr(colon + 1);
    if (address.empty()) return "has an empty address";
    if (address.find(':') != std::string_view::npos) {
      return "has an IPv6 address without brackets (write [ADDRESS]:PORT, e.g. [::1]:9400)";
    }
    // A host name or an IPv4 address: letters, digits, '.', '-' and '_'.
    for (char ch : address) {
      if (!absl::ascii_isalnum(ch) && ch != '.' && ch != '-' && ch != '_') {
        return "has an address with a character that no host name contains";
      }
    }
  }
  uint64_t port_number = 0;
  if (port.empty() || port.size() > 5 || !ParseUnsigned(port, &port_number).empty()) {
    return "has a port that is not a number in 0..65535";
  }
  if (port_number > 65535) return "has a port that is not a number in 0..65535";
  c->http = std::string(value);
  return "";
}

const std::array<KeySpec, 29>& Keys() {
  static const std::array<KeySpec, 29> keys = {{
      {"backend", "enum", "auto",
       "Which backend serves memory: auto (cuda when a GPU is present, else sim), cuda, "
       "sim (a simulated device) or cpu (host memory through jemalloc).",
       ParseBackend,
       [](const Config& c) { return std::string(BackendKindName(c.backend)); }},
      {"sim_capacity", "size", "16GiB",
       "Capacity of each simulated device, 1MiB .. 1024TiB (1 PiB). Sizes take B, KiB, "
       "MiB, GiB, TiB (or K, M, G, T).",
       [](std::string_view v, Config* c) -> std::string {
         size_t bytes = 0;
         std::string why = ParseSizeImpl(v, &bytes);
         if (!why.empty()) return why;
         if (bytes < kMiB || bytes > kPiB) return "is out of range (1MiB .. 1024TiB)";
         c->sim_capacity = bytes;
         return "";
       },
       [](const Config& c) { return FormatSizeExact(c.sim_capacity); }},
      {"sim_alloc_latency_us", "integer (microseconds)", "0",
       "Simulated cost of each segment allocation, 0 .. 1000000 us: shows what caching "
       "saves against a cudaMalloc-like cost.",
       [](std::string_view v, Config* c) {
         return ParseLatencyUs(v, &c->sim_alloc_latency_ns);
       },
       [](const Config& c) { return absl::StrCat(c.sim_alloc_latency_ns / 1000); }},
      {"sim_free_latency_us", "integer (microseconds)", "0",
       "Simulated cost of each segment free, 0 .. 1000000 us.",
       [](std::string_view v, Config* c) {
         return ParseLatencyUs(v, &c->sim_free_latency_ns);
       },
       [](const Config& c) { return absl::StrCat(c.sim_free_latency_ns / 1000); }},
      {"sim_fail_nth", "unsigned integer", "0",
       "Make the Nth memory request (segment allocation or map) of a simulated device fail "
       "(0 = never).",
       [](std::string_view v, Config* c) { return ParseUnsigned(v, &c->sim_fail_nth); },
       [](const Config& c) { return absl::StrCat(c.sim_fail_nth); }},
      {"sim_fail_probability", "number", "0",
       "Probability, 0 .. 1, that a memory request (segment allocation or map) of a "
       "simulated device fails.",
       [](std::string_view v, Config* c) -> std::string {
         double x = 0;
         std::string why = ParseFiniteDouble(v, &x);
         if (!why.empty()) return why;
         if (x < 0 || x > 1) return "is out of range (0 .. 1)";
         c->sim_fail_probability = x;
         return "";
       },
       [](const Config& c) { return FormatDouble(c.sim_fail_probability); }},
      {"sim_seed", "unsigned 64-bit integer", "0",
       "Seed of the simulated device's failure injection.",
       [](std::string_view v, Config* c) { return ParseUnsigned(v, &c->sim_seed); },
       [](const Config& c) { return absl::StrCat(c.sim_seed); }},
      {"sim_devices", "integer", "64",
       "Number of simulated devices, 1 .. 1024: sim:0 .. sim:N-1 exist, a higher index is "
       "an error (each reserves 16x sim_capacity of address space).",
       [](std::string_view v, Config* c) -> std::string {
         uint64_t n = 0;
         std::string why = ParseUnsignedInRange(v, 1, 1024, &n);
         if (!why.empty()) return why;
         c->sim_devices = static_cast<int>(n);
         return "";
       },
       [](const Config& c) { return absl::StrCat(c.sim_devices); }},
      {"sim_driver_cost", "a100, none or call=us/...", "a100",
       "The simulated device's driver cost model: what each driver call would cost on a "
       "GPU, summed as estimated driver time (never slept). a100: published A100 "
       "figures (cuMemCreate 50 us, cuMemSetAccess 28 us, cuMemUnmap 18 us, cuMemMap "
       "1 us, cudaMalloc/cudaFree 50 us, ...); none: free; or overrides of those, e.g. "
       "create=193/unmap=26 (calls: malloc, free, address_reserve, address_free, create, "
       "release, map, unmap, set_access; the sim never exports or imports).",
       [](std::string_view v, Config* c) { return ParseSimDriverCosts(v, &c->sim_driver_cost); },
       [](const Config& c) { return FormatSimDriverCosts(c.sim_driver_cost); }},
      {"max_split_size_mb", "integer (MiB) or none", "none",
       "Blocks of at least this many MiB (>= 20) are never split and serve only requests "
       "nearly as large; limits fragmentation by large blocks. none (or inf) = no limit.",
       ParseMaxSplit,
       [](const Config& c) -> std::string {
         if (c.max_split_size == std::numeric_limits<size_t>::max()) return "none";
         return absl::StrCat(c.max_split_size / kMiB);
       }},
      {"garbage_collection_threshold", "number", "0",
       "When reserved memory exceeds this fraction (0 <= x < 1) of the allowed memory, "
       "cached segments unused for longest are released before a new one is taken "
       "(0 = off).",
       [](std::string_view v, Config* c) -> std::string {
         double x = 0;
         std::string why = ParseFiniteDouble(v, &x);
         if (!why.empty()) return why;
         if (x < 0 || x >= 1) return "is out of range (0 <= x < 1)";
         c->garbage_collection_threshold = x;
         return "";
       },
       [](const Config& c) { return FormatDouble(c.garbage_collection_threshold); }},
      {"expandable_segments", "auto or bool", "auto",
       "One growable virtual reservation per (stream, pool) instead of fixed segments, "
       "so that fragmentation across segments disappears (cuda VMM; sim emulates it). "
       "auto = on where the backend has virtual memory management, silently off "
       "elsewhere; true warns when the backend cannot.",
       [](std::string_view v, Config* c) -> std::string {
         if (Lower(Trim(v)) == "auto") {
           c->expandable_segments = ExpandableMode::kAuto;
           return "";
         }
         bool on = false;
         std::string why = ParseBool(v, &on);
         if (!why.empty()) {
           return "is not auto or a boolean (expected auto, true/false, 1/0, yes/no or "
                  "on/off)";
         }
         c->expandable_segments = on ? ExpandableMode::kOn : ExpandableMode::kOff;
         return "";
       },
       [](const Config& c) { return std::string(ExpandableModeName(c.expandable_segments)); }},
      {"expandable_recycle_threshold", "number or none", "0.25",
       "Expandable segments: when a request must map more memory and reserved would then "
       "exceed (1 + x) times allocated, whole free granules elsewhere are unmapped first "
       "(up to the bytes being mapped): fragmentation moves addresses instead of growing "
       "the footprint. none (or inf) = only under memory pressure.",
       [](std::string_view v, Config* c) -> std::string {
         const std::string lower = Lower(Trim(v));
         if (lower == "none" || lower == "inf") {
           c->expandable_recycle_threshold = std::numeric_limits<double>::infinity();
           return "";
         }
         double x = 0;
         std::string why = ParseFiniteDouble(v, &x);
         if (!why.empty()) return why;
         if (x < 0) return "is out of range (x >= 0, or none)";
         c->expandable_recycle_threshold = x;
         return "";
       },
       [](const Config& c) -> std::string {
         if (std::isinf(c.expandable_recycle_threshold)) return "none";
         return FormatDouble(c.expandable_recycle_threshold);
       }},
      {"per_process_memory_fraction", "number", "1",
       "Cap on reserved memory as a fraction (0 < x <= 1) of the device total.",
       [](std::string_view v, Config* c) -> std::string {
         double x = 0;
         std::string why = ParseFiniteDouble(v, &x);
         if (!why.empty()) return why;
         if (x <= 0 || x > 1) return "is out of range (0 < x <= 1)";
         c->per_process_memory_fraction = x;
         return "";
       },
       [](const Config& c) { return FormatDouble(c.per_process_memory_fraction); }},
      {"thread_cache", "bool", "true",
       "Serve small requests from per-(thread, device) caches without the device lock "
       "(see thread_cache_max_size); false sends every request to the device's pool.",
       [](std::string_view v, Config* c) { return ParseBool(v, &c->thread_cache); },
       [](const Config& c) -> std::string { return c.thread_cache ? "true" : "false"; }},
      {"thread_cache_max_size", "size", "32KiB",
       "Largest request, 512B .. 1MiB and a multiple of 512B, that the thread caches "
       "serve; larger ones always go to the device's pool.",
       [](std::string_view v, Config* c) -> std::string {
         size_t bytes = 0;
         std::string why = ParseSizeImpl(v, &bytes);
         if (!why.empty()) return why;
         if (bytes < 512 || bytes > kMiB) return "is out of range (512B .. 1MiB)";
         if (bytes % 512 != 0) return "is not a multiple of 512B";
         c->thread_cache_max_size = bytes;
         return "";
       },
       [](const Config& c) { return FormatSizeExact(c.thread_cache_max_size); }},
      {"thread_cache_max_bytes", "size", "4MiB",
       "Bytes of free blocks each thread's cache may hold per device, 512B .. 1GiB; a free "
       "that would exceed it first gives half back to the pool.",
       [](std::string_view v, Config* c) -> std::string {
         size_t bytes = 0;
         std::string why = ParseSizeImpl(v, &bytes);
         if (!why.empty()) return why;
         if (bytes < 512 || bytes > kGiB) return "is out of range (512B .. 1GiB)";
         c->thread_cache_max_bytes = bytes;
         return "";
       },
       [](const Config& c) { return FormatSizeExact(c.thread_cache_max_bytes); }},
      {"thread_cache_max_blocks", "integer", "256",
       "Free blocks each thread's cache may hold per device, 1 .. 65536.",
       [](std::string_view v, Config* c) -> std::string {
         uint64_t n = 0;
         std::string why = ParseUnsignedInRange(v, 1, 65536, &n);
         if (!why.empty()) return why;
         c->thread_cache_max_blocks = static_cast<size_t>(n);
         return "";
       },
       [](const Config& c) { return absl::StrCat(c.thread_cache_max_blocks); }},
      {"arena_max_waste", "number", "0.1",
       "Scoped arenas: when a request needs a new chunk and no chunk of its scope is "
       "empty, it takes the pool's normal path instead while the arenas' dead-but-pinned "
       "bytes exceed max(chunk_size, x times their live bytes) (x >= 0; 0 = off). "
       "ArenaOptions::max_waste_fraction overrides it per scope.",
       [](std::string_view v, Config* c) -> std::string {
         double x = 0;
         std::string why = ParseFiniteDouble(v, &x);
         if (!why.empty()) return why;
         if (x < 0 || x > 1e6) return "is out of range (0 <= x <= 1e6; 0 = off)";
         c->arena_max_waste = x;
         return "";
       },
       [](const Config& c) { return FormatDouble(c.arena_max_waste); }},
      {"trace_entries", "integer", "131072",
       "Size of the event trace, 0 .. 100000000 events (0 = no trace).",
       [](std::string_view v, Config* c) -> std::string {
         uint64_t n = 0;
         std::string why = ParseUnsignedInRange(v, 0, 100'000'000, &n);
         if (why.empty()) c->trace_entries = static_cast<size_t>(n);
         return why;
       },
       [](const Config& c) { return absl::StrCat(c.trace_entries); }},
      {"stack_sample_bytes", "size", "256MiB",
       "Mean bytes allocated per sampled stack trace, 0 .. 1 TiB (0 = off).",
       [](std::string_view v, Config* c) -> std::string {
         size_t n = 0;
         std::string why = ParseSizeImpl(v, &n);
         if (!why.empty()) return why;
         if (n > (size_t{1} << 40)) return "is out of range (0 .. 1TiB)";
         c->stack_sample_bytes = n;
         return "";
       },
       [](const Config& c) { return FormatSizeExact(c.stack_sample_bytes); }},
      {"http", "ADDRESS:PORT", "",
       "Serve /metrics and /debug/* on this address (IPv6 in brackets: [::1]:9400; port "
       "0 picks a free one). Empty = no server.",
       ParseHttp, [](const Config& c) { return FormatString(c.http); }},
      {"http_token_file", "path", "",
       "File holding a bearer token that /debug/* requests must present. Empty = none.",
       [](std::string_view v, Config* c) -> std::string {
         c->http_token_file = std::string(v);
         return "";
       },
       [](const Config& c) { return FormatString(c.http_token_file); }},
      {"http_allow_remote", "bool", "false",
       "Allow the HTTP server to listen on a non-loopback address.",
       [](std::string_view v, Config* c) { return ParseBool(v, &c->http_allow_remote); },
       [](const Config& c) -> std::string {
         return c.http_allow_remote ? "true" : "false";
       }},
      {"http_allowed_hosts", "string", "",
       "Host names accepted in the Host header of HTTP requests besides localhost, "
       "loopback addresses and the bound address, separated by spaces; * accepts any "
       "(protection against DNS rebinding). Needs http.",
       [](std::string_view v, Config* c) -> std::string {
         c->http_allowed_hosts = std::string(v);
         return "";
       },
       [](const Config& c) { return FormatString(c.http_allowed_hosts); }},
      {"http_metrics_token", "bool", "false",
       "/metrics requires the bearer token of http_token_file too (it names files and "
       "tags). Needs http_token_file.",
       [](std::string_view v, Config* c) { return ParseBool(v, &c->http_metrics_token); },
       [](const Config& c) -> std::string {
         return c.http_metrics_token ? "true" : "false";
       }},
      {"oom_dump_dir", "path", "",
       "Directory where each out-of-memory report is written as a file. Empty = none.",
       [](std::string_view v, Config* c) -> std::string {
         c->oom_dump_dir = std::string(v);
         return "";
       },
       [](const Config& c) { return FormatString(c.oom_dump_dir); }},
      {"flight_recorder", "path", "",
       "File kept up to date with the recent events, the live bytes per site and the "
       "stats (a shared mapping), so that a process killed for any reason leaves its last "
       "state there for memtrace postmortem. Empty = none.",
       [](std::string_view v, Config* c) -> std::string {
         // Only what can be judged without the filesystem: the runtime opens the file
         // at start and refuses it there (symlink, not a regular file) with the reason.
         if (v.size() > 4095) return "is longer than 4095 bytes";
         if (!v.empty() && v.back() == '/') return "names a directory (ends with /), not a file";
         for (const char ch : v) {
           if (static_cast<unsigned char>(ch) < 0x20) return "holds a control character";
         }
         c->flight_recorder = std::string(v);
         return "";
       },
       [](const Config& c) { return FormatString(c.flight_recorder); }},
      {"site_top_k", "integer", "10",
       "Number of call sites labelled by name in metrics (1 .. 1000); the rest are "
       "summed as \"other\".",
       [](std::string_view v, Config* c) -> std::string {
         uint64_t k = 0;
         std::string why = ParseUnsignedInRange(v, 1, 1000, &k);
         if (why.empty()) c->site_top_k = static_cast<int>(k);
         return why;
       },
       [](const Config& c) { return absl::StrCat(c.site_top_k); }},
  }};
  return keys;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

absl::Status UnknownKeyError(std::string_view key) {
  const KeySpec* best = nullptr;
  size_t best_distance = 4;  // suggest only within edit distance 3
  const std::string lower = Lower(key);  // keys are lower case; "Backend" is close
  for (const KeySpec& spec : Keys()) {
    size_t d = EditDistance(lower, spec.key);
    if (d < best_distance) {
      best = &spec;
      best_distance = d;
    }
  }
  if (best == nullptr && !key.empty()) {
    // A unique known key that starts with what was typed ("max_split").
    for (const KeySpec& spec : Keys()) {
      if (spec.key.starts_with(lower)) {
        if (best != nullptr) {
          best = nullptr;
          break;
        }
        best = &spec;
      }
    }
  }
  std::vector<absl::string_view> names;
  for (const KeySpec& spec : Keys()) names.push_back(Av(spec.key));
  std::string suggestion =
      best != nullptr ? absl::StrCat("did you mean \"", Av(best->key), "\"? ") : "";
  return absl::InvalidArgumentError(absl::StrCat("unknown key ", Quote(key), " (",
                                                 suggestion, "known keys: ",
                                                 absl::StrJoin(names, ", "), ")"));
}

// ---------------------------------------------------------------------------------
// The lexer: splits text into items, unquoting quoted values.

struct Item {
  std::string_view key;  // trimmed
  std::string value;     // trimmed, or unquoted
  size_t position = 0;   // 1-based item number
  size_t offset = 0;     // offset of the item's first character in the text
};

absl::Status Lex(std::string_view text, std::vector<Item>* items) {
  size_t i = 0;
  size_t position = 0;
  while (true) {
    ++position;
    const size_t start = i;
    while (i < text.size() && text[i] != ',' && text[i] != ':') ++i;
    std::string_view raw_key = text.substr(start, i - start);
    std::string_view key = Trim(raw_key);
    if (i == text.size() || text[i] == ',') {
      if (key.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "empty item at position ", position, " (character ", start + 1, ") of ",
            Quote(text), "; remove the extra comma"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("item ", Quote(key), " at position ", position,
                       " has no ':' (expected key:value)"));
    }
    if (key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "item at position ", position, " (character ", start + 1,
          ") has an empty key (expected key:value)"));
    }
    ++i;  // the ':'
    while (i < text.size() && absl::ascii_isspace(text[i])) ++i;
    Item item{key, "", position, start};
    if (i < text.size() && text[i] == '"') {
      const size_t quote = i++;
      bool closed = false;
      while (i < text.size()) {
        char ch = text[i++];
        if (ch == '"') {
          closed = true;
          break;
        }
        if (ch == '\\') {
          if (i == text.size() || (text[i] != '"' && text[i] != '\\')) {
            return absl::InvalidArgumentError(absl::StrCat(
                "key ", Quote(key), ": value at character ", quote + 1,
                " has a backslash not followed by \" or \\"));
          }
          ch = text[i++];
        }
        item.value.push_back(ch);
      }
      if (!closed) {
        return absl::InvalidArgumentError(absl::StrCat(
            "key ", Quote(key), ": value ", Quote(text.substr(quote)),
            " has no closing quote"));
      }
      while (i < text.size() && absl::ascii_isspace(text[i])) ++i;
      if (i < text.size() && text[i] != ',') {
        return absl::InvalidArgumentError(absl::StrCat(
            "key ", Quote(key), ": text after the closing quote at character ", i + 1,
            " (expected ',' or the end)"));
      }
    } else {
      const size_t value_start = i;
      while (i < text.size() && text[i] != ',') ++i;
      item.value = std::string(
          TrimRight(text.substr(value_start, i - value_start)));
    }
    items->push_back(std::move(item));
    if (i == text.size()) return absl::OkStatus();
    ++i;  // the ','
  }
}

}  // namespace

// ---------------------------------------------------------------------------------
// Public API.

absl::StatusOr<Config> ParseConfig(std::string_view text, const Config& base) {
  Config result = base;  // all-or-nothing: only this copy is touched
  if (Trim(text).empty()) return result;
  std::vector<Item> items;
  if (absl::Status s = Lex(text, &items); !s.ok()) return s;
  absl::flat_hash_map<absl::string_view, size_t> seen;  // key -> position
  for (const Item& item : items) {
    const KeySpec* spec = nullptr;
    for (const KeySpec& candidate : Keys()) {
      if (candidate.key == item.key) spec = &candidate;
    }
    if (spec == nullptr) return UnknownKeyError(item.key);
    auto [it, inserted] = seen.emplace(Av(spec->key), item.position);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate key ", Quote(spec->key), " (positions ", it->second,
                       " and ", item.position, ")"));
    }
    std::string why = spec->parse(item.value, &result);
    if (!why.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("key ", Quote(spec->key), ": value ",
                                                     Quote(item.value), " ", why));
    }
  }
  return result;
}

absl::Status ApplyConfig(std::string_view text, Config* config) {
  absl::StatusOr<Config> parsed = ParseConfig(text, *config);
  if (!parsed.ok()) return parsed.status();
  *config = *std::move(parsed);
  return absl::OkStatus();
}

absl::StatusOr<Config> ConfigFromEnv() {
  const char* text = std::getenv("DEVMEM_CONF");
  if (text == nullptr) return Config{};
  absl::StatusOr<Config> parsed = ParseConfig(text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DEVMEM_CONF: ", parsed.status().message()));
  }
  return parsed;
}

// Round trip: ParseConfig(ToString(c)) == c for every Config that ParseConfig can
// produce. Values set directly in C++ outside the keys' domains print rounded down to
// the key's unit (latencies to whole microseconds, max_split_size to whole MiB) or
// out of range, and so do not read back.
std::string ToString(const Config& config) {
  std::string out;
  for (const KeySpec& spec : Keys()) {
    if (!out.empty()) out.push_back(',');
    absl::StrAppend(&out, Av(spec.key), ":", spec.format(config));
  }
  return out;
}

absl::StatusOr<size_t> ParseSize(std::string_view text) {
  size_t bytes = 0;
  std::string why = ParseSizeImpl(text, &bytes);
  if (!why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("size ", Quote(text), " ", why));
  }
  return bytes;
}

// Two decimals below 10 of a unit, one above, like the sizes in PyTorch's OOM
// messages: "512 B", "1.50 GiB", "20.0 MiB", "512.0 MiB".
std::string FormatBytes(size_t bytes) {
  static constexpr std::array<std::string_view, 7> kUnits = {"B",   "KiB", "MiB", "GiB",
                                                             "TiB", "PiB", "EiB"};
  if (bytes < kKiB) return absl::StrCat(bytes, " B");
  size_t unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit + 1 < kUnits.size()) {
    value /= 1024;
    ++unit;
  }
  // Rounding may carry to 1024 ("1023.97 KiB" -> "1024.0"); print the next unit.
  if (value >= 1023.95 && unit + 1 < kUnits.size()) {
    value /= 1024;
    ++unit;
  }
  if (value < 9.995) return absl::StrFormat("%.2f %s", value, kUnits[unit]);
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

const std::vector<ConfigKeyDoc>& ConfigKeys() {
  static const std::vector<ConfigKeyDoc>* docs = [] {
    auto* v = new std::vector<ConfigKeyDoc>();
    for (const KeySpec& spec : Keys()) {
      v->push_back({spec.key, spec.type, spec.default_value, spec.meaning});
    }
    return v;
  }();
  return *docs;
}

}  // namespace devmem
