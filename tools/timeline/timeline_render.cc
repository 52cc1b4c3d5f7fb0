// tools/timeline/timeline_render.cc: draws a Timeline (tools/timeline/timeline.h) as a standalone SVG,
// or as an HTML page that embeds that SVG and adds, in a script: a readout under the
// pointer (picked by time), the site under the pointer with its bytes, zoom on a time
// range (drag; double-click or "whole trace" to undo) and a per-site toggle.
// Self-contained: no network, no external fonts or scripts.
//
// Every series is drawn as steps: a point's value holds from its x until the next
// point (tools/timeline/timeline.h: a point is the state after its interval's last event). The
// plot is a nested <svg id="plot"> in its own coordinates (0..kPlotWidth, 0..kPlotHeight),
// so that the page zooms by changing its viewBox; strokes do not scale
// (vector-effect), and the x ticks and OOM labels, outside it, are placed again.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"
#include "tools/timeline/timeline.h"

namespace devmem {
namespace {

constexpr int kWidth = 1000, kPlotHeight = 440, kLeft = 90, kRight = 20, kTop = 40;
constexpr int kPlotWidth = kWidth - kLeft - kRight;
constexpr int kLegendRow = 18;
// A legend line's text fits the width at 12px sans-serif (about 6.5 px a character);
// longer names are cut in the middle, the whole name in the row's <title>.
constexpr size_t kLegendChars = 130;
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

// `s` cut to at most `n` characters (UTF-8 aware: never inside a character), the middle
// replaced by "…", since a site's distinguishing part may be at either end.
std::string Ellipsize(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  auto boundary = [&](size_t i) {  // back to the start of a UTF-8 character
    while (i > 0 && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    return i;
  };
  const size_t head = boundary(n / 2 - 1);
  size_t tail = s.size() - (n - n / 2 - 1);
  while (tail < s.size() && (static_cast<unsigned char>(s[tail]) & 0xC0) == 0x80) ++tail;
  return s.substr(0, head) + "\xE2\x80\xA6" + s.substr(tail);
}

// Round tick steps. Bytes: 1, 2, 5, 10, 20, 50, 100, 200, 500 of B, KiB, MiB, GiB, TiB,
// the smallest giving at most 6 steps up to `top`; every label is a whole number of
// the step's unit ("400 MiB", "1 GiB"). The page's script has the same rule (NiceBytes).
struct Ticks {
  uint64_t step = 1;
  uint64_t end = 1;  // the axis end: a whole number of steps
  uint64_t unit = 1;
  const char* unit_name = "B";
};
Ticks ByteTicks(uint64_t top) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  static constexpr uint64_t kMantissa[] = {1, 2, 5, 10, 20, 50, 100, 200, 500};
  top = std::max<uint64_t>(top, 1);
  Ticks t;
  for (int u = 0; u < 6; ++u) {
    for (uint64_t m : kMantissa) {
      const uint64_t unit = uint64_t{1} << (10 * u);
      t.step = m * unit;
      t.unit = unit;
      t.unit_name = kNames[u];
      if (t.step * 6 >= top) {
        t.end = (top + t.step - 1) / t.step * t.step;
        return t;
      }
    }
  }
  t.end = (top + t.step - 1) / t.step * t.step;
  return t;
}
std::string ByteLabel(const Ticks& t, uint64_t v) {
  return absl::StrCat(v / t.unit, " ", t.unit_name);
}

// Time (or event number) ticks: 1, 2, 5 times a power of ten, at most 8 steps up to
// `top`, all labelled in one unit chosen from the axis end (ns, µs, ms or s).
struct XTicks {
  int64_t step = 1;
  int64_t end = 1;
  double unit = 1;
  const char* unit_name = "";
  int decimals = 0;
};
XTicks TimeTicks(int64_t top, bool is_time) {
  top = std::max<int64_t>(top, 1);
  XTicks t;
  for (int64_t p = 1;; p *= 10) {
    for (int64_t m : {1, 2, 5}) {
      t.step = m * p;
      if (t.step * 8 >= top || p > INT64_MAX / 100) {
        t.end = (top + t.step - 1) / t.step * t.step;
        if (is_time) {
          if (t.end >= 2'000'000'000) {
            t.unit = 1e9, t.unit_name = " s";
          } else if (t.end >= 2'000'000) {
            t.unit = 1e6, t.unit_name = " ms";
          } else if (t.end >= 2'000) {
            t.unit = 1e3, t.unit_name = " \xC2\xB5s";
          } else {
            t.unit = 1, t.unit_name = " ns";
          }
        }
        // Enough decimals for the step in that unit (a step is 1, 2 or 5 x 10^k).
        const double s = static_cast<double>(t.step) / t.unit;
        t.decimals = s >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(s) - 1e-9));
        return t;
      }
    }
  }
}
std::string XLabel(const XTicks& t, int64_t v) {
  return absl::StrFormat("%.*f%s", t.decimals, static_cast<double>(v) / t.unit, t.unit_name);
}

