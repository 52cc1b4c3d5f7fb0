// tools/timeline_render.cc: draws a Timeline (tools/timeline.h) as a standalone SVG,
// or as an HTML page that embeds that SVG and adds a legend and a readout under the
// pointer. Self-contained: no network, no external fonts or scripts.
#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"
#include "tools/timeline.h"

namespace devmem {
namespace {

constexpr int kWidth = 1000, kPlotHeight = 440, kLeft = 90, kRight = 20, kTop = 40;
constexpr int kLegendRow = 18;
// Colour-blind-safe palette (Okabe-Ito, then greys for "other").
constexpr const char* kColors[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9",
                                   "#D55E00", "#F0E442", "#999999", "#7f3c8d", "#11a579"};

std::string Xml(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t') out += c;
    }
  }
  return out;
}

// A JSON string that is also safe inside <script>: '<' is escaped.
std::string JsString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '<' || static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string FormatX(int64_t x, bool is_time) {
  if (!is_time) return absl::StrCat(x);
  const double s = static_cast<double>(x) / 1e9;
  if (s >= 1) return absl::StrFormat("%.2f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.2f ms", s * 1e3);
  return absl::StrFormat("%.1f us", s * 1e6);
}

struct Scale {
  int64_t x_max;
  uint64_t y_max;
  double X(int64_t x) const {
    return kLeft + (x_max <= 0 ? 0.0
                               : static_cast<double>(x) / static_cast<double>(x_max) *
                                     (kWidth - kLeft - kRight));
  }
  double Y(uint64_t y) const {
    return kTop + kPlotHeight -
           (y_max == 0 ? 0.0 : static_cast<double>(y) / static_cast<double>(y_max) * kPlotHeight);
  }
};

}  // namespace

std::string TimelineSvg(const Timeline& t, const std::string& title) {
  const size_t n = t.x.size();
  const int legend_rows = static_cast<int>(t.site_names.size()) + 3;
  const int height = kTop + kPlotHeight + 40 + legend_rows * kLegendRow;
  Scale sc{n == 0 ? 0 : t.x.back(),
           std::max<uint64_t>(1, std::max(t.peak_allocated, t.peak_reserved) / 20 * 21)};
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"timeline\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
      kWidth, height, kWidth, height);
  absl::StrAppend(&s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  absl::StrAppendFormat(&s, "<text x=\"%d\" y=\"22\" font-size=\"15\">%s</text>\n", kLeft,
                        Xml(title));
  // Axes and horizontal grid lines at fifths of the range.
  for (int i = 0; i <= 5; ++i) {
    const uint64_t v = sc.y_max / 5 * static_cast<uint64_t>(i);
    absl::StrAppendFormat(&s,
                          "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          kLeft, kWidth - kRight, sc.Y(v), sc.Y(v), kLeft - 6, sc.Y(v) + 4,
                          Xml(FormatBytes(v)));
    const int64_t xv = sc.x_max / 5 * i;
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"%s\">%s</text>\n",
                          sc.X(xv), kTop + kPlotHeight + 16, i == 5 ? "end" : "middle",
                          Xml(FormatX(xv, t.x_is_time)));
  }
  absl::StrAppendFormat(&s, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                        (kWidth + kLeft) / 2, kTop + kPlotHeight + 32,
                        t.x_is_time ? "time since the first event" : "event number");
  // Stacked site areas, bottom up: each polygon runs along its top edge and back along
  // the edge below it.
  std::vector<uint64_t> below(n, 0);
  for (size_t k = 0; k < t.by_site.size(); ++k) {
    std::string pts;
    for (size_t i = 0; i < n; ++i) {
      absl::StrAppendFormat(&pts, "%.1f,%.1f ", sc.X(t.x[i]), sc.Y(below[i] + t.by_site[k][i]));
    }
    for (size_t i = n; i-- > 0;) {
      absl::StrAppendFormat(&pts, "%.1f,%.1f ", sc.X(t.x[i]), sc.Y(below[i]));
    }
    for (size_t i = 0; i < n; ++i) below[i] += t.by_site[k][i];
    absl::StrAppendFormat(&s,
                          "<polygon class=\"site\" fill=\"%s\" fill-opacity=\"0.75\" "
                          "points=\"%s\"><title>%s</title></polygon>\n",
                          kColors[k % 10], pts, Xml(t.site_names[k]));
  }
  auto polyline = [&](const std::vector<uint64_t>& v, const char* color, const char* extra,
                      const char* id) {
    std::string pts;
    for (size_t i = 0; i < n; ++i) absl::StrAppendFormat(&pts, "%.1f,%.1f ", sc.X(t.x[i]), sc.Y(v[i]));
    absl::StrAppendFormat(&s,
                          "<polyline id=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                          "%s points=\"%s\"/>\n",
                          id, color, extra, pts);
  };
  polyline(t.reserved, "#c00000", "stroke-dasharray=\"6 3\"", "reserved");
  polyline(t.allocated, "#000000", "", "allocated");
  for (int64_t x : t.ooms) {
    absl::StrAppendFormat(&s,
                          "<line class=\"oom\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" "
                          "stroke=\"#ff0000\" stroke-width=\"2\"/>"
                          "<text x=\"%.1f\" y=\"%d\" fill=\"#ff0000\">OOM</text>\n",
                          sc.X(x), sc.X(x), kTop, kTop + kPlotHeight, sc.X(x) + 2, kTop + 10);
  }
  // Legend.
  int y = kTop + kPlotHeight + 56;
  absl::StrAppendFormat(&s,
                        "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#000\"/>"
                        "<text x=\"%d\" y=\"%d\">allocated (peak %s)</text>\n",
                        kLeft, kLeft + 20, y - 4, y - 4, kLeft + 26, y,
                        Xml(FormatBytes(t.peak_allocated)));
  y += kLegendRow;
  absl::StrAppendFormat(&s,
                        "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#c00000\" "
                        "stroke-dasharray=\"6 3\"/><text x=\"%d\" y=\"%d\">reserved (peak %s%s)"
                        "</text>\n",
                        kLeft, kLeft + 20, y - 4, y - 4, kLeft + 26, y,
                        Xml(FormatBytes(t.peak_reserved)),
                        t.reserved_from_replay ? ", from a replay: the trace has no segment events"
                                               : "");
  y += kLegendRow;
  for (size_t k = 0; k < t.site_names.size(); ++k, y += kLegendRow) {
    absl::StrAppendFormat(&s,
                          "<rect x=\"%d\" y=\"%d\" width=\"20\" height=\"10\" fill=\"%s\"/>"
                          "<text class=\"site-name\" x=\"%d\" y=\"%d\">%s (peak %s)</text>\n",
                          kLeft, y - 10, kColors[k % 10], kLeft + 26, y,
                          Xml(t.site_names[k]), Xml(FormatBytes(t.site_peak_bytes[k])));
  }
  absl::StrAppendFormat(&s, "<text x=\"%d\" y=\"%d\" fill=\"#666\">%d events, %d points%s</text>\n",
                        kLeft, y, t.events, n,
                        t.ooms.empty() ? "" : absl::StrCat(", ", t.ooms.size(), " OOMs"));
  s += "</svg>\n";
  return s;
}

