#!/usr/bin/env python3
"""fp8_bench.py - the FP8 grouped linear forward on the GPU (moex_grouped_linear_fp8_forward,
docs/ops.md 9.10) against moex's bf16 forward, torch._scaled_grouped_mm (rowwise scales) and
dense torch._scaled_mm of the same total size (the ceiling), on the CUDA configs of
tools/bench_configs.h, balanced and skewed.

moex's operands: x and the weights quantized by moex_group_quantize / moex_weight_quantize
(E4M3), once, per group and expert (GROUP) and per 1x128 / 128x128 block (BLOCK); the timed
call is the GEMM alone (on Hopper the FP8 kernel of sm90_fp8_gemm.cu). torch: x E4M3 with one
f32 scale per row, W E4M3 with one per output column of each expert, with its default
accumulation and with use_fast_accum (no promotion out of the tensor cores' FP8
accumulation). TFLOP/s = 2 T K N / time, median of --iters CUDA event timings, each behind a
GPU spin. The err columns: the relative error (Frobenius) of each FP8 y against moex's bf16
product.

Usage (GPU machine): PYTHONPATH=python:bench MOEX_LIBRARY=build/libmoex.so \\
    python3 bench/fp8_bench.py [--configs dsv3-fc1,...] [--splits balanced,skewed] [--iters N]
    [--product forward|dgrad|wgrad]
--product wgrad times dW += dy^T x: moex's FP8 call on the columnwise copies of dy and x (GROUP and
BLOCK), moex's bf16 backward weight, both into an f32 main grad, and dense FP8 of the same size.
--product dgrad times dx = dy W: moex's FP8 call on dy's rowwise copy and the weights' columnwise
copy (quantized here as W^T [G, K, N], the same codes and scales), moex's bf16 backward data,
torch._scaled_grouped_mm on dy and W.
"""
import argparse
import json

import torch

from moex import _capi
from moex.torch._linear import _backward_data, _backward_weight, _backward_weight_accumulate, _forward
from moex.torch._operators import _fill, _run
from configs import select
from torch_baseline import median_ms, splits_of

SPIN = 2_000_000
E4M3 = torch.float8_e4m3fn


