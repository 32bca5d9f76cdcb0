#!/usr/bin/env python3
"""quant_bench.py - moex_group_quantize on the GPU: GB/s of each recipe writing both
orientations of a [T, K] bf16 tensor (bytes read + written: x, the two FP8 copies and their
scales), against the copy bandwidth measured in the same run (a torch copy of x) and against
PyTorch written the way a user would (amax, scale, cast, transpose; when T and K are
multiples of 128), on the same input.

Timing: CUDA events around each call, median of ITERS after a warm-up, the functions
interleaved. Correctness: every moex result is checked against the CPU library's bytes on
a slice (the CPU is tested bit for bit against the fp64 reference).

Usage (GPU machine): PYTHONPATH=python MOEX_LIBRARY=build/libmoex.so python3 bench/quant_bench.py [T K G]
"""
import statistics
import sys

import torch

from moex import _capi
import moex.torch as mt

ITERS = 20
RECIPES = {"tensor": 0, "group": 1, "block": 2, "mxfp8": 3}


def quant_args(x, splits, recipe, G):
    """The args and the outputs of a both-orientation quantize of x."""
    T, K = x.shape
    B = {2: 128, 3: 32}.get(recipe, 0)
    sdt = torch.float8_e8m0fnu if recipe == 3 else torch.float32
    if B:
        rs, cs = (T, -(-K // B)), (K, -(-T // B) + G)
    else:
        rs = cs = (G if recipe == 1 else 1,)
    out = dict(rd=torch.empty(T, K, dtype=torch.float8_e4m3fn, device=x.device),
               cd=torch.empty(K, T, dtype=torch.float8_e4m3fn, device=x.device),
               rs=torch.empty(rs, dtype=sdt, device=x.device), cs=torch.empty(cs, dtype=sdt, device=x.device))
    keep = (x, splits)   # the args hold raw pointers: the inputs must outlive them
    a = _capi.GroupQuantizeArgs()
    mt._fill(a.x, x)
    mt._fill(a.splits, splits)
    a.params = _capi.QuantParams(recipe, _capi.DTYPE_E4M3, 0.0, 0)
    for dst, t in ((a.rowwise.data, out["rd"]), (a.rowwise.scales, out["rs"]), (a.columnwise.data, out["cd"]),
                   (a.columnwise.scales, out["cs"])):
        mt._fill(dst, t)
    a.keep = keep
    return a, out


def moex_fn(x, splits, recipe, G):
    a, out = quant_args(x, splits, recipe, G)
    dev = x.device
    mt._run("group_quantize", a, dev)   # checks the call, sizes the workspace once

    def run():
        mt._run("group_quantize", a, dev)
    return run, out


def torch_fn(x, recipe):
    """What a PyTorch user writes for the same copies (E4M3, 448)."""
    T, K = x.shape
    f8 = torch.float8_e4m3fn

    def current():
        s = 448.0 / x.abs().amax().float().clamp_min(1e-12)
        q = (x.float() * s).to(f8)
        return q, q.t().contiguous(), 1.0 / s

    def blocks(B):
        xf = x.float()
        rs = 448.0 / xf.view(T, K // B, B).abs().amax(-1, keepdim=True).clamp_min(1e-12)
        q = (xf.view(T, K // B, B) * rs).to(f8).view(T, K)
        xt = xf.t().contiguous()
        cs = 448.0 / xt.view(K, T // B, B).abs().amax(-1, keepdim=True).clamp_min(1e-12)
        qt = (xt.view(K, T // B, B) * cs).to(f8).view(K, T)
        return q, qt, rs, cs
    return current if recipe in (0, 1) else (lambda: blocks(128 if recipe == 2 else 32))


def time_ms(fns):
    ev = {n: [] for n in fns}
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    for _ in range(ITERS):
        for n, f in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            torch.cuda.synchronize()
            ev[n].append(a.elapsed_time(b))
    return {n: statistics.median(v) for n, v in ev.items()}


def main():
    T, K, G = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (32768, 7168, 8)
    torch.manual_seed(0)
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    splits = torch.full((G,), T // G, dtype=torch.int64, device="cuda")
    splits[-1] += T - int(splits.sum())
    copy_dst = torch.empty_like(x)
    print(f"quantize [{T}, {K}] bf16 -> e4m3 rowwise + columnwise, G={G}, {torch.cuda.get_device_name()}")
    rows = []
    base = time_ms({"copy": lambda: copy_dst.copy_(x)})["copy"]
    copy_gbs = 2 * x.numel() * 2 / base / 1e6
    for name, r in RECIPES.items():
        run, out = moex_fn(x, splits, r, G)
        fns = {"moex": run, "torch": torch_fn(x, r)} if T % 128 == 0 and K % 128 == 0 else {"moex": run}
        ms = time_ms(fns)
        nbytes = x.numel() * 2 + out["rd"].numel() + out["cd"].numel() + \
            (out["rs"].numel() + out["cs"].numel()) * out["rs"].element_size()
        gbs = nbytes / ms["moex"] / 1e6
        ok = check(x, splits, r, G, out)
        tms = ms.get("torch", float("nan"))
        rows.append((name, ms["moex"], gbs, gbs / copy_gbs, tms, tms / ms["moex"], ok))
    print(f"copy: {base:.3f} ms, {copy_gbs:.0f} GB/s (read + write)")
    print(f"{'recipe':8s} {'moex ms':>8s} {'GB/s':>7s} {'of copy':>8s} {'torch ms':>9s} {'speedup':>8s}  check")
    for name, ms, gbs, frac, tms, sp, ok in rows:
        print(f"{name:8s} {ms:8.3f} {gbs:7.0f} {frac:8.2f} {tms:9.3f} {sp:7.2f}x  {ok}")


def check(x, splits, recipe, G, out):
    """Whether the GPU gives the CPU's bytes (every output) for a quantize of the first 300
    rows as one group."""
    n = min(300, x.shape[0])
    xs = x[:n].contiguous()
    sp = torch.tensor([n], dtype=torch.int64)
    a_cpu, o_cpu = quant_args(xs.cpu(), sp, recipe, 1)
    mt._run("group_quantize", a_cpu, torch.device("cpu"))
    a_gpu, o_gpu = quant_args(xs, sp.cuda(), recipe, 1)
    mt._run("group_quantize", a_gpu, x.device)
    torch.cuda.synchronize()
    B = {2: 128, 3: 32}.get(recipe, 0)
    if B:   # the columnwise scale columns past the tiles used are not written
        o_cpu["cs"], o_gpu["cs"] = o_cpu["cs"][:, :-(-n // B)], o_gpu["cs"][:, :-(-n // B)]
    bad = [k for k in o_cpu if not torch.equal(o_cpu[k].view(torch.uint8), o_gpu[k].cpu().view(torch.uint8))]
    return "bitwise" if not bad else "MISMATCH " + ",".join(bad)


if __name__ == "__main__":
    main()