struct Scale {
  int64_t x_end;
  uint64_t y_end;
  // Plot coordinates (inside <svg id="plot">).
  double X(int64_t x) const {
    return x_end <= 0 ? 0.0 : static_cast<double>(x) / static_cast<double>(x_end) * kPlotWidth;
  }
  double Y(uint64_t y) const {
    return kPlotHeight - static_cast<double>(y) / static_cast<double>(y_end) * kPlotHeight;
  }
};

// The corners of `v` drawn as steps after each point (from x = 0 at zero).
std::vector<std::pair<double, double>> StepAfter(const Scale& sc, const std::vector<int64_t>& x,
                                                 const std::vector<uint64_t>& v) {
  std::vector<std::pair<double, double>> p;
  p.reserve(2 * x.size() + 1);
  double prev = sc.Y(0);
  p.emplace_back(0.0, prev);
  for (size_t i = 0; i < x.size(); ++i) {
    const double px = sc.X(x[i]), py = sc.Y(v[i]);
    p.emplace_back(px, prev);
    p.emplace_back(px, py);
    prev = py;
  }
  return p;
}
// The same for an interval's highest value: it holds over the interval that ends at
// its point (after the point before).
std::vector<std::pair<double, double>> StepBefore(const Scale& sc, const std::vector<int64_t>& x,
                                                  const std::vector<uint64_t>& v) {
  std::vector<std::pair<double, double>> p;
  double from = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double px = sc.X(x[i]), py = sc.Y(v[i]);
    p.emplace_back(from, py);
    p.emplace_back(px, py);
    from = px;
  }
  return p;
}
std::string Points(const std::vector<std::pair<double, double>>& p) {
  std::string s;
  for (const auto& [x, y] : p) absl::StrAppendFormat(&s, "%.2f,%.2f ", x, y);
  if (!s.empty()) s.pop_back();
  return s;
}

// A series' legend text: its name, kind and site id, so that two sites in the same
// function (a clone and an alloc, or two lines) are told apart.
std::string SeriesLabel(const Timeline& t, size_t k) {
  if (t.has_other && k + 1 == t.site_names.size()) return t.site_names[k];
  std::string s = t.site_names[k];
  if (!t.site_kinds[k].empty()) absl::StrAppend(&s, " \xC2\xB7 ", t.site_kinds[k]);
  if (t.site_ids[k] != 0) absl::StrAppend(&s, " \xC2\xB7 site ", t.site_ids[k]);
  return s;
}

}  // namespace

