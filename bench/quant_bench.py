#!/usr/bin/env python3
"""quant_bench.py - moex_group_quantize on the GPU: GB/s of each recipe writing both
orientations of a [T, K] bf16 tensor (bytes read + written: x, the two FP8 copies and their
scales), against the copy bandwidth measured in the same run (a torch copy of x) and against
PyTorch written the way a user would (amax, scale, cast, transpose; when T and K are
multiples of 128), on the same input.

Timing: CUDA events around each call, median of ITERS after a warm-up, the functions
interleaved. Correctness: every moex result is checked against the CPU library's bytes on
a slice (the CPU is tested bit for bit against the fp64 reference).

Weights: moex_weight_quantize of DeepSeek-V3's expert weights on one of 8 expert-parallel
ranks (32 experts: FC1 [32, 4096, 7168], FC2 [32, 7168, 2048]), both copies, GB/s against the
copy of the same tensor, and against PyTorch's casts per expert (amax, scale, cast,
transpose).

The scaled GLU's FP8 z (docs/ops.md 9.9): moex_scaled_glu_forward with zq outputs and no z
(one fused pass from h) against the GLU writing z and then moex_group_quantize of it.

Usage (GPU machine): PYTHONPATH=python MOEX_LIBRARY=build/libmoex.so python3 bench/quant_bench.py [T K G]
"""
import ctypes
import statistics
import sys

import torch

from moex import _capi
from moex.torch._operators import _fill, _run

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
    _fill(a.x, x)
    _fill(a.splits, splits)
    a.params = _capi.QuantParams(recipe, _capi.DTYPE_E4M3, 0.0, 0, 0)
    for dst, t in ((a.rowwise.data, out["rd"]), (a.rowwise.scales, out["rs"]), (a.columnwise.data, out["cd"]),
                   (a.columnwise.scales, out["cs"])):
        _fill(dst, t)
    a.keep = keep
    return a, out


def moex_fn(x, splits, recipe, G):
    a, out = quant_args(x, splits, recipe, G)
    dev = x.device
    _run("group_quantize", a, dev)   # checks the call, sizes the workspace once

    def run():
        _run("group_quantize", a, dev)
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


WEIGHT_SHAPES = {"dsv3 fc1": (32, 4096, 7168), "dsv3 fc2": (32, 7168, 2048)}
WEIGHT_RECIPES = {"group": 1, "block": 2, "mxfp8": 3}


