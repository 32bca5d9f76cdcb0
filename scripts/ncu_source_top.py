#!/usr/bin/env python3
"""ncu_source_top.py - the SASS instructions where a kernel's warps stall most, from Nsight
Compute's source page (`ncu --import REP --page source --print-source sass --csv`): the
instructions that hold the most warp-stall samples, each with its three largest stall
reasons, and the kernel's samples summed by reason.
Usage: ncu_source_top.py SOURCE.csv [ROWS]   (default 30 rows)."""
import csv
import sys


def number(s):
    try:
        return float(s.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def main():
    path, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(path, newline="") as f:
        table = [r for r in csv.reader(f) if r]
    head_at = next((i for i, r in enumerate(table) if any("Source" == c.strip() for c in r)), None)
    if head_at is None:
        print(f"{path}: no 'Source' column; first lines: {table[:3]}")
        return
    head, body = table[head_at], table[head_at + 1:]
    src = head.index("Source")
    total = next((i for i, c in enumerate(head) if "Sampling (All" in c), None)
    if total is None:
        print(f"{path}: no stall-sampling column; columns: {head}")
        return
    def is_reason(c):   # a reason's all-samples column (not its "(Not Issued)" twin, not the totals)
        c = c.lower()
        return "stall" in c and "not issued" not in c and "not-issued" not in c and "sampling (" not in c

    reasons = [i for i, c in enumerate(head) if i != total and is_reason(c)]
    all_samples = sum(number(r[total]) for r in body if len(r) > total)
    print(f"{path}: {len(body)} instructions, {all_samples:.0f} stall samples")
    sums = sorted(((sum(number(r[i]) for r in body if len(r) > i), head[i]) for i in reasons), reverse=True)
    print("by reason: " + ", ".join(f"{n} {v / max(all_samples, 1):.1%}" for v, n in sums[:10] if v > 0))
    top = sorted((r for r in body if len(r) > total), key=lambda r: number(r[total]), reverse=True)[:rows]
    for r in top:
        big = sorted(((number(r[i]), head[i]) for i in reasons), reverse=True)[:3]
        why = ", ".join(f"{n} {v:.0f}" for v, n in big if v > 0)
        addr = r[0] if r[0] != r[src] else ""
        print(f"{number(r[total]) / max(all_samples, 1):6.1%}  {addr:>8}  {r[src].strip()[:70]:<70}  {why}")


if __name__ == "__main__":
    main()
