#!/usr/bin/env python3
"""torch_baseline.py - the PyTorch baseline for `moex bench --backend cuda`, on the same
shapes and splits in the same run: torch._grouped_mm (bf16) for the grouped linear forward,
backward-data and backward-weight, and an eager grouped MLP forward+backward (two
_grouped_mm, SwiGLU times probs in f32). Median of CUDA-event timings after warm-up, random
data. Prints one JSON object per line (rates in TFLOP/s), then a table. Usage: python3 bench/torch_baseline.py
[--configs a,b,...] [--iters N] [--ops gemm|other]

--ops other times, instead, the eager PyTorch equivalents of `moex bench --ops other` on the
same shapes (T tokens, H, F, E = G experts, k = 2 when G <= 8 else 8; activations bf16):
glu_fwd/bwd (F.silu(a) * b * p in f32, then bf16; autograd backward), router_fwd/bwd (softmax
in f32, topk, renormalise; autograd backward), permute_fwd/bwd (stable argsort of the expert
ids, index_select, bincount splits, inverse row map; backward index_add), unpermute_fwd/bwd
(index_select and a sum over k; backward a gather), moe_fwd/bwd (the whole layer: router GEMM,
routing, two torch._grouped_mm with the GLU, unpermute; backward to x and the three weights).
Backward times are of torch.autograd.grad on a kept graph (retain_graph), the forward not
included; forward times run with autograd recording, as in training. Prints ms per op.
"""
import argparse
import json

import torch
import torch.nn.functional as F

from configs import select   # tools/bench_configs.h, the one list of benchmark configs

CONFIGS = {c.name: (c.G, c.T, c.K, c.N, c.H, c.F) for c in select("CUDA").values()}  # name: G, T, K, N, H, F


