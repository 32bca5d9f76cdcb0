"""moex_header.py - reads include/moex.h as the compiler does, for the tests that check the
header against the library (tests/test_exports.py) and against the Python binding's structs
(tests/abi/test_abi.py)."""
import os
import re


def read_header(path, seen=None):
    """The header's text with each `#include "name.h"` of a header beside it replaced by that
    header's text, once (a header read before expands to nothing, as its include guard makes
    it): the order the compiler reads them in. `seen` (optional) collects the headers read."""
    seen = set() if seen is None else seen
    path = os.path.realpath(path)
    if path in seen:
        return ""
    seen.add(path)
    out = []
    for line in open(path, encoding="utf-8").read().split("\n"):
        m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
        inc = os.path.join(os.path.dirname(path), m.group(1)) if m else None
        if inc and os.path.exists(inc):
            out.append(read_header(inc, seen))
            line = line[m.end():]      # the rest of the line: a comment may go on below
        out.append(line)
    return "\n".join(out)