def weight_args(w, recipe):
    """The args and outputs of a both-copy weight quantize of w [G, N, K]."""
    G, N, K = w.shape
    sdt = torch.float8_e8m0fnu if recipe == 3 else torch.float32
    if recipe == 1:
        rs = cs = (G,)
    elif recipe == 2:
        rs, cs = (G, -(-N // 128), -(-K // 128)), (G, -(-K // 128), -(-N // 128))
    else:
        rs, cs = (G, N, -(-K // 32)), (G, K, -(-N // 32))
    out = dict(rd=torch.empty(G, N, K, dtype=torch.float8_e4m3fn, device=w.device),
               cd=torch.empty(G, K, N, dtype=torch.float8_e4m3fn, device=w.device),
               rs=torch.empty(rs, dtype=sdt, device=w.device), cs=torch.empty(cs, dtype=sdt, device=w.device))
    a = _capi.WeightQuantizeArgs()
    _fill(a.w, w)
    a.params = _capi.QuantParams(recipe, _capi.DTYPE_E4M3, 0.0, 0, 0)
    for dst, t in ((a.rowwise.data, out["rd"]), (a.rowwise.scales, out["rs"]), (a.columnwise.data, out["cd"]),
                   (a.columnwise.scales, out["cs"])):
        _fill(dst, t)
    a.keep = (w,)
    return a, out


def torch_weight_fn(w, recipe):
    """PyTorch per expert: the same copies (E4M3, 448)."""
    G, N, K = w.shape
    f8 = torch.float8_e4m3fn

    def group():
        wf = w.float()
        s = 448.0 / wf.abs().amax(dim=(1, 2), keepdim=True).clamp_min(1e-12)
        q = (wf * s).to(f8)
        return q, q.transpose(1, 2).contiguous(), 1.0 / s

    def block():
        wf = w.float().view(G, N // 128, 128, K // 128, 128)
        s = 448.0 / wf.abs().amax(dim=(2, 4), keepdim=True).clamp_min(1e-12)
        q = (wf * s).to(f8).view(G, N, K)
        return q, q.transpose(1, 2).contiguous(), 1.0 / s

    def mx():
        def one(v):
            r, c = v.shape[1], v.shape[2]
            vf = v.float().view(G, r, c // 32, 32)
            e = torch.floor(torch.log2(vf.abs().amax(-1, keepdim=True).clamp_min(2.0 ** -126))) - 8
            return (vf * torch.exp2(-e)).to(f8).view(G, r, c), e
        return one(w), one(w.transpose(1, 2).contiguous())
    return {1: group, 2: block, 3: mx}[recipe]


def weights():
    print(f"\nweight quantize, bf16 -> e4m3 both copies, {torch.cuda.get_device_name()}")
    print(f"{'shape':9s} {'recipe':7s} {'copy ms':>8s} {'moex ms':>8s} {'GB/s':>7s} {'of copy':>8s} {'torch ms':>9s} "
          f"{'speedup':>8s}  check")
    for name, (G, N, K) in WEIGHT_SHAPES.items():
        w = torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(w)
        base = time_ms({"copy": lambda: dst.copy_(w)})["copy"]
        copy_gbs = 2 * w.numel() * 2 / base / 1e6
        for rname, r in WEIGHT_RECIPES.items():
            a, out = weight_args(w, r)
            _run("weight_quantize", a, w.device)
            ms = time_ms({"moex": lambda: _run("weight_quantize", a, w.device), "torch": torch_weight_fn(w, r)})
            nbytes = w.numel() * 2 + out["rd"].numel() + out["cd"].numel() + \
                (out["rs"].numel() + out["cs"].numel()) * out["rs"].element_size()
            gbs = nbytes / ms["moex"] / 1e6
            ws = w[:2, :256].contiguous()   # the GPU's bytes against the CPU's on a slice
            a_c, o_c = weight_args(ws.cpu(), r)
            _run("weight_quantize", a_c, torch.device("cpu"))
            a_g, o_g = weight_args(ws, r)
            _run("weight_quantize", a_g, w.device)
            torch.cuda.synchronize()
            bad = [k for k in o_c if not torch.equal(o_c[k].view(torch.uint8), o_g[k].cpu().view(torch.uint8))]
            ok = "bitwise" if not bad else "MISMATCH " + ",".join(bad)
            print(f"{name:9s} {rname:7s} {base:8.3f} {ms['moex']:8.3f} {gbs:7.0f} {gbs / copy_gbs:8.2f} "
                  f"{ms['torch']:9.3f} {ms['torch'] / ms['moex']:7.2f}x  {ok}")
        del w, dst


def glu_fused():
    T, F, G = 32768, 2048, 8   # dsv3's expert FC1 output, h [T, 2F]
    h = torch.randn(T, 2 * F, device="cuda", dtype=torch.bfloat16)
    splits = torch.full((G,), T // G, dtype=torch.int64, device="cuda")
    z = torch.empty(T, F, device="cuda", dtype=torch.bfloat16)
    print(f"\nscaled GLU with FP8 z, h [{T}, {2 * F}] bf16, both copies, {torch.cuda.get_device_name()}")
    print(f"{'recipe':8s} {'fused ms':>9s} {'glu+quantize ms':>16s} {'speedup':>8s}  check")
    for name, r in RECIPES.items():
        qa, out = quant_args(z, splits, r, G)   # quantize of z: the two-call path
        fused_out = {k: torch.empty_like(v) for k, v in out.items()}
        g = _capi.ScaledGluArgs()
        _fill(g.h, h), _fill(g.splits, splits)
        g.glu = _capi.GluParams(0, 0, 7.0, 1.702, 1.0)
        plain = _capi.ScaledGluArgs()
        ctypes.pointer(plain)[0] = g
        _fill(plain.z, z)
        g.zq_params = _capi.QuantParams(r, _capi.DTYPE_E4M3, 0.0, 0, 0)
        for dst, k in ((g.zq_rowwise.data, "rd"), (g.zq_rowwise.scales, "rs"), (g.zq_columnwise.data, "cd"),
                       (g.zq_columnwise.scales, "cs")):
            _fill(dst, fused_out[k])
        g.keep = (h, splits, z, fused_out)

        def two():
            _run("scaled_glu_forward", plain, h.device)
            _run("group_quantize", qa, h.device)

        def fused():
            _run("scaled_glu_forward", g, h.device)
        ms = time_ms({"fused": fused, "two": two})
        B = {2: 128, 3: 32}.get(r, 0)
        if B:   # the columnwise scale columns past the groups' tiles are not written
            bG = sum(-(-int(m) // B) for m in splits.tolist())
            out["cs"], fused_out["cs"] = out["cs"][:, :bG], fused_out["cs"][:, :bG]
        ok = all(torch.equal(fused_out[k].view(torch.uint8), out[k].view(torch.uint8)) for k in out)
        print(f"{name:8s} {ms['fused']:9.3f} {ms['two']:16.3f} {ms['two'] / ms['fused']:7.2f}x  "
              f"{'bitwise' if ok else 'MISMATCH'}")


def check(x, splits, recipe, G, out):
    """Whether the GPU gives the CPU's bytes (every output) for a quantize of the first 300
    rows as one group."""
    n = min(300, x.shape[0])
    xs = x[:n].contiguous()
    sp = torch.tensor([n], dtype=torch.int64)
    a_cpu, o_cpu = quant_args(xs.cpu(), sp, recipe, 1)
    _run("group_quantize", a_cpu, torch.device("cpu"))
    a_gpu, o_gpu = quant_args(xs, sp.cuda(), recipe, 1)
    _run("group_quantize", a_gpu, x.device)
    torch.cuda.synchronize()
    B = {2: 128, 3: 32}.get(recipe, 0)
    if B:   # the columnwise scale columns past the tiles used are not written
        o_cpu["cs"], o_gpu["cs"] = o_cpu["cs"][:, :-(-n // B)], o_gpu["cs"][:, :-(-n // B)]
    bad = [k for k in o_cpu if not torch.equal(o_cpu[k].view(torch.uint8), o_gpu[k].cpu().view(torch.uint8))]
    return "bitwise" if not bad else "MISMATCH " + ",".join(bad)


if __name__ == "__main__":
    main()
    weights()
    glu_fused()
