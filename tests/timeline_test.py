#!/usr/bin/env python3
"""tests/timeline_test.py: `memtrace timeline` output checks.

  timeline_test.py svg MEMTRACE TRACE SITE...   the SVG parses as XML (xml.etree), has
                                                the allocated and reserved lines and
                                                names each SITE in its legend
  timeline_test.py html MEMTRACE TRACE          the HTML page opens in headless Chromium
                                                and its script ran to the end (it writes
                                                "timeline ready" into the DOM)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

mode, memtrace, trace = sys.argv[1:4]
sites = sys.argv[4:]
SVG = "{http://www.w3.org/2000/svg}"


def fail(why):
    print("FAILED:", why)
    sys.exit(1)


with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "t." + mode)
    r = subprocess.run([memtrace, "timeline", trace, "-o", out, "--json"],
                       capture_output=True, text=True)
    print(r.stdout, r.stderr)
    if r.returncode != 0:
        fail(f"memtrace timeline exit status {r.returncode}")
    if mode == "svg":
        root = ET.parse(out).getroot()
        if root.tag != SVG + "svg":
            fail("root element is not <svg>")
        ids = {e.get("id") for e in root.iter()}
        if not {"allocated", "reserved"} <= ids:
            fail("missing the allocated or reserved line")
        names = " ".join(e.text or "" for e in root.iter(SVG + "text")
                         if e.get("class") == "site-name")
        for s in sites:
            if s not in names:
                fail(f"legend does not name the site {s!r}: {names}")
        print("ok: well-formed, names", sites)
    else:
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            fail("chromium is not installed (scripts/setup.sh installs Debian's chromium)")
        profile = os.path.join(d, "profile")
        r = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--dump-dom", "file://" + out],
            capture_output=True, text=True, timeout=120)
        if 'data-timeline="ready"' not in r.stdout or "timeline ready:" not in r.stdout:
            print(r.stderr[-3000:])
            fail("the page's script did not run to the end in headless Chromium")
        print("ok: the page's script ran in Chromium")
