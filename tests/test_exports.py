#!/usr/bin/env python3
"""test_exports.py - libmoex.so exports exactly the API of include/moex.h.

    python3 tests/test_exports.py [--nm NM] LIBMOEX_SO MOEX_H

The API is moex.h with the headers it includes from its directory (the experimental
moex_fp8.h and moex_ep.h), read as the compiler reads them; a header of that directory that
moex.h does not include fails the test (it would be installed but never seen by a user of
moex.h, and not checked here).

Compares the dynamic symbols the shared library defines (`nm -D --defined-only`) with the
functions the API declares with MOEX_API, and fails with the difference when they differ
either way: a public function the library does not export (a missing MOEX_API on its
definition's declaration, a function not built), or a symbol the library exports that the
header does not declare (a private function, or a static library such as
libcudart_static.a leaking through: the library is compiled with hidden visibility and
linked with --exclude-libs,ALL). It also fails when the header declares a function without
MOEX_API (static inline helpers excepted). Symbols the linker or an instrumenting compiler
defines in a shared object (_init, _fini, __bss_start, _edata, _end; the sanitizers'
__asan_/__ubsan_/__sanitizer_/__sancov_ names and the __start_/__stop_ bounds of the
fuzzer's __sancov sections) are not the library's and are ignored.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "util"))
from moex_header import read_header  # noqa: E402

LINKER_SYMBOLS = {"_init", "_fini", "__bss_start", "_edata", "_end"}
TOOL_PREFIXES = ("__asan", "__ubsan", "__sanitizer", "__sancov", "__odr_asan", "__lsan",
                 "__start___sancov", "__stop___sancov")


def header_functions(path):
    """(names declared with MOEX_API, names declared without it) in the header and the
    headers it includes from its directory, and the headers of that directory it does not
    include."""
    seen = set()
    text = read_header(path, seen)
    unread = sorted(h for h in glob.glob(os.path.join(os.path.dirname(os.path.realpath(path)), "*.h"))
                    if os.path.realpath(h) not in seen)
    # comments out, keeping line structure (declarations start in column 0)
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"^[ \t]*#.*$", "", text, flags=re.M)   # preprocessor lines (continued ones
                                                        # do not occur in moex.h)
    api, bare = set(), set()
    decl = re.compile(r"^(MOEX_API\s+)?(?!static\b|typedef\b|extern\b|return\b)"
                      r"[A-Za-z_][\w\s\*]*?\b([A-Za-z_]\w*)\s*\(")
    for line in text.split("\n"):
        if not line or line[0].isspace() or line.startswith("#"):
            continue
        m = decl.match(line)
        if m:
            (api if m.group(1) else bare).add(m.group(2))
    # a use of MOEX_API anywhere else (not at the start of a line) still counts
    for m in re.finditer(r"MOEX_API\b[^;{(]*?\b([A-Za-z_]\w*)\s*\(", text):
        api.add(m.group(1))
    return api, bare - api, unread


def library_symbols(nm, lib):
    out = subprocess.run([nm, "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name = parts[-1].split("@")[0]       # drop a symbol version
        if name in LINKER_SYMBOLS or name.startswith(TOOL_PREFIXES):
            continue
        syms.add(name)
    return syms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nm", default="nm")
    ap.add_argument("lib")
    ap.add_argument("header")
    a = ap.parse_args()

    declared, bare, unread = header_functions(a.header)
    exported = library_symbols(a.nm, a.lib)
    missing = sorted(declared - exported)
    extra = sorted(exported - declared)

    ok = True
    if not declared:
        print(f"test_exports: FAIL: found no MOEX_API declaration in {a.header}")
        ok = False
    if unread:
        ok = False
        print(f"test_exports: FAIL: {a.header} does not include these headers of its directory: "
              f"{' '.join(os.path.basename(h) for h in unread)}")
    if bare:
        ok = False
        print(f"test_exports: FAIL: {a.header} declares {len(bare)} function(s) without MOEX_API:")
        for n in sorted(bare):
            print(f"    {n}")
    if missing or extra:
        ok = False
        print(f"test_exports: FAIL: {a.lib} and {a.header} differ "
              f"(- declared, not exported; + exported, not declared):")
        for n in missing:
            print(f"-   {n}")
        for n in extra:
            print(f"+   {n}")
    if ok:
        print(f"test_exports: OK: {a.lib} exports exactly the {len(declared)} functions "
              f"{a.header} declares (with the headers it includes)")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
