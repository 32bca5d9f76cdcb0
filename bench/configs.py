#!/usr/bin/env python3
"""configs.py - the benchmark configurations of tools/bench_configs.h, for the Python benchmarks.

tools/bench_configs.h is the one list: `moex bench` compiles it in, and this module parses its
X(name, G, T, K, N, H, F, splits, set, what) rows, so that bench/gemm_bench.py,
bench/torch_baseline.py and bench/torch_grouped_mm.py time the same shapes as the CLI.

    from configs import select
    select("CUDA")            # {name: Config} of the CUDA set, in the header's order
    select("CUDA", "STUDY")   # the CUDA set and the kernel-study shapes

A Config has the fields name, G, T, K, N (the grouped linear), H, F (the grouped MLP), splits
("balanced" or "skewed"), set ("CPU", "CUDA" or "STUDY") and what. A row this parser cannot
read raises ValueError naming it (keep one X(...) per line, literals only).

    python3 bench/configs.py                       # the list
    python3 bench/configs.py --check build/moex    # the same CPU and CUDA sets as `moex bench --help`?
"""
import collections
import os
import re
import subprocess
import sys

HEADER = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "bench_configs.h"))
SETS = ("CPU", "CUDA", "STUDY")

Config = collections.namedtuple("Config", "name G T K N H F splits set what")

_INT = r"\s*(\d+)\s*,"
_ROW = re.compile(r'X\(\s*"([^"]+)"\s*,' + _INT * 6 + r"\s*(BALANCED|SKEWED)\s*,\s*(" + "|".join(SETS) +
                  r')\s*,\s*"([^"]*)"\s*\)')


def _parse(path=HEADER):
    """The rows of MOEX_BENCH_CONFIGS in `path`, in order."""
    with open(path) as f:
        lines = f.read().split("\n")
    start = next((i for i, l in enumerate(lines) if l.startswith("#define MOEX_BENCH_CONFIGS(X)")), None)
    if start is None:
        raise ValueError(f"{path}: no '#define MOEX_BENCH_CONFIGS(X)'")
    rows = []
    for line in lines[start + 1:]:
        body = re.sub(r"/\*.*?\*/", "", line).rstrip()
        cont = body.endswith("\\")
        body = body.rstrip("\\").strip()
        if body:
            m = _ROW.fullmatch(body)
            if not m:
                raise ValueError(f"{path}: cannot read the config row '{body}'")
            g = m.groups()
            rows.append(Config(g[0], *(int(v) for v in g[1:7]), g[7].lower(), g[8], g[9]))
        if not cont:
            break
    names = [c.name for c in rows]
    dup = sorted({n for n in names if names.count(n) > 1})
    if not rows or dup:
        raise ValueError(f"{path}: " + (f"config names repeated: {', '.join(dup)}" if dup else "no config rows"))
    return rows


ALL = _parse()


def select(*sets):
    """{name: Config} of the rows whose set is one of `sets`, in the header's order."""
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        raise ValueError(f"unknown config set {', '.join(unknown)} (known: {', '.join(SETS)})")
    return {c.name: c for c in ALL if c.set in sets}


def check_cli(moex):
    """0 when `moex bench --help` lists exactly the CPU and CUDA sets with these sizes."""
    text = subprocess.run([moex, "bench", "--help"], capture_output=True, text=True, check=True).stdout
    pat = re.compile(r"  (\S+) +G=(\d+) +T=(\d+) +K=(\d+) +N=(\d+) +H=(\d+) +F=(\d+) +(.*?)( \[cuda\])?")
    got = [m.groups() for m in map(pat.fullmatch, text.split("\n")) if m]
    want = [(c.name, *map(str, (c.G, c.T, c.K, c.N, c.H, c.F)), c.what, " [cuda]" if c.set == "CUDA" else None)
            for c in select("CPU", "CUDA").values()]
    for g, w in zip(got + [None] * len(want), want + [None] * len(got)):
        if g != w:
            print(f"configs.py --check: {moex} lists {g}, {HEADER} has {w}")
            return 1
    print(f"configs.py --check: {moex} bench --help lists the {len(want)} CPU and CUDA configs of {HEADER}")
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--check":
        return check_cli(argv[2])
    if len(argv) != 1:
        print(__doc__)
        return 2
    print(f"{'name':<14} {'G':>4} {'T':>6} {'K':>6} {'N':>6} {'H':>6} {'F':>6} {'splits':<9} {'set':<6} what")
    for c in ALL:
        print(f"{c.name:<14} {c.G:>4} {c.T:>6} {c.K:>6} {c.N:>6} {c.H:>6} {c.F:>6} {c.splits:<9} {c.set:<6} {c.what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