std::string TimelineSvg(const Timeline& t, const std::string& title) {
  const size_t n = t.x.size();
  const int legend_rows = static_cast<int>(t.site_names.size()) + 4;
  const int height = kTop + kPlotHeight + 40 + legend_rows * kLegendRow;
  const Ticks yt = ByteTicks(std::max(t.peak_allocated, t.peak_reserved));
  const XTicks xt = TimeTicks(t.x_end, t.x_is_time);
  const Scale sc{xt.end, yt.end};
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"timeline\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\" "
      "data-x-end=\"%d\" data-y-end=\"%d\">\n",
      kWidth, height, kWidth, height, xt.end, yt.end);
  absl::StrAppend(&s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  absl::StrAppendFormat(&s, "<text x=\"%d\" y=\"22\" font-size=\"15\">%s</text>\n", kLeft,
                        Xml(title));
  // Horizontal grid lines and y labels at round byte counts.
  for (uint64_t v = 0; v <= yt.end; v += yt.step) {
    const double y = kTop + sc.Y(v);
    absl::StrAppendFormat(&s,
                          "<line class=\"ygrid\" x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" "
                          "stroke=\"#ddd\"/><text class=\"ytick\" x=\"%d\" y=\"%.1f\" "
                          "text-anchor=\"end\">%s</text>\n",
                          kLeft, kWidth - kRight, y, y, kLeft - 6, y + 4, ByteLabel(yt, v));
  }
  // X labels, one unit for all; the page's script redraws them when zoomed.
  absl::StrAppend(&s, "<g id=\"xticks\">");
  for (int64_t v = 0; v <= xt.end; v += xt.step) {
    const double x = kLeft + sc.X(v);
    absl::StrAppendFormat(&s,
                          "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>"
                          "<text class=\"xtick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s"
                          "</text>",
                          x, x, kTop + kPlotHeight, kTop + kPlotHeight + 4, x,
                          kTop + kPlotHeight + 16, Xml(XLabel(xt, v)));
    if (v > INT64_MAX - xt.step) break;
  }
  absl::StrAppend(&s, "</g>\n");
  absl::StrAppendFormat(&s, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                        kLeft + kPlotWidth / 2, kTop + kPlotHeight + 32,
                        t.x_is_time ? "time since the first event" : "event number");
  // The plot, in its own coordinates.
  absl::StrAppendFormat(&s,
                        "<svg id=\"plot\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                        "viewBox=\"0 0 %d %d\" preserveAspectRatio=\"none\" "
                        "overflow=\"hidden\">\n",
                        kLeft, kTop, kPlotWidth, kPlotHeight, kPlotWidth, kPlotHeight);
  // Stacked site areas, bottom up: each polygon runs along its top edge's steps and
  // back along the edge below it.
  std::vector<uint64_t> below(n, 0), top(n, 0);
  for (size_t k = 0; k < t.by_site.size(); ++k) {
    for (size_t i = 0; i < n; ++i) top[i] = below[i] + t.by_site[k][i];
    std::vector<std::pair<double, double>> pts = StepAfter(sc, t.x, top);
    std::vector<std::pair<double, double>> back = StepAfter(sc, t.x, below);
    pts.insert(pts.end(), back.rbegin(), back.rend());
    absl::StrAppendFormat(&s,
                          "<polygon class=\"site\" data-series=\"%d\" fill=\"%s\" "
                          "fill-opacity=\"0.75\" points=\"%s\"><title>%s</title></polygon>\n",
                          k, kColors[k % 10], Points(pts), Xml(SeriesLabel(t, k)));
    below = top;
  }
  auto polyline = [&](const std::vector<std::pair<double, double>>& pts, const char* color,
                      const char* extra, const char* id) {
    absl::StrAppendFormat(&s,
                          "<polyline id=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                          "vector-effect=\"non-scaling-stroke\" %s points=\"%s\"/>\n",
                          id, color, extra, Points(pts));
  };
  polyline(StepBefore(sc, t.x, t.allocated_max), "#888888", "stroke-dasharray=\"2 2\"",
           "allocated-max");
  polyline(StepAfter(sc, t.x, t.reserved), "#c00000", "stroke-dasharray=\"6 3\"", "reserved");
  polyline(StepAfter(sc, t.x, t.allocated), "#000000", "", "allocated");
  for (int64_t x : t.ooms) {
    absl::StrAppendFormat(&s,
                          "<line class=\"oom\" x1=\"%.2f\" x2=\"%.2f\" y1=\"0\" y2=\"%d\" "
                          "stroke=\"#ff0000\" stroke-width=\"2\" "
                          "vector-effect=\"non-scaling-stroke\"/>\n",
                          sc.X(x), sc.X(x), kPlotHeight);
  }
  absl::StrAppend(&s, "</svg>\n");
  // OOM labels above the plot, anchored so that none runs past the right edge.
  for (int64_t x : t.ooms) {
    const double px = kLeft + sc.X(x);
    absl::StrAppendFormat(&s,
                          "<text class=\"oom-label\" data-x=\"%d\" x=\"%.1f\" y=\"%d\" "
                          "fill=\"#ff0000\" text-anchor=\"%s\">OOM</text>\n",
                          x, px, kTop - 4, px > kWidth - kRight - 30 ? "end" : "middle");
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
                        "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#888\" "
                        "stroke-dasharray=\"2 2\"/><text x=\"%d\" y=\"%d\">allocated, the "
                        "highest within each interval</text>\n",
                        kLeft, kLeft + 20, y - 4, y - 4, kLeft + 26, y);
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
    const std::string label = SeriesLabel(t, k);
    absl::StrAppendFormat(&s,
                          "<g class=\"legend-row\" data-series=\"%d\"><title>%s</title>"
                          "<rect x=\"%d\" y=\"%d\" width=\"20\" height=\"10\" fill=\"%s\"/>"
                          "<text class=\"site-name\" x=\"%d\" y=\"%d\">%s (peak %s)</text></g>\n",
                          k, Xml(label), kLeft, y - 10, kColors[k % 10], kLeft + 26, y,
                          Xml(Ellipsize(label, kLegendChars)),
                          Xml(FormatBytes(t.site_peak_bytes[k])));
  }
  absl::StrAppendFormat(&s,
                        "<text id=\"caption\" x=\"%d\" y=\"%d\" fill=\"#666\">%d events, %d "
                        "points%s; a point is the state after the last event of its interval, "
                        "held until the next (steps)</text>\n",
                        kLeft, y, t.events, n,
                        t.ooms.empty() ? "" : absl::StrCat(", ", t.ooms.size(), " OOMs"));
  s += "</svg>\n";
  return s;
}

