#!/usr/bin/env python3
"""The layering check: every `#include "..."` of the library's sources against the table of
docs/architecture.md, and every ff_module(... DEPS ...) of CMakeLists.txt against it too.

The table (the first one under "## Libraries" in docs/architecture.md) has the columns
library | folders | public headers | may use | owns. A source file belongs to the library of
the most specific folder that holds it; a header under include/fuseflow/ to the library
whose row lists it (each header is listed exactly once). A file may include what its own
library owns and what the libraries it may use own, directly or through theirs (the
arrows are transitive: model may use kernels, kernels may use common, so model may
include common's headers). Transport and process headers (ZeroMQ, libev, msgpack, sockets,
fork/exec) are allowed only in the libraries the table marks with "(transport)".

Usage: check_layering.py [ROOT]   exit 0 when the tree obeys the table, 1 with one line
per violation (file:line: what, and the arrow that would be needed), 2 when the table
itself is malformed. Not here: tests/, bench/, fuzz/ and examples/, which may include
anything (they exercise the libraries from outside).
"""
import os
import re
import sys

TRANSPORT_HEADERS = {"zmq.h", "ev.h", "msgpack.h", "sys/socket.h", "netinet/in.h", "netinet/tcp.h",
                     "arpa/inet.h", "spawn.h", "sys/wait.h", "netdb.h"}
SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".cpp")


def fail_table(msg):
    print(f"docs/architecture.md: {msg}", file=sys.stderr)
    sys.exit(2)


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def words(cell):
    return [w.strip("`") for w in re.split(r"[,\s]+", cell) if w.strip("`") and w.strip("`") not in ("-", "—")]


def read_table(root):
    path = os.path.join(root, "docs", "architecture.md")
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        fail_table(f"cannot read it: {e}")
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == "## Libraries")
    except StopIteration:
        fail_table("no '## Libraries' section")
    rows = []
    i = start + 1
    while i < len(lines) and not lines[i].startswith("|"):
        i += 1
    header = cells(lines[i]) if i < len(lines) else []
    if [h.lower() for h in header[:4]] != ["library", "folders", "public headers", "may use"]:
        fail_table(f"the Libraries table must start with the columns library | folders | public headers | may use (found {header})")
    i += 2  # header and the |---| line
    while i < len(lines) and lines[i].startswith("|"):
        c = cells(lines[i])
        if len(c) < 4:
            fail_table(f"line {i + 1}: a row needs four cells")
        lib = c[0].strip("`")
        transport = "(transport)" in c[3]
        rows.append((i + 1, lib, words(c[1]), words(c[2]), [w for w in words(c[3]) if w != "(transport)"], transport))
        i += 1
    if not rows:
        fail_table("the Libraries table has no rows")
    libs = {}
    folder_owner, header_owner = {}, {}
    for line, lib, folders, headers, deps, transport in rows:
        if lib in libs:
            fail_table(f"line {line}: library {lib} listed twice")
        libs[lib] = {"deps": deps, "transport": transport, "line": line}
        for f in folders:
            f = f.rstrip("/")
            if f in folder_owner:
                fail_table(f"line {line}: folder {f} already belongs to {folder_owner[f]}")
            folder_owner[f] = lib
        for h in headers:
            h = h if h.startswith("fuseflow/") else "fuseflow/" + h
            if h in header_owner:
                fail_table(f"line {line}: header {h} already belongs to {header_owner[h]}")
            header_owner[h] = lib
    for lib, d in libs.items():
        for dep in d["deps"]:
            if dep != "*" and dep not in libs:
                fail_table(f"line {d['line']}: {lib} may use '{dep}', which is not a library of the table")
    return libs, folder_owner, header_owner


def closure(libs):
    """lib -> every library it may use, transitively; refuses cycles."""
    out = {}

    def visit(lib, stack):
        if lib in out:
            return out[lib]
        if lib in stack:
            fail_table("the arrows have a cycle: " + " -> ".join(stack[stack.index(lib):] + [lib]))
        deps = libs[lib]["deps"]
        if "*" in deps:
            out[lib] = set(libs) - {lib}
            return out[lib]
        acc = set()
        for dep in deps:
            acc.add(dep)
            acc |= visit(dep, stack + [lib])
        out[lib] = acc
        return acc

    for lib in libs:
        visit(lib, [])
    return out


