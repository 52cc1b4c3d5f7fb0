#!/usr/bin/env python3
"""tests/timeline_view_test.py: `memtrace timeline` pictures that can be trusted.

  timeline_view_test.py MEMTRACE

On a small trace with known values (two sites in the same function, one a clone, a
300-character name, an OOM at the right edge, the final frees at the end):
  - SVG, structurally: every line segment of the allocated, reserved and site series is
    horizontal or vertical (steps, not ramps); the allocated line ends at zero (the
    final frees are drawn); y ticks are whole numbers of one byte unit, x ticks of one
    time unit; the legend names each site's kind and id, and a long name is cut to fit
    (the whole name in its tooltip);
  - HTML, in headless Chromium (Debian's chromium), driven by DOM events: the readout
    at a known time equals the trace's value there; so does the segment view (segments
    as runs of mapped memory, the blocks live in them, a tooltip naming a block's site,
    size and address); the site under the pointer is
    named; a per-site toggle restacks the others; a drag zooms on that time range
    (ticks and readout follow) and a double-click goes back; the OOM label stays
    inside the picture.
"""
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

memtrace = sys.argv[1]
SVG = "{http://www.w3.org/2000/svg}"
MiB = 1 << 20
MS = 1_000_000


def fail(why):
    print("FAILED:", why)
    sys.exit(1)


LONG = "very_long_function_name_" * 12 + "end"
sites = [
    {"id": 1, "file": "model.py", "line": 10, "function": "forward", "tag": "", "kind": "alloc"},
    {"id": 2, "file": "model.py", "line": 10, "function": "forward", "tag": "", "kind": "clone"},
    {"id": 3, "file": "model.py", "line": 99, "function": LONG, "tag": "", "kind": "alloc"},
]
G = 1 << 30
events = [  # (action, addr, size, site, time)
    ("segment_alloc", G, 64 * MiB, 0, 0),
    ("alloc", G, 1 * MiB, 1, 1 * MS),
    ("segment_map", 2 * G, 8 * MiB, 0, 1_200_000),
    ("alloc", G + 4 * MiB, 3 * MiB, 2, 2 * MS),
    ("segment_map", 2 * G + 8 * MiB, 2 * MiB, 0, 2 * MS),
    ("alloc", 2 * G + 8 * MiB, 512 * 1024, 3, 3 * MS),
    ("free", G, 0, 0, 5 * MS),
    ("segment_unmap", 2 * G + 2 * MiB, 2 * MiB, 0, 6 * MS),
    ("free", 2 * G + 8 * MiB, 0, 0, 7 * MS),
    ("oom", 0, 128 * MiB, 2, 9_900_000),
    ("free", G + 4 * MiB, 0, 0, 10 * MS),
]
# The trace's allocated bytes at a time (after the events at or before it).
def allocated_at(t):
    live = {}
    for a, addr, size, _, et in events:
        if et > t:
            break
        if a == "alloc":
            live[addr] = size
        elif a == "free":
            live.pop(addr, None)
    return sum(live.values())