std::string TimelineHtml(const Timeline& t, const std::string& title) {
  auto array = [](std::string* out, const auto& v) {
    *out += '[';
    for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(out, i ? "," : "", v[i]);
    *out += ']';
  };
  std::string data = "{\"x\":";
  array(&data, t.x);
  absl::StrAppend(&data, ",\"xIsTime\":", t.x_is_time ? "true" : "false", ",\"allocated\":");
  array(&data, t.allocated);
  data += ",\"allocatedMax\":";
  array(&data, t.allocated_max);
  data += ",\"reserved\":";
  array(&data, t.reserved);
  data += ",\"sites\":[";
  for (size_t k = 0; k < t.site_names.size(); ++k) {
    absl::StrAppend(&data, k ? "," : "", "{\"name\":", JsString(SeriesLabel(t, k)),
                    ",\"bytes\":");
    array(&data, t.by_site[k]);
    data += '}';
  }
  // The segment view's spans, flat: [addr, size, x0, x1] per range and
  // [addr, size, x0, x1, series] per block (addresses stay below 2^53, exact in JS).
  data += "],\"segs\":[";
  for (size_t i = 0; i < t.segment_spans.size(); ++i) {
    const TimelineSpan& sp = t.segment_spans[i];
    absl::StrAppend(&data, i ? "," : "", sp.addr, ",", sp.size, ",", sp.x0, ",", sp.x1);
  }
  data += "],\"blocks\":[";
  for (size_t i = 0; i < t.block_spans.size(); ++i) {
    const TimelineSpan& sp = t.block_spans[i];
    absl::StrAppend(&data, i ? "," : "", sp.addr, ",", sp.size, ",", sp.x0, ",", sp.x1, ",",
                    sp.series);
  }
  absl::StrAppend(&data, "],\"segNote\":", JsString(t.segment_view_note), "}");
  std::string html = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>",
      Xml(title),
      "</title>\n<style>body{font-family:sans-serif;margin:16px}"
      "#readout{font-family:monospace;white-space:pre;min-height:9em}"
      "#toggles label{display:block;font-size:13px}#plot{cursor:crosshair}</style>\n"
      "</head><body>\n",
      TimelineSvg(t, title),
      "<p>Drag across the chart to zoom on a time range; double-click or "
      "<button id=\"unzoom\">whole trace</button>. Sites shown:</p>\n"
      "<div id=\"toggles\"></div>\n"
      "<div id=\"readout\">move the pointer over the chart</div>\n"
      "<h3>Segments at the time under the pointer</h3>\n"
      "<p id=\"segsummary\"></p>\n"
      "<svg id=\"segments\" xmlns=\"http://www.w3.org/2000/svg\" width=\"1100\" "
      "height=\"20\"></svg>\n"
      "<p id=\"status\"></p>\n<script>\n\"use strict\";\nconst data = ",
      data, ";\n");
  // The script. Plot coordinates are those of <svg id="plot"> (tools/timeline/timeline_render.cc);
  // the view is the x range shown, in trace units. The readout picks the last point at
  // or before the time under the pointer (a binary search on x), so it reads the value
  // the steps draw there. The status line is written last, so a page whose script
  // failed shows none (tests/timeline_test.py checks for it).
  html += R"JS(const svg = document.getElementById("timeline");
