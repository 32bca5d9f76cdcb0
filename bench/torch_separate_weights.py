#!/usr/bin/env python3
"""torch_separate_weights.py - GroupedLinear's separate weights (weight0.., the C API's discrete
weights, passed as a device pointer array) against the same layer packed (one [G, N, K]
parameter) and against torch._grouped_mm on the packed weights, in one run, GPU time.

For every CUDA config of tools/bench_configs.h (bf16, balanced splits as a device tensor, no
bias): the forward (under no_grad) and the forward+backward step (dx and every weight's
gradient) of

  separate   moex.torch.GroupedLinear(G, K, N)                 weight0..weight{G-1}
  packed     moex.torch.GroupedLinear(G, K, N, packed=True)    weight [G, N, K]
  torch      torch._grouped_mm(x, w^T, offs) on the packed weights, autograd for the step

launched in rotating order, each behind a spin kernel that hides its host time and timed by its
own CUDA events (bench/gemm_bench.py's bench_interleaved); medians. TFLOP/s: 2 T K N per GEMM
(one in the forward, three in the step). The separate layer's forward must equal the packed
layer's bitwise (the same kernel and plan), and both torch's to 2e-2 relative (Frobenius); a
row that does not is marked BAD and makes the exit status 1.

    python3 bench/torch_separate_weights.py [--iters 30] [--configs dsv3-fc1,qwen3-30b-fc1]
"""
import argparse
import sys

import torch

import moex.torch as mt
from configs import select
from gemm_bench import Spinner, bench_interleaved


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--configs", default="", help="comma-separated names (default: the CUDA set)")
    args = ap.parse_args()
    configs = select("CUDA")
    names = [n for n in args.configs.split(",") if n] or list(configs)
    spinner = Spinner(torch)
    dt, dev = torch.bfloat16, "cuda"
    bad = False
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, balanced, iters {args.iters}")
    print(f"{'config':<15} {'op':<5} {'separate':>9} {'packed':>9} {'torch':>9} {'sep/packed':>10} {'sep/torch':>9}"
          f"  check")
    for name in names:
        c = configs[name]
        torch.manual_seed(0)
        G, T, K, N = c.G, c.T, c.K, c.N
        sep = mt.GroupedLinear(G, K, N, bias=False, params_dtype=dt, device=dev)
        packed = mt.GroupedLinear(G, K, N, bias=False, params_dtype=dt, device=dev, packed=True)
        with torch.no_grad():
            packed.weight.copy_(torch.stack([getattr(sep, f"weight{g}") for g in range(G)]))
        w = packed.weight.detach().clone().requires_grad_(True)
        splits = torch.full((G,), T // G, dtype=torch.int64, device=dev)
        splits[-1] += T - int(splits.sum())
        offs = torch.cumsum(splits, 0).to(torch.int32)
        x = torch.randn(T, K, dtype=dt, device=dev)
        xg = x.clone().requires_grad_(True)
        dy = torch.randn(T, N, dtype=dt, device=dev)

        with torch.no_grad():
            ys, yp, yt = sep(x, splits), packed(x, splits), torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
        rel = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))  # noqa: E731
        same = torch.equal(ys, yp)
        err = max(rel(ys, yt), rel(yp, yt))
        ok = same and err <= 2e-2
        bad |= not ok
        check = f"{'ok' if ok else 'BAD'} (separate {'==' if same else '!='} packed, relerr vs torch {err:.1e})"
        del ys, yp, yt

        def nograd(f):
            def run():
                with torch.no_grad():
                    f()
            return run

        def step(f, params):
            def run():
                for p in params:
                    p.grad = None
                f().backward(dy)
            return run

        fwd = bench_interleaved(torch, spinner, {
            "separate": nograd(lambda: sep(x, splits)),
            "packed": nograd(lambda: packed(x, splits)),
            "torch": nograd(lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs))}, args.iters)
        stp = bench_interleaved(torch, spinner, {
            "separate": step(lambda: sep(xg, splits), [xg, *sep.parameters()]),
            "packed": step(lambda: packed(xg, splits), [xg, packed.weight]),
            "torch": step(lambda: torch._grouped_mm(xg, w.transpose(1, 2), offs=offs), [xg, w])}, args.iters)
        for op, ms, gemms in (("fwd", fwd, 1), ("step", stp, 3)):
            tf = {k: gemms * 2.0 * T * K * N / (v * 1e-3) / 1e12 for k, v in ms.items()}
            print(f"{name:<15} {op:<5} {tf['separate']:9.1f} {tf['packed']:9.1f} {tf['torch']:9.1f} "
                  f"{tf['separate'] / tf['packed']:10.3f} {tf['separate'] / tf['torch']:9.3f}  {check if op == 'fwd' else ''}")
        del sep, packed, w, x, xg, dy
        torch.cuda.empty_cache()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