std::string TimelineHtml(const Timeline& t, const std::string& title) {
  std::string data = "{\"x\":[";
  for (size_t i = 0; i < t.x.size(); ++i) absl::StrAppend(&data, i ? "," : "", t.x[i]);
  absl::StrAppend(&data, "],\"xIsTime\":", t.x_is_time ? "true" : "false", ",\"allocated\":[");
  for (size_t i = 0; i < t.allocated.size(); ++i) absl::StrAppend(&data, i ? "," : "", t.allocated[i]);
  absl::StrAppend(&data, "],\"reserved\":[");
  for (size_t i = 0; i < t.reserved.size(); ++i) absl::StrAppend(&data, i ? "," : "", t.reserved[i]);
  absl::StrAppend(&data, "],\"sites\":[");
  for (size_t k = 0; k < t.site_names.size(); ++k) {
    absl::StrAppend(&data, k ? "," : "", "{\"name\":", JsString(t.site_names[k]), ",\"bytes\":[");
    for (size_t i = 0; i < t.by_site[k].size(); ++i) {
      absl::StrAppend(&data, i ? "," : "", t.by_site[k][i]);
    }
    absl::StrAppend(&data, "]}");
  }
  absl::StrAppend(&data, "]}");
  std::string html = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>",
      Xml(title),
      "</title>\n<style>body{font-family:sans-serif;margin:16px}"
      "#readout{font-family:monospace;white-space:pre;min-height:9em}</style>\n</head><body>\n",
      TimelineSvg(t, title),
      "<div id=\"readout\">move the pointer over the chart</div>\n"
      "<p id=\"status\"></p>\n<script>\n\"use strict\";\nconst data = ",
      data, ";\n");
  // The readout: the values of the nearest point under the pointer. The status line is
  // written last, so a page whose script failed shows none (the test checks for it).
  html += R"JS(function fmt(b) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; ++i; }
  return b.toFixed(i ? 1 : 0) + " " + u[i];
}
function fmtX(x) { return data.xIsTime ? (x / 1e9).toFixed(6) + " s" : "event " + x; }
const svg = document.getElementById("timeline");
const readout = document.getElementById("readout");
svg.addEventListener("mousemove", (ev) => {
  const box = svg.getBoundingClientRect();
  const left = 90, right = 20, width = 1000;
  const fx = ((ev.clientX - box.left) * width / box.width - left) / (width - left - right);
  const n = data.x.length;
  if (n === 0) return;
  const i = Math.max(0, Math.min(n - 1, Math.round(fx * (n - 1))));
  let lines = [fmtX(data.x[i]), "allocated " + fmt(data.allocated[i]),
               "reserved  " + fmt(data.reserved[i])];
  for (const s of data.sites) lines.push("  " + fmt(s.bytes[i]).padStart(10) + "  " + s.name);
  readout.textContent = lines.join("\n");
});
document.getElementById("status").textContent =
    "timeline ready: " + data.x.length + " points, " + data.sites.length + " site series";
document.body.setAttribute("data-timeline", "ready");
</script>
</body></html>
)JS";
  return html;
}

}  // namespace devmem