const plot = document.getElementById("plot");
const readout = document.getElementById("readout");
const PW = plot.viewBox.baseVal.width, PH = plot.viewBox.baseVal.height;
const LEFT = plot.x.baseVal.value, TOP = plot.y.baseVal.value;
const xEnd = Number(svg.dataset.xEnd), yEnd = Number(svg.dataset.yEnd);
const shown = data.sites.map(() => true);
let view = [0, xEnd];
function fmt(b) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; ++i; }
  return b.toFixed(i ? 1 : 0) + " " + u[i];
}
// The x unit of the SVG's rule (XTicks), from the end of the range shown.
function xUnit(b) {
  if (!data.xIsTime) return [1, ""];
  if (b >= 2e9) return [1e9, " s"];
  if (b >= 2e6) return [1e6, " ms"];
  if (b >= 2e3) return [1e3, " \u00b5s"];
  return [1, " ns"];
}
// The x tick rule of the SVG (XTicks): 1, 2, 5 x 10^k, at most 8 steps, one unit.
function xTicks(a, b) {
  const span = Math.max(b - a, 1);
  let step = 1;
  for (let p = 1; ; p *= 10) {
    const m = [1, 2, 5].find((m) => m * p * 8 >= span);
    if (m !== undefined) { step = m * p; break; }
  }
  const [unit, name] = xUnit(b);
  const dec = step / unit >= 1 ? 0 : Math.ceil(-Math.log10(step / unit) - 1e-9);
  const out = [];
  for (let v = Math.ceil(a / step) * step; v <= b; v += step) {
    out.push([v, (v / unit).toFixed(dec) + name]);
  }
  return out;
}
// Plot x (0..PW in the current view) <-> trace x.
function toX(px) { return view[0] + px / PW * (view[1] - view[0]); }
function plotXOf(ev) {
  const box = plot.getBoundingClientRect();
  return (ev.clientX - box.left) / box.width * PW;
}
// The last point at or before x, -1 before the first.
function pointAt(x) {
  let lo = 0, hi = data.x.length;
  while (lo < hi) { const m = (lo + hi) >> 1; if (data.x[m] <= x) lo = m + 1; else hi = m; }
  return lo - 1;
}
function valueAt(series, x) { const i = pointAt(x); return i < 0 ? 0 : series[i]; }
// The stacked polygons again, with the hidden sites left out.
function restack() {
  const n = data.x.length;
  const X = (v) => v / xEnd * PW, Y = (v) => PH - v / yEnd * PH;
  const steps = (v) => {
    const p = [[0, Y(0)]];
    let prev = Y(0);
    for (let i = 0; i < n; ++i) { p.push([X(data.x[i]), prev], [X(data.x[i]), Y(v[i])]); prev = Y(v[i]); }
    return p;
  };
  let below = new Array(n).fill(0);
  data.sites.forEach((s, k) => {
    const poly = plot.querySelector('polygon[data-series="' + k + '"]');
    if (!shown[k]) { poly.style.display = "none"; return; }
    poly.style.display = "";
    const top = below.map((b, i) => b + s.bytes[i]);
    const pts = steps(top).concat(steps(below).reverse());
    poly.setAttribute("points", pts.map((p) => p[0].toFixed(2) + "," + p[1].toFixed(2)).join(" "));
    below = top;
  });
  for (const row of svg.querySelectorAll(".legend-row")) {
    row.style.opacity = shown[Number(row.dataset.series)] ? 1 : 0.35;
  }
}
function setView(a, b) {
  a = Math.max(0, a); b = Math.min(xEnd, b);
  if (!(b > a)) return;
  view = [a, b];
  plot.setAttribute("viewBox", (a / xEnd * PW) + " 0 " + ((b - a) / xEnd * PW) + " " + PH);
  const g = document.getElementById("xticks");
  const ns = "http://www.w3.org/2000/svg";
  g.replaceChildren();
  for (const [v, label] of xTicks(a, b)) {
    const px = LEFT + (v - a) / (b - a) * PW;
    const line = document.createElementNS(ns, "line");
    for (const [k, val] of [["x1", px], ["x2", px], ["y1", TOP + PH], ["y2", TOP + PH + 4], ["stroke", "#999"]]) line.setAttribute(k, val);
    const text = document.createElementNS(ns, "text");
    for (const [k, val] of [["class", "xtick"], ["x", px], ["y", TOP + PH + 16], ["text-anchor", "middle"]]) text.setAttribute(k, val);
    text.textContent = label;
    g.append(line, text);
  }
  for (const t of svg.querySelectorAll(".oom-label")) {
    const x = Number(t.dataset.x);
    t.style.display = x < a || x > b ? "none" : "";
    const px = LEFT + (x - a) / (b - a) * PW;
    t.setAttribute("x", px);
    t.setAttribute("text-anchor", px > LEFT + PW - 30 ? "end" : "middle");
  }
  svg.dataset.view = a + "," + b;
}
function show(x, py) {
  const i = pointAt(x);
  const at = (s) => (i < 0 ? 0 : s[i]);
  const next = Math.min(i + 1, data.x.length - 1);
  const [unit, name] = xUnit(view[1]);  // the unit of the ticks shown
  const lines = [(data.xIsTime ? "t = " + (x / unit).toFixed(unit > 1 ? 6 : 0) + name
                               : "event " + Math.round(x)),
                 "allocated " + fmt(at(data.allocated)) +
                     (next >= 0 ? "   (highest in this interval " + fmt(data.allocatedMax[next]) + ")" : ""),
                 "reserved  " + fmt(at(data.reserved))];
  // The site whose band is under the pointer.
  const bytesUp = (PH - py) / PH * yEnd;
  let sum = 0, under = null;
  data.sites.forEach((s, k) => {
    if (!shown[k]) return;
    const b = at(s.bytes);
    if (under === null && bytesUp >= sum && bytesUp < sum + b) under = k;
    sum += b;
  });
  lines.push(under === null ? "under the pointer: no site"
                            : "under the pointer: " + data.sites[under].name + ", " + fmt(at(data.sites[under].bytes)));
  data.sites.forEach((s, k) => {
    if (shown[k]) lines.push("  " + fmt(at(s.bytes)).padStart(10) + "  " + s.name);
  });
  readout.textContent = lines.join("\n");
  readout.dataset.allocated = at(data.allocated);
  readout.dataset.reserved = at(data.reserved);
  readout.dataset.under = under === null ? "" : under;
  drawSegments(x);
}
// The segment view (tools/timeline/timeline.h): the address ranges mapped at x (adjacent ones
// merged into one row: an expandable segment's granules), each drawn to one scale with
// the blocks live in it at x in their site's colour; a block's tooltip names its site,
// size and address. At most SEG_ROWS rows are drawn (the summary counts them all).
const SEG_ROWS = 64, SEG_W = 760, SEG_H = 14;
const segSvg = document.getElementById("segments");
const segSummary = document.getElementById("segsummary");
function liveAt(x, x0, x1) { return x0 <= x && (x1 < 0 || x1 > x); }
function seriesColor(k) {
  const poly = k >= 0 ? plot.querySelector('polygon[data-series="' + k + '"]') : null;
  return poly ? poly.getAttribute("fill") : "#777";
}
function hex(a) { return "0x" + a.toString(16); }
let lastX = xEnd;
function drawSegments(x) {
  lastX = x;
  if (data.segNote) { segSummary.textContent = data.segNote; return; }
  const S = data.segs, B = data.blocks;
  const ranges = [];
  for (let i = 0; i < S.length; i += 4) {
    if (liveAt(x, S[i + 2], S[i + 3])) ranges.push([S[i], S[i] + S[i + 1]]);
  }
  ranges.sort((a, b) => a[0] - b[0]);
  const rows = [];
  for (const [a, b] of ranges) {
    const last = rows[rows.length - 1];
    if (last && last.end === a) { last.end = b; last.ranges++; }
    else rows.push({start: a, end: b, ranges: 1, blocks: []});
  }
  let blocks = 0, blockBytes = 0, outside = 0;
  for (let i = 0; i < B.length; i += 5) {
    if (!liveAt(x, B[i + 2], B[i + 3])) continue;
    let lo = 0, hi = rows.length;  // the last row starting at or before the block
    while (lo < hi) { const m = (lo + hi) >> 1; if (rows[m].start <= B[i]) lo = m + 1; else hi = m; }
    const row = lo > 0 && B[i] < rows[lo - 1].end ? rows[lo - 1] : null;
    if (row === null) { ++outside; continue; }
    row.blocks.push(i);
    ++blocks;
    blockBytes += B[i + 1];
  }
  const mapped = rows.reduce((sum, r) => sum + (r.end - r.start), 0);
  segSummary.textContent = rows.length + " segments (" + ranges.length + " mapped ranges), " +
      fmt(mapped) + " mapped; " + blocks + " blocks, " + fmt(blockBytes) + " allocated in them" +
      (outside ? "; " + outside + " live blocks outside any segment" : "") +
      (rows.length > SEG_ROWS ? "; the first " + SEG_ROWS + " by address are drawn" : "");
  Object.assign(segSummary.dataset, {segments: rows.length, ranges: ranges.length,
                                     mapped: mapped, blocks: blocks, blockBytes: blockBytes});
  const ns = "http://www.w3.org/2000/svg";
  const shownRows = rows.slice(0, SEG_ROWS);
  const scale = SEG_W / Math.max(1, ...shownRows.map((r) => r.end - r.start));
  segSvg.replaceChildren();
  segSvg.setAttribute("height", Math.max(20, shownRows.length * (SEG_H + 4)));
  const el = (name, attrs, text) => {
    const e = document.createElementNS(ns, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  shownRows.forEach((r, n) => {
    const y = n * (SEG_H + 4);
    const g = el("g", {class: "segment", "data-start": r.start, "data-bytes": r.end - r.start});
    g.append(el("rect", {x: 0, y: y, width: (r.end - r.start) * scale, height: SEG_H,
                         fill: "#eee", stroke: "#999"}),
             el("text", {x: (r.end - r.start) * scale + 6, y: y + SEG_H - 3, "font-size": 11},
                fmt(r.end - r.start) + " at " + hex(r.start) +
                    (r.ranges > 1 ? " (" + r.ranges + " mapped ranges)" : "")));
    for (const i of r.blocks) {
      const k = B[i + 4];
      if (k >= 0 && !shown[k]) continue;
      const name = k >= 0 ? data.sites[k].name : "a site not drawn";
      const b = el("rect", {class: "block", x: (B[i] - r.start) * scale, y: y,
                            width: Math.max(1, B[i + 1] * scale), height: SEG_H,
                            fill: seriesColor(k), "data-series": k});
      b.append(el("title", {}, name + " \u00b7 " + fmt(B[i + 1]) + " at " + hex(B[i])));
      g.append(b);
    }
    segSvg.append(g);
  });
}
let dragFrom = null;
plot.addEventListener("mousedown", (ev) => { dragFrom = toX(plotXOf(ev)); ev.preventDefault(); });
window.addEventListener("mouseup", (ev) => {
  if (dragFrom === null) return;
  const to = toX(plotXOf(ev));
  const [a, b] = [Math.min(dragFrom, to), Math.max(dragFrom, to)];
  dragFrom = null;
  if (b - a > (view[1] - view[0]) / 200) setView(a, b);
});
plot.addEventListener("dblclick", () => setView(0, xEnd));
document.getElementById("unzoom").addEventListener("click", () => setView(0, xEnd));
plot.addEventListener("mousemove", (ev) => {
  const box = plot.getBoundingClientRect();
  show(toX(plotXOf(ev)), (ev.clientY - box.top) / box.height * PH);
});
const toggles = document.getElementById("toggles");
data.sites.forEach((s, k) => {
  const label = document.createElement("label");
  const box = document.createElement("input");
  box.type = "checkbox"; box.checked = true; box.dataset.series = k;
  box.addEventListener("change", () => { shown[k] = box.checked; restack(); drawSegments(lastX); });
  label.append(box, " " + s.name);
  toggles.append(label);
});
drawSegments(xEnd);
document.getElementById("status").textContent =
    "timeline ready: " + data.x.length + " points, " + data.sites.length + " site series";
document.body.setAttribute("data-timeline", "ready");
</script>
</body></html>
)JS";
  return html;
}

}  // namespace devmem