def owner_of_path(rel, folder_owner):
    d = os.path.dirname(rel)
    while d:
        if d in folder_owner:
            return folder_owner[d]
        d = os.path.dirname(d)
    return None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    libs, folder_owner, header_owner = read_table(root)
    allowed = closure(libs)
    problems = []

    # every public header is owned
    inc = os.path.join(root, "include", "fuseflow")
    for name in sorted(os.listdir(inc)):
        if name.endswith(".h") and "fuseflow/" + name not in header_owner:
            problems.append(f"include/fuseflow/{name}: no library of docs/architecture.md lists this public header")
    for h in sorted(header_owner):
        if not os.path.exists(os.path.join(root, "include", h)):
            problems.append(f"docs/architecture.md: lists include/{h}, which does not exist")

    files = []
    for folder in folder_owner:
        base = os.path.join(root, folder)
        if not os.path.isdir(base):
            problems.append(f"docs/architecture.md: lists folder {folder}, which does not exist")
            continue
        for dirpath, dirnames, names in os.walk(base):
            dirnames.sort()
            for name in sorted(names):
                if name.endswith(SOURCE_EXT):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    if owner_of_path(rel, folder_owner) == folder_owner[folder]:  # the most specific folder
                        files.append((rel, folder_owner[folder]))
    for name in sorted(os.listdir(inc)):
        h = "fuseflow/" + name
        if h in header_owner:
            files.append((os.path.join("include", h), header_owner[h]))

    inc_re = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
    for rel, lib in files:
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                m = inc_re.match(line)
                if not m:
                    continue
                kind, target = m.groups()
                if kind == "<":
                    if target in TRANSPORT_HEADERS and not libs[lib]["transport"]:
                        problems.append(f"{rel}:{n}: {lib} includes <{target}>, but only the libraries marked "
                                        f"(transport) in docs/architecture.md may use transport or process headers")
                    continue
                if target.startswith("fuseflow/"):
                    to = header_owner.get(target)
                    if to is None:
                        if not os.path.exists(os.path.join(root, "include", target)):
                            problems.append(f"{rel}:{n}: includes \"{target}\", which does not exist")
                        continue  # an unlisted header is reported above
                else:
                    if not os.path.exists(os.path.join(root, target)):
                        problems.append(f"{rel}:{n}: includes \"{target}\", which is not a path from the root")
                        continue
                    to = owner_of_path(target, folder_owner)
                    if to is None:
                        problems.append(f"{rel}:{n}: includes \"{target}\", which no library owns")
                        continue
                if to != lib and to not in allowed[lib]:
                    problems.append(f"{rel}:{n}: {lib} includes \"{target}\" of {to}, but docs/architecture.md "
                                    f"has no arrow {lib} -> {to}")

    # the build's link dependencies follow the same arrows
    cmake = open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8").read()
    for m in re.finditer(r"ff_module\(\s*(\w+)\s+DIRS\s+([^)]*?)\s+DEPS\s+([^)]*)\)", cmake):
        lib, dirs, deps = m.group(1), m.group(2).split(), m.group(3).split()
        if lib not in libs:
            problems.append(f"CMakeLists.txt: library {lib} is not in docs/architecture.md's table")
            continue
        for d in dirs:
            if folder_owner.get(d) != lib:
                problems.append(f"CMakeLists.txt: {lib} builds folder {d}, which the table gives to {folder_owner.get(d)}")
        for dep in deps:
            if dep.startswith("ff_") and dep in libs and dep not in allowed[lib]:
                problems.append(f"CMakeLists.txt: {lib} links {dep}, but docs/architecture.md has no arrow {lib} -> {dep}")

    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} problem(s); fix the include or change the table in docs/architecture.md (and say why)")
        return 1
    print(f"layering: {len(files)} files of {len(libs)} libraries follow docs/architecture.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