def median_ms(fn, iters, spin_cycles=0):
    """Median ms of fn() by CUDA events after 3 warm-up calls; with spin_cycles, each run is
    behind a GPU spin (torch.cuda._sleep), so that the host enqueues it while the GPU is busy
    and the time is the GPU's."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if spin_cycles:
            torch.cuda._sleep(spin_cycles)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def splits_of(G, T, kind):
    if kind == "balanced":
        s = [T // G] * G
        s[-1] += T - sum(s)
        return s
    g = torch.Generator().manual_seed(1)
    p = torch.distributions.Dirichlet(torch.full((G,), 0.5)).sample()
    s = (p * T).floor().long().tolist()
    s[0] += T - sum(s)
    if G > 2:
        s[1] += s[2]
        s[2] = 0
    return s


def topk_of(G):
    return 2 if G <= 8 else 8


def bench_other(name, iters, dev="cuda"):
    """Times the non-GEMM ops and the whole MoE layer of config `name`; returns rows."""
    G, T, _, _, H, FF = CONFIGS[name]
    E, k = G, topk_of(G)
    bf = torch.bfloat16
    res = {}

    def fwd_bwd(tag, fwd, inputs, grad_out):
        """res[tag_fwd] = ms of fwd(); res[tag_bwd] = ms of the autograd backward of one kept graph."""
        res[tag + "_fwd"] = median_ms(fwd, iters)
        out = fwd()
        res[tag + "_bwd"] = median_ms(lambda: torch.autograd.grad(out, inputs, grad_out, retain_graph=True), iters)
        del out

    # scaled GLU: h [T, 2F] = [a | b], probs [T] f32, z [T, F]
    h = (torch.randn(T, 2 * FF, device=dev) * 2.0).to(bf).requires_grad_()
    p = torch.rand(T, device=dev, requires_grad=True)
    dz = torch.randn(T, FF, device=dev, dtype=bf)

    def glu():
        a, b = h.chunk(2, dim=-1)
        return (F.silu(a.float()) * b.float() * p[:, None]).to(bf)

    fwd_bwd("glu", glu, (h, p), dz)
    del h, p, dz

    # router: logits [T, E] f32 -> probs, ids [T, k]
    logits = (torch.randn(T, E, device=dev) * 3.0).requires_grad_()
    dprobs = torch.randn(T, k, device=dev)

    def router():
        s = torch.softmax(logits, dim=-1)
        v, i = torch.topk(s, k, dim=-1)
        return v / v.sum(dim=-1, keepdim=True), i

    res["router_fwd"] = median_ms(router, iters)
    probs, ids = router()
    res["router_bwd"] = median_ms(
        lambda: torch.autograd.grad(probs, logits, dprobs, retain_graph=True), iters)
    probs, ids = probs.detach(), ids.detach()
    del logits, dprobs

    # permute: x [T, H] -> xp [T*k, H] sorted by expert (stable), probs_p, splits, row_map
    x = torch.randn(T, H, device=dev, dtype=bf)
    flat_ids, flat_probs = ids.reshape(-1), probs.reshape(-1)
    arange_tk = torch.arange(T * k, device=dev)

    def permute():
        order = torch.argsort(flat_ids, stable=True)            # row r <- copy order[r]
        xp = x.index_select(0, order // k)
        probs_p = flat_probs.index_select(0, order)
        splits = torch.bincount(flat_ids, minlength=E)
        row_map = torch.empty_like(order)
        row_map[order] = arange_tk                               # copy t*k+j -> its row
        return xp, probs_p, splits, row_map, order

    res["permute_fwd"] = median_ms(permute, iters)
    _, _, _, row_map, order = permute()
    src_tok = order // k
    dxp = torch.randn(T * k, H, device=dev, dtype=bf)
    dprobs_p = torch.randn(T * k, device=dev)

    def permute_bwd():
        dx = torch.zeros(T, H, device=dev, dtype=bf).index_add_(0, src_tok, dxp)
        dpr = dprobs_p.index_select(0, row_map).view(T, k)
        return dx, dpr

    res["permute_bwd"] = median_ms(permute_bwd, iters)

    # unpermute: y_t = sum_j yp[row_map[t*k + j]]; backward dyp[r] = dy[token of r]
    yp = dxp
    dy = torch.randn(T, H, device=dev, dtype=bf)
    res["unpermute_fwd"] = median_ms(lambda: yp.index_select(0, row_map).view(T, k, H).sum(dim=1), iters)
    res["unpermute_bwd"] = median_ms(lambda: dy.index_select(0, src_tok), iters)
    del yp, dxp, dprobs_p, row_map, order, src_tok

    # the whole MoE layer, backward to x, router_w, w1, w2
    xm = x.requires_grad_()
    wr = (torch.randn(E, H, device=dev) / H ** 0.5).to(bf).requires_grad_()
    w1 = (torch.randn(E, 2 * FF, H, device=dev) / H ** 0.5).to(bf).requires_grad_()
    w2 = (torch.randn(E, H, FF, device=dev) / FF ** 0.5).to(bf).requires_grad_()

    def moe():
        lg = (xm @ wr.t()).float()
        v, i = torch.topk(torch.softmax(lg, dim=-1), k, dim=-1)
        v = v / v.sum(dim=-1, keepdim=True)
        fi = i.reshape(-1)
        order = torch.argsort(fi, stable=True)
        offs = torch.bincount(fi, minlength=E).cumsum(0).to(torch.int32)
        xp = xm.index_select(0, order // k)
        pp = v.reshape(-1).index_select(0, order)
        hh = torch._grouped_mm(xp, w1.transpose(-2, -1), offs=offs)
        a, b = hh.chunk(2, dim=-1)
        z = (F.silu(a.float()) * b.float() * pp[:, None]).to(bf)
        yp = torch._grouped_mm(z, w2.transpose(-2, -1), offs=offs)
        row_map = torch.empty_like(order)
        row_map[order] = torch.arange(T * k, device=dev)
        return yp.index_select(0, row_map).view(T, k, H).sum(dim=1)

    try:
        fwd_bwd("moe", moe, (xm, wr, w1, w2), dy)
    except Exception as ex:  # noqa: BLE001 - report and go on
        res["moe_error"] = str(ex)[:120]
    del xm, wr, w1, w2, dy, x
    torch.cuda.empty_cache()
    return {"config": name, "E": E, "T": T, "H": H, "F": FF, "k": k, "ms": res}


OTHER_OPS = ("glu_fwd", "glu_bwd", "router_fwd", "router_bwd", "permute_fwd", "permute_bwd",
             "unpermute_fwd", "unpermute_bwd", "moe_fwd", "moe_bwd")


def main_other(args):
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    rows = []
    for name in args.configs.split(","):
        r = bench_other(name, args.iters)
        r["ms"] = {op: (round(v, 4) if isinstance(v, float) else v) for op, v in r["ms"].items()}
        print(json.dumps(r), flush=True)
        rows.append(r)
    print("\ntorch other ops, bf16 activations, ms (median)")
    print(f"{'config':<16}{'E':>5}{'T':>7}{'H':>7}{'F':>7}{'k':>4}  {'op':<16}{'ms':>10}")
    for r in rows:
        for j, op in enumerate(OTHER_OPS):
            ms = r["ms"].get(op)
            val = f"{ms:>10.3f}" if isinstance(ms, float) else f"{'FAILED':>10}"
            print(f"{r['config'] if j == 0 else '':<16}{r['E']:>5}{r['T']:>7}{r['H']:>7}{r['F']:>7}{r['k']:>4}  "
                  f"{op:<16}{val}")
        if "moe_error" in r["ms"]:
            print(f"{'':<16}moe: {r['ms']['moe_error']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--ops", choices=("gemm", "other"), default="gemm")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.ops == "other":
        main_other(args)
        return
    dev = "cuda"
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    rows = []
    for name in args.configs.split(","):
        G, T, K, N, H, FF = CONFIGS[name]
        for kind in ("balanced", "skewed"):
            s = splits_of(G, T, kind)
            offs = torch.tensor(s, device=dev, dtype=torch.int32).cumsum(0).to(torch.int32)
            x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
            w = torch.randn(G, N, K, device=dev, dtype=torch.bfloat16) * 0.02
            dy = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
            flops = 2.0 * T * K * N
            r = {"config": name, "splits": kind}
            wt = w.transpose(-2, -1)
            r["fwd"] = flops / median_ms(lambda: torch._grouped_mm(x, wt, offs=offs), args.iters) / 1e9
            r["dgrad"] = flops / median_ms(lambda: torch._grouped_mm(dy, w, offs=offs), args.iters) / 1e9
            try:
                dyt = dy.t()
                r["wgrad"] = flops / median_ms(lambda: torch._grouped_mm(dyt, x, offs=offs), args.iters) / 1e9
            except Exception as ex:  # noqa: BLE001 - report and go on
                r["wgrad_error"] = str(ex)[:120]
            del x, w, dy
            if kind == "balanced":
                xm = torch.randn(T, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
                w1 = (torch.randn(G, 2 * FF, H, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
                w2 = (torch.randn(G, H, FF, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
                probs = torch.rand(T, device=dev, dtype=torch.float32, requires_grad=True)
                dym = torch.randn(T, H, device=dev, dtype=torch.bfloat16)

                def fwd():
                    h = torch._grouped_mm(xm, w1.transpose(-2, -1), offs=offs)
                    a, b = h.chunk(2, dim=-1)
                    z = (F.silu(a.float()) * b.float() * probs[:, None]).to(torch.bfloat16)
                    return torch._grouped_mm(z, w2.transpose(-2, -1), offs=offs)

                def fb():
                    fwd().backward(dym)

                with torch.no_grad():
                    r["mlp_fwd"] = 6.0 * T * H * FF / median_ms(fwd, max(5, args.iters // 2)) / 1e9
                r["mlp_fwdbwd"] = 18.0 * T * H * FF / median_ms(fb, max(5, args.iters // 2)) / 1e9
                del xm, w1, w2, probs, dym
            torch.cuda.empty_cache()
            r = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()}
            print(json.dumps(r), flush=True)
            rows.append(r)
    print("\ntorch._grouped_mm bf16, TFLOP/s (median)")
    print(f"{'config':<16}{'splits':<10}{'fwd':>10}{'dgrad':>10}{'wgrad':>10}{'mlp f':>10}{'mlp f+b':>10}")
    for r in rows:
        print(f"{r['config']:<16}{r['splits']:<10}{r.get('fwd', 0):>10.0f}{r.get('dgrad', 0):>10.0f}"
              f"{r.get('wgrad', 0):>10.0f}{r.get('mlp_fwd', 0):>10.0f}{r.get('mlp_fwdbwd', 0):>10.0f}")


if __name__ == "__main__":
    main()