# The segment view's figures at a time, from a model of mapped 512 KiB granules: a
# segment is a maximal run of mapped granules; blocks count when they lie in one.
def segments_at(t):
    g = 512 * 1024
    mapped, live = set(), {}
    for a, addr, size, _, et in events:
        if et > t:
            break
        if a in ("segment_alloc", "segment_map"):
            mapped |= set(range(addr // g, (addr + size) // g))
        elif a in ("segment_free", "segment_unmap"):
            mapped -= set(range(addr // g, (addr + size) // g))
        elif a == "alloc":
            live[addr] = size
        elif a == "free":
            live.pop(addr, None)
    runs = sum(1 for x in mapped if x - 1 not in mapped)
    inside = {a: s for a, s in live.items() if a // g in mapped}
    return {"segments": runs, "mapped": len(mapped) * g, "blocks": len(inside),
            "blockBytes": sum(inside.values())}


with tempfile.TemporaryDirectory() as d:
    trace = os.path.join(d, "t.jsonl")
    with open(trace, "w") as f:
        f.write(json.dumps({"schema": "devmem.trace/1", "sites": sites}) + "\n")
        for a, addr, size, site, t in events:
            f.write(json.dumps({"action": a, "addr": addr, "size": size, "site": site,
                                "time_ns": t}) + "\n")
    svg_path, html_path = os.path.join(d, "t.svg"), os.path.join(d, "t.html")
    for out in (svg_path, html_path):
        r = subprocess.run([memtrace, "timeline", trace, "-o", out], capture_output=True,
                           text=True)
        if r.returncode != 0:
            fail(f"memtrace timeline -o {out}: exit {r.returncode}: {r.stderr}")

    # --- SVG, structurally.
    root = ET.parse(svg_path).getroot()
    def pts(e):
        return [tuple(map(float, p.split(","))) for p in e.get("points").split()]
    series = [e for e in root.iter() if e.get("id") in ("allocated", "reserved")] + \
             [e for e in root.iter(SVG + "polygon") if e.get("class") == "site"]
    if len(series) != 5:
        fail(f"expected the allocated and reserved lines and 3 site areas, got {len(series)}")
    for e in series:
        p = pts(e)
        for (x0, y0), (x1, y1) in zip(p, p[1:]):
            if abs(x0 - x1) > 1e-6 and abs(y0 - y1) > 1e-6:
                fail(f"{e.get('id') or 'site area'}: a ramp from {(x0, y0)} to {(x1, y1)}")
    plot = next(e for e in root.iter(SVG + "svg") if e.get("id") == "plot")
    ph = float(plot.get("height"))
    alloc = pts(next(e for e in root.iter() if e.get("id") == "allocated"))
    if abs(alloc[-1][1] - ph) > 1e-6:
        fail(f"the allocated line ends at y={alloc[-1][1]}, not at zero ({ph}): final frees")
    yt = [e.text for e in root.iter(SVG + "text") if e.get("class") == "ytick"]
    m = [re.fullmatch(r"(\d+) (B|KiB|MiB|GiB|TiB)", t) for t in yt]
    if not all(m) or len({x.group(2) for x in m}) != 1:
        fail(f"y ticks are not whole numbers of one unit: {yt}")
    xt = [e.text for e in root.iter(SVG + "text") if e.get("class") == "xtick"]
    units = {t.split(" ")[-1] for t in xt}
    if len(units) != 1 or not xt:
        fail(f"x ticks mix units: {xt}")
    rows = [e for e in root.iter(SVG + "g") if e.get("class") == "legend-row"]
    texts = [next(e.iter(SVG + "text")).text for e in rows]
    titles = [next(e.iter(SVG + "title")).text for e in rows]
    print("legend:", texts)
    if not any("· clone · site 2" in t for t in texts) or \
            not any("model.py:10 (forward) · alloc · site 1" in t for t in texts):
        fail("the legend does not tell the two sites of forward() apart by kind and id")
    if max(len(t) for t in texts) > 160:
        fail("a legend line is longer than the picture is wide")
    if not any(LONG in t for t in titles) or any(LONG in t for t in texts):
        fail("the long name is not cut in the legend with the whole of it in the tooltip")
    print("ok: SVG steps, final frees, round ticks, one x unit, legend")

    # --- HTML, in Chromium.
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        fail("chromium is not installed (scripts/setup.sh installs Debian's chromium)")
    probe = """<pre id="results"></pre><script>
"use strict";
(() => {
  const res = {};
  const plotEl = document.getElementById("plot");
  const ro = document.getElementById("readout");
  function view() { return (svg.dataset.view || ("0," + xEnd)).split(",").map(Number); }
  function at(t, bytesUp) {
    const box = plotEl.getBoundingClientRect(), [a, b] = view();
    const x = box.left + (t - a) / (b - a) * box.width;
    const y = box.top + box.height * (1 - bytesUp / yEnd);
    return {clientX: x, clientY: y, bubbles: true};
  }
  function hover(t, bytesUp) {
    plotEl.dispatchEvent(new MouseEvent("mousemove", at(t, bytesUp)));
    return {allocated: Number(ro.dataset.allocated), under: ro.dataset.under,
            text: ro.textContent};
  }
  res.readouts = TIMES.map((t) => hover(t, 0.25 * MIB).allocated);
  const seg = document.getElementById("segsummary");
  res.segments = TIMES.map((t) => {
    hover(t, 0.25 * MIB);
    const d = seg.dataset;
    return {segments: Number(d.segments), mapped: Number(d.mapped), blocks: Number(d.blocks),
            blockBytes: Number(d.blockBytes)};
  });
  hover(2.5e6, 0.25 * MIB);
  res.segRows = document.querySelectorAll("#segments g.segment").length;
  res.blockTitles = [...document.querySelectorAll("#segments rect.block title")].map(
      (e) => e.textContent);
  res.under = hover(2.5e6, 0.5 * MIB);
  const box0 = document.querySelector('#toggles input[data-series="0"]');
  box0.click();
  res.afterToggle = hover(2.5e6, 0.5 * MIB);
  res.hidden = plotEl.querySelector('polygon[data-series="0"]').style.display;
  box0.click();
  plotEl.dispatchEvent(new MouseEvent("mousedown", at(4e6, 0)));
  window.dispatchEvent(new MouseEvent("mouseup", at(6e6, 0)));
  res.view = view();
  res.ticks = [...document.querySelectorAll("#xticks text")].map((e) => e.textContent);
  res.zoomedReadout = hover(5.5e6, 0.25 * MIB).allocated;
  plotEl.dispatchEvent(new MouseEvent("dblclick", {bubbles: true}));
  res.unzoomed = view();
  const w = svg.viewBox.baseVal.width;
  res.oomRight = Math.max(...[...document.querySelectorAll(".oom-label")].map(
      (e) => { const b = e.getBBox(); return b.x + b.width; }));
  res.width = w;
  document.getElementById("results").textContent = JSON.stringify(res);
})();
</script>"""
    times = [0.5 * MS, 1.5 * MS, 2.5 * MS, 3.5 * MS, 6 * MS, 8 * MS, 9.95 * MS]
    probe = probe.replace("TIMES", json.dumps(times)).replace("MIB", str(MiB))
    page = open(html_path).read().replace("</body>", probe + "</body>")
    probed = os.path.join(d, "probe.html")
    open(probed, "w").write(page)
    profile = os.path.join(d, "profile")
    r = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--window-size=1200,1200", "--dump-dom", "file://" + probed],
        capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="results">(.*?)</pre>', r.stdout, re.S)
    if not m or not m.group(1):
        print(r.stderr[-3000:])
        fail("the probe did not run in headless Chromium")
    res = json.loads(html.unescape(m.group(1)))
    print(json.dumps(res, indent=1)[:3000])
    want = [allocated_at(t) for t in times]
    if res["readouts"] != want:
        fail(f"readouts {res['readouts']} at {times} are not the trace's values {want}")
    want_segments = [segments_at(t) for t in times]
    if res["segments"] != want_segments:
        fail(f"segment view {res['segments']} at {times} is not the trace's {want_segments}")
    if res["segRows"] != 2:
        fail(f"at 2.5 ms the segment view draws {res['segRows']} rows, not 2 (the two maps "
             "at 2 GiB are adjacent: one row)")
    if not any("clone" in t and "3.0 MiB" in t and hex(G + 4 * MiB) in t
               for t in res["blockTitles"]):
        fail(f"no block tooltip names the clone site, its size and address: {res['blockTitles']}")
    # At 2.5 ms, 0.5 MiB up: the bottom band is the largest site (the clone, 3 MiB).
    if res["under"]["under"] != "0" or "clone" not in res["under"]["text"]:
        fail(f"the site under the pointer is not the clone: {res['under']}")
    # With the clone hidden, the 1 MiB alloc site comes down to the bottom.
    if res["hidden"] != "none" or res["afterToggle"]["under"] != "1":
        fail(f"the toggle did not hide the clone and restack: {res['afterToggle']}")
    if abs(res["view"][0] - 4e6) > 0.01e6 or abs(res["view"][1] - 6e6) > 0.01e6:
        fail(f"the drag from 4 to 6 ms zoomed on {res['view']}")
    if not res["ticks"] or len({t.split(" ")[-1] for t in res["ticks"]}) != 1:
        fail(f"zoomed ticks: {res['ticks']}")
    if res["zoomedReadout"] != allocated_at(5.5 * MS):
        fail(f"zoomed readout {res['zoomedReadout']} != {allocated_at(5.5 * MS)}")
    if res["unzoomed"][0] != 0 or res["unzoomed"][1] < 10 * MS:
        fail(f"double-click did not show the whole trace again: {res['unzoomed']}")
    if res["oomRight"] > res["width"]:
        fail(f"the OOM label runs past the picture ({res['oomRight']} > {res['width']})")
    print("ok: readout by time, site under the pointer, toggle, zoom, OOM label, "
          "segment view")
