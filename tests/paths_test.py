#!/usr/bin/env python3
"""tests/paths_test.py SOURCE_DIR: every repository path the docs, build files, scripts
and code comments name exists, and none of them points outside the repository: no path
into a sibling checkout ("../shared/"), no reference to a tracker's items (a number
after the word for one, or "the" before it) that a reader of the repository cannot
follow (ctest docs.paths).

Files move (tools/ became one folder per target); a path left behind in a comment or a
doc sends the reader nowhere. Read: the files git tracks (untracked ones too, as the
working tree has them), but not tests/data/ (fixtures: recorded site names of programs
as they were) nor tools/fuzz/corpus/. A mention is "<top folder>/<name>.<ext>" for the
repository's top folders and source or doc extensions; in C and C++ files only after
"//" or inside "/* */" lines (string literals there are sites' file names, made up by
the tests). PLACEHOLDERS are names the docs use as examples of a form.
"""
import os
import re
import subprocess
import sys

TOPS = ("allocator", "runtime", "tensor", "capi", "cuda", "tools", "tests", "scripts",
        "docs", "cmake", "python", "dashboards")
EXTS = ("h", "cc", "c", "cu", "py", "sh", "md", "cmake", "txt", "in", "toml")
MENTION = re.compile(r"(?<![\w./-])((?:%s)/[A-Za-z0-9_./-]*[A-Za-z0-9_]\.(?:%s))(?![\w])"
                     % ("|".join(TOPS), "|".join(EXTS)))
PLACEHOLDERS = {"allocator/x.h", "allocator/x.cc"}
# What points outside the repository (this file, which spells the patterns, is not read).
OUTSIDE = re.compile(r"\.\./shared\b|\bissues?\s+#?\d+|\bthe\s+issue\b", re.IGNORECASE)
C_LIKE = (".h", ".cc", ".c", ".cu")


def files(src):
    out = subprocess.run(["git", "-C", src, "ls-files", "--cached", "--others",
                          "--exclude-standard"], check=True, capture_output=True,
                         text=True).stdout.split("\n")
    return [f for f in out if f and not f.startswith(("tests/data/", "tools/fuzz/corpus/"))]


def mentions(path, text):
    c_like = path.endswith(C_LIKE)
    for no, line in enumerate(text.split("\n"), 1):
        if c_like:
            at = line.find("//")
            stripped = line.lstrip()
            if at >= 0:
                line = line[at:]
            elif not stripped.startswith(("/*", "*")):
                continue
        for m in MENTION.finditer(line):
            yield no, m.group(1)


def main():
    src = sys.argv[1]
    missing, outside = [], []
    for f in files(src):
        p = os.path.join(src, f)
        if not os.path.isfile(p):
            continue
        try:
            with open(p, encoding="utf-8") as fh:
                text = fh.read()
        except UnicodeDecodeError:
            continue
        for no, name in mentions(f, text):
            if name not in PLACEHOLDERS and not os.path.exists(os.path.join(src, name)):
                missing.append("%s:%d: %s" % (f, no, name))
        if f != "tests/paths_test.py":
            for no, line in enumerate(text.split("\n"), 1):
                m = OUTSIDE.search(line)
                if m:
                    outside.append("%s:%d: %r" % (f, no, m.group(0)))
    if missing:
        print("paths named that do not exist (moved or renamed? fix the mention):")
        print("\n".join(missing))
    if outside:
        print("references outside the repository (say what they stand for instead):")
        print("\n".join(outside))
    if missing or outside:
        return 1
    print("ok: every path named exists, none outside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main())
