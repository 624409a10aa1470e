#!/usr/bin/env python3
"""The public API check: include/fuseflow/*.h is the whole API of libfuseflow.so, and
fuseflow/fuseflow.h all of it.

1. The declarations: every function the headers declare (read from gcc's -aux-info, so
   multi-line prototypes and attributes need no parsing here) and every `extern` variable.
   Static inline functions are no symbols: they are listed as such, not expected.
2. The exports: `nm -D --defined-only` of the library (and of the `fuseflow` command, which
   plugins may resolve against) must be exactly the declarations: no internal symbol
   (rt_*, ex_*, coll_*, ff_cpu_*, ...) leaks, no declared function is missing.
3. A program that includes only fuseflow/fuseflow.h and takes the address of every declared
   function and variable compiles with -Wall -Wextra -Werror as C11, links against the
   library and runs; the same as C++ when a C++ compiler is given (a declaration outside
   the extern "C" guards links as a mangled name and fails).

Usage: check_exports.py --include DIR --lib LIBFUSEFLOW.SO [--exe FUSEFLOW] [--cc gcc]
                        [--cxx g++] [--cflags FLAGS] [--tmp DIR]
Exit 0 when all holds, 1 with one line per problem, 77 when gcc (-aux-info) is missing.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

# What the linker defines in every executable or shared object: not the API's.
LINKER_SYMBOLS = {"_init", "_fini", "_edata", "_end", "__bss_start", "_start", "_IO_stdin_used", "data_start",
                  "__data_start", "__dso_handle", "_DYNAMIC", "_GLOBAL_OFFSET_TABLE_"}
# What the sanitizers' instrumentation adds to a sanitized build (ODR indicators of exported
# variables, runtime flags): not the API's either.
SANITIZER_PREFIXES = ("__asan", "__odr_asan", "__ubsan", "__lsan", "__sanitizer")

problems = []


def problem(msg):
    problems.append(msg)
    print(f"FAIL: {msg}")


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def strip_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def declarations(inc, cc, tmp):
    """{header: ([functions], [variables], [inline functions], [typedef names])}"""
    headers = sorted(glob.glob(os.path.join(inc, "fuseflow", "*.h")))
    src = os.path.join(tmp, "all_headers.c")
    with open(src, "w") as f:
        for h in headers:
            f.write(f'#include "fuseflow/{os.path.basename(h)}"\n')
    aux = os.path.join(tmp, "aux.txt")
    r = run([cc, "-std=c11", "-D_GNU_SOURCE", "-I", inc, "-fsyntax-only", "-aux-info", aux, src])
    if r.returncode != 0:
        problem(f"the public headers do not compile together as C11:\n{r.stderr[:2000]}")
        return {}
    out = {os.path.basename(h): ([], [], [], []) for h in headers}
    absinc = os.path.realpath(os.path.join(inc, "fuseflow"))
    # /* /path/include/fuseflow/util.h:19:NC */ extern int64_t ff_now_ns (void);
    line_re = re.compile(r"^/\* (.*?):(\d+):(\w+) \*/ (.*)$")
    for line in open(aux):
        m = line_re.match(line.strip())
        if not m or os.path.dirname(os.path.realpath(m.group(1))) != absinc:
            continue
        name = re.search(r"\b(\w+) \(", m.group(4))
        if not name:
            continue
        fns, _, inl, _ = out[os.path.basename(m.group(1))]
        (inl if re.search(r"\bstatic\b", m.group(4)) else fns).append(name.group(1))
    for h in headers:
        text = strip_comments(open(h).read())
        b = os.path.basename(h)
        out[b][1].extend(re.findall(r'\bextern\s+(?!"C")[^;(){}"]*?\b(ff_\w+)\s*(?:\[[^\]]*\]\s*)*;', text))
        out[b][3].extend(re.findall(r"\btypedef\b[^;{}]*?\b(ff_\w+)\s*;|\}\s*(ff_\w+)\s*;", text))
        out[b][3][:] = [x or y for x, y in out[b][3]]
        if not any(out[b]):
            problem(f"include/fuseflow/{b} declares no function, variable or ff_ type for the check to use")
    return out


def exports(path, what):
    r = run(["nm", "-D", "--defined-only", path])
    if r.returncode != 0:
        problem(f"{what}: nm -D failed: {r.stderr.strip()}")
        return set()
    names = set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if (len(parts) >= 3 and "@" not in parts[2] and parts[2] not in LINKER_SYMBOLS and
                not parts[2].startswith(SANITIZER_PREFIXES)):
            names.add(parts[2])  # name@VERSION: libc data copied into an executable
    return names


def compare(what, got, declared, origin):
    for s in sorted(got - declared):
        problem(f"{what} exports {s}, which include/fuseflow/*.h does not declare (make it static, or give it an "
                f"internal prefix and declare it outside include/fuseflow/)")
    for s in sorted(declared - got):
        problem(f"{what} does not export {s}, declared in include/fuseflow/{origin[s]} (defined nowhere, or in a file "
                f"that does not include its header)")
    if got == declared:
        print(f"ok: {what} exports exactly the {len(declared)} declared functions and variables")


def use_program(decls):
    """A program that uses every declaration through fuseflow.h alone."""
    lines = ['/* generated by scripts/check_exports.py: uses every public declaration through fuseflow.h */',
             '#include <stdio.h>', '#include "fuseflow/fuseflow.h"', "",
             "typedef void (*any_fn)(void);", "static const any_fn fns[] = {"]
    for h, (fns, _, _, _) in decls.items():
        lines += [f"    (any_fn)&{f}, /* {h} */" for f in fns]
    lines += ["    NULL};", "static const void *const vars[] = {"]
    for h, (_, vs, _, _) in decls.items():
        lines += [f"    (const void *)&{v}, /* {h} */" for v in vs]
    lines += ["    NULL};", "static const size_t types[] = {"]
    for h, (fns, vs, _, tds) in decls.items():
        if not fns and not vs and tds:  # a header of types only: one of them
            lines.append(f"    sizeof({tds[0]} *), /* {h} */")
    lines += ["    0};", "",
              "int main(void) {",
              "    size_t n = 0;",
              "    for (size_t i = 0; fns[i]; i++) n++;",
              "    for (size_t i = 0; vars[i]; i++) n++;",
              "    printf(\"%zu symbols, %zu type-only headers, fuseflow %s\\n\", n, sizeof types / sizeof types[0] - 1, "
              "ff_version());",
              "    return 0;", "}", ""]
    return "\n".join(lines)


def build_and_run(compiler, lang_flags, src, lib, inc, tmp, what, extra):
    exe = os.path.join(tmp, f"use_api_{what}")
    libdir = os.path.dirname(os.path.abspath(lib))
    cmd = [compiler] + lang_flags + extra + ["-Wall", "-Wextra", "-Werror", "-I", inc, src, "-o", exe, "-L", libdir,
                                     "-lfuseflow", f"-Wl,-rpath,{libdir}"]
    r = run(cmd)
    if r.returncode != 0:
        problem(f"{what}: a program that includes only fuseflow/fuseflow.h does not build:\n  {' '.join(cmd)}\n"
                f"{r.stderr[:3000]}")
        return
    r = run([exe])
    if r.returncode != 0:
        problem(f"{what}: the program linked against {lib} does not run: {r.stderr[:1000]}")
        return
    print(f"ok: {what}: fuseflow.h alone declares everything, linked and ran: {r.stdout.strip()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--include", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--exe")
    ap.add_argument("--cc", default="gcc")
    ap.add_argument("--cxx")
    ap.add_argument("--tmp")
    ap.add_argument("--cflags", default="", help="for the program, e.g. the sanitizers of a sanitized library")
    a = ap.parse_args()
    if not shutil.which(a.cc) or run([a.cc, "--version"]).stdout.find("Free Software Foundation") < 0:
        print(f"SKIP: {a.cc} is not gcc (the declarations are read with gcc -aux-info)")
        return 77
    tmp = a.tmp or tempfile.mkdtemp(prefix="ff_exports.")
    os.makedirs(tmp, exist_ok=True)
    decls = declarations(a.include, a.cc, tmp)
    if not decls:
        return 1
    declared, origin = set(), {}
    for h, (fns, vs, inl, _) in decls.items():
        for s in fns + vs:
            declared.add(s)
            origin[s] = h
        if inl:
            print(f"static inline in {h}, no symbols: {' '.join(inl)}")
    compare("libfuseflow.so", exports(a.lib, "libfuseflow.so"), declared, origin)
    if a.exe:
        compare("the fuseflow command", exports(a.exe, "the fuseflow command"), declared, origin)
    src = os.path.join(tmp, "use_api.c")
    with open(src, "w") as f:
        f.write(use_program(decls))
    build_and_run(a.cc, ["-std=c11", "-x", "c"], src, a.lib, a.include, tmp, "C11", a.cflags.split())
    if a.cxx:
        build_and_run(a.cxx, ["-std=c++17", "-x", "c++"], src, a.lib, a.include, tmp, "C++17", a.cflags.split())
    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