def quantized(x, splits, w, recipe):
    """moex's quantization of x (rowwise) and w (rowwise copy) by `recipe` (1 GROUP, 2 BLOCK,
    3 MXFP8), and the forward's args."""
    T, K = x.shape
    G, N, _ = w.shape
    kb, nb = -(-K // 128), -(-N // 128)
    xs, ws = {1: ((G,), (G,)), 2: ((T, kb), (G, nb, kb)), 3: ((T, -(-K // 32)), (G, N, -(-K // 32)))}[recipe]
    sdt = torch.float8_e8m0fnu if recipe == 3 else torch.float32
    out = dict(xd=torch.empty(T, K, dtype=E4M3, device=x.device), xs=torch.empty(xs, dtype=sdt, device=x.device),
               wd=torch.empty(G, N, K, dtype=E4M3, device=x.device), ws=torch.empty(ws, dtype=sdt, device=x.device),
               y=torch.empty(T, N, dtype=torch.bfloat16, device=x.device))
    params = _capi.QuantParams(recipe, _capi.DTYPE_E4M3, 0.0, 0, 0)
    q = _capi.GroupQuantizeArgs()
    _fill(q.x, x), _fill(q.splits, splits)
    q.params = params
    _fill(q.rowwise.data, out["xd"]), _fill(q.rowwise.scales, out["xs"])
    _run("group_quantize", q, x.device)
    wq = _capi.WeightQuantizeArgs()
    _fill(wq.w, w)
    wq.params = params
    _fill(wq.rowwise.data, out["wd"]), _fill(wq.rowwise.scales, out["ws"])
    _run("weight_quantize", wq, x.device)
    a = _capi.GroupedLinearFp8Args()
    a.x_params = a.w_params = params
    _fill(a.x.data, out["xd"]), _fill(a.x.scales, out["xs"])
    _fill(a.w.data, out["wd"]), _fill(a.w.scales, out["ws"])
    _fill(a.splits, splits), _fill(a.y, out["y"])
    a.keep = (x, splits, w)
    return a, out


def quantized_wgrad(x, dy, splits, recipe):
    """moex's columnwise copies of dy [T, N] and x [T, K] by `recipe` (1 GROUP, 2 BLOCK; E4M3)
    and the backward weight's args, accumulating into an f32 main grad [G, N, K]."""
    T, K = x.shape
    N, G = dy.shape[1], splits.shape[0]
    ld = -(-T // 128) + G
    params = _capi.QuantParams(recipe, _capi.DTYPE_E4M3, 0.0, 0, 0)
    keep = [x, dy, splits]

    def columnwise(t):
        d = torch.empty(t.shape[1], T, dtype=E4M3, device=t.device)
        sc = torch.empty((t.shape[1], ld) if recipe == 2 else (G,), device=t.device)
        q = _capi.GroupQuantizeArgs()
        _fill(q.x, t), _fill(q.splits, splits)
        q.params = params
        _fill(q.columnwise.data, d), _fill(q.columnwise.scales, sc)
        _run("group_quantize", q, t.device)
        keep.extend((d, sc))
        return d, sc

    dw = torch.zeros(G, N, K, device=x.device)
    a = _capi.GroupedLinearFp8WgradArgs()
    a.dy_params = a.x_params = params
    (dd, ds), (xd, xs) = columnwise(dy), columnwise(x)
    _fill(a.dy.data, dd), _fill(a.dy.scales, ds), _fill(a.x.data, xd), _fill(a.x.scales, xs)
    _fill(a.splits, splits), _fill(a.dw.t, dw)
    a.dw_mode = _capi.GRAD_ACCUMULATE
    a.keep = keep
    return a, dw


def torch_kgrouped(dy, x, offs):
    """torch._scaled_grouped_mm's K-grouped form (2-D by 2-D, the groups along T): dy^T [N, T]
    E4M3 row-major, x [T, K] E4M3 column-major, one scale per output row / column of each group
    (all 1: timing only), bf16 out; None when this torch lacks it or refuses it. It needs every
    group's rows to be a multiple of 16 (the caller checks)."""
    if not hasattr(torch, "_scaled_grouped_mm"):
        return None
    G = offs.shape[0]
    a = dy.t().contiguous().to(E4M3)              # [N, T]
    b = x.t().contiguous().to(E4M3).t()           # [T, K], column-major
    sa = torch.ones(G * a.shape[0], device=dy.device)
    sb = torch.ones(G * b.shape[1], device=dy.device)
    try:
        def run():
            return torch._scaled_grouped_mm(a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16)
        run()
        return run
    except (RuntimeError, TypeError, ValueError):
        return None


def wgrad_row(name, kind, G, T, K, N, splits, iters, dev):
    """The weight gradient dW_g += dy_g^T x_g: moex FP8 (GROUP, BLOCK) and bf16, torch's K-grouped
    FP8 call where it runs (bf16 out, no main grad), dense FP8."""
    x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
    flops = 2.0 * T * K * N
    a, dw = quantized_wgrad(x, dy, splits, 1)
    ab, dwb = quantized_wgrad(x, dy, splits, 2)
    main = torch.zeros(G, N, K, device=dev)
    fns = {"moex_fp8": lambda: _run("grouped_linear_fp8_backward_weight", a, dev),
           "moex_block": lambda: _run("grouped_linear_fp8_backward_weight", ab, dev),
           "moex_bf16": lambda: _backward_weight_accumulate(x, dy, splits, main),
           "dense_fp8": dense_fp8(N, T, K, dev)}
    # torch's K-grouped call asserts on the device unless every group's rows are a multiple of 16
    tk = torch_kgrouped(dy, x, splits.cumsum(0).to(torch.int32)) if bool((splits % 16 == 0).all()) else None
    if tk is not None:
        fns["torch_fp8"] = tk
    r = {"config": name, "splits": kind}
    for k, fn in fns.items():
        r[k] = round(flops / median_ms(fn, iters, SPIN) / 1e9, 1)
    ref = _backward_weight(x, dy, splits, _capi.DTYPE_F32)
    for key, args, out in (("err_moex_fp8", a, dw), ("err_moex_block", ab, dwb)):
        out.zero_()
        _run("grouped_linear_fp8_backward_weight", args, dev)
        r[key] = round(((out - ref).norm() / ref.norm()).item(), 4)
    return r


def torch_rowwise(x, w, offs, fast):
    """torch._scaled_grouped_mm's operands: x E4M3 with row scales, W^T column-major with
    column scales, and the call; None when this torch lacks it or refuses the shapes."""
    if not hasattr(torch, "_scaled_grouped_mm"):
        return None
    xa = x.float().abs().amax(dim=1).clamp_min(1e-12)
    sx = (xa / 448.0).float()
    xq = (x.float() / sx[:, None]).to(E4M3)
    wa = w.float().abs().amax(dim=2).clamp_min(1e-12)   # [G, N]
    sw = (wa / 448.0).float()
    wq = (w.float() / sw[:, :, None]).to(E4M3)          # [G, N, K]
    wt = wq.transpose(-2, -1)                           # [G, K, N], column-major
    try:
        def run():
            return torch._scaled_grouped_mm(xq, wt, sx, sw, offs=offs, out_dtype=torch.bfloat16,
                                            use_fast_accum=fast)
        run()
        return run
    except (RuntimeError, TypeError):
        return None


def dense_fp8(T, K, N, dev):
    a = torch.randn(T, K, device=dev).to(E4M3)
    b = torch.randn(N, K, device=dev).to(E4M3).t()
    one = torch.ones((), device=dev)
    return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=",".join(select("CUDA")))
    ap.add_argument("--splits", default="balanced,skewed")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--product", choices=("forward", "dgrad", "wgrad"), default="forward")
    args = ap.parse_args()
    dgrad = args.product == "dgrad"
    configs = select("CUDA")
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    rows = []
    for name in args.configs.split(","):
        c = configs[name]
        G, T, K, N = c.G, c.T, c.K, c.N
        flops = 2.0 * T * K * N
        dense = dense_fp8(T, N, K, dev) if dgrad else dense_fp8(T, K, N, dev) if args.product == "forward" else None
        for kind in args.splits.split(","):
            s = splits_of(G, T, kind)
            splits = torch.tensor(s, device=dev, dtype=torch.int64)
            if args.product == "wgrad":
                r = wgrad_row(name, kind, G, T, K, N, splits, args.iters, dev)
                rows.append(r)
                print(json.dumps(r), flush=True)
                continue
            offs = splits.cumsum(0).to(torch.int32)
            w = (torch.randn(G, N, K, device=dev, dtype=torch.bfloat16) / K ** 0.5)
            if dgrad:   # dx = dy W: the forward's product of dy [T, N] and W^T [G, K, N]
                x = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
                wp = w.transpose(1, 2).contiguous()

                def bf16():
                    return _backward_data(x, w, splits, None, None, _capi.BIAS_NONE, True, False, False)[0]
            else:
                x, wp = torch.randn(T, K, device=dev, dtype=torch.bfloat16), w

                def bf16():
                    return _forward(x, w, splits, None, None, _capi.BIAS_NONE)
            a, out = quantized(x, splits, wp, 1)
            ab, outb = quantized(x, splits, wp, 2)
            am, outm = quantized(x, splits, wp, 3)
            fns = {"moex_fp8": lambda: _run("grouped_linear_fp8_forward", a, dev),
                   "moex_block": lambda: _run("grouped_linear_fp8_forward", ab, dev),
                   "moex_mx": lambda: _run("grouped_linear_fp8_forward", am, dev),
                   "moex_bf16": bf16, "dense_fp8": dense}
            tr = torch_rowwise(x, wp, offs, False)
            if tr is not None:
                fns["torch_fp8"] = tr
            trf = torch_rowwise(x, wp, offs, True)
            if trf is not None:
                fns["torch_fp8_fast"] = trf
            r = {"config": name, "splits": kind}
            for k, fn in fns.items():
                r[k] = round(flops / median_ms(fn, args.iters, SPIN) / 1e9, 1)
            ref = bf16().float()
            fns["moex_fp8"]()
            fns["moex_block"]()
            r["err_moex_fp8"] = round(((out["y"].float() - ref).norm() / ref.norm()).item(), 4)
            r["err_moex_block"] = round(((outb["y"].float() - ref).norm() / ref.norm()).item(), 4)
            fns["moex_mx"]()
            r["err_moex_mx"] = round(((outm["y"].float() - ref).norm() / ref.norm()).item(), 4)
            if tr is not None:
                r["err_torch_fp8"] = round(((tr().float() - ref).norm() / ref.norm()).item(), 4)
            r["vs_torch"] = round(r["moex_fp8"] / r["torch_fp8"], 3) if "torch_fp8" in r else None
            r["block_vs_torch"] = round(r["moex_block"] / r["torch_fp8"], 3) if "torch_fp8" in r else None
            rows.append(r)
            print(json.dumps(r), flush=True)
    if args.product == "wgrad":
        print("\nFP8 grouped weight gradient dW += dy^T x (E4M3 columnwise copies, f32 main grad), TFLOP/s (median): "
              "moex GROUP and BLOCK scaling, moex bf16, dense FP8 (fast accum); err: relative to moex bf16's f32 dW")
        print(f"{'config':15s}{'splits':10s}{'group':>7s}{'block':>7s}{'bf16':>7s}{'torch':>7s}{'dense':>7s}"
              f"{'blk/bf16':>9s}{'blk/t':>7s}{'err g':>7s}{'err b':>7s}")
        for r in rows:
            t = r.get("torch_fp8", 0)
            print(f"{r['config']:15s}{r['splits']:10s}{r['moex_fp8']:>7.0f}{r['moex_block']:>7.0f}"
                  f"{r['moex_bf16']:>7.0f}{t:>7.0f}{r['dense_fp8']:>7.0f}{r['moex_block'] / r['moex_bf16']:>9.3f}"
                  f"{r['moex_block'] / t if t else 0:>7.3f}{r['err_moex_fp8']:>7.4f}{r['err_moex_block']:>7.4f}")
        return
    print(f"\nFP8 grouped {args.product} (E4M3, y bf16), TFLOP/s (median): moex GROUP and BLOCK scaling, moex bf16, "
          f"torch rowwise (default accumulation; 'fast': use_fast_accum), dense (fast accum); "
          f"mx: moex MXFP8 (on Hopper: through its dequantized operands)")
    print(f"{'config':15s}{'splits':10s}{'group':>7s}{'block':>7s}{'bf16':>7s}{'torch':>7s}{'fast':>7s}{'dense':>7s}"
          f"{'grp/t':>7s}{'blk/t':>7s}{'blk/bf16':>9s}{'err g':>7s}{'err b':>7s}{'err t':>7s}{'mx':>6s}{'err mx':>7s}")
    for r in rows:
        print(f"{r['config']:15s}{r['splits']:10s}{r['moex_fp8']:>7.0f}{r['moex_block']:>7.0f}{r['moex_bf16']:>7.0f}"
              f"{r.get('torch_fp8', 0):>7.0f}{r.get('torch_fp8_fast', 0):>7.0f}{r['dense_fp8']:>7.0f}"
              f"{r['vs_torch'] or 0:>7.3f}"
              f"{r['block_vs_torch'] or 0:>7.3f}{r['moex_block'] / r['moex_bf16']:>9.3f}{r['err_moex_fp8']:>7.4f}"
              f"{r['err_moex_block']:>7.4f}{r.get('err_torch_fp8', 0):>7.4f}{r['moex_mx']:>6.0f}{r['err_moex_mx']:>7.4f}")


if __name__ == "__main__":
    main()
