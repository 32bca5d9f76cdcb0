#!/usr/bin/env python3
"""moe_fp8_bench.py - the whole MoE layer (router, permute, grouped MLP, unpermute) forward +
backward with its experts' GEMMs in FP8 (moex.torch.MoELayer(fp8_recipe=...), docs/ops.md 9.11)
against the same layer in bf16, on one GPU, in one run.

Per config (the MLP shapes of tools/bench_configs.h, read as a MoE layer: E = G experts, T
tokens, hidden H, ffn F, top-k so that T k routed rows match the config's T rows: k = 8 for
dsv3 (T / 8 tokens), else 2): TFLOP/s = 18 T k H F / time of one forward and backward through
autograd (the experts' GEMMs only; the router's are not counted), median of --iters CUDA-event
timings after warm-up, each behind a GPU spin; peak: MB the allocator held during one step
beyond what was allocated before it; diff: relative (Frobenius) difference of y and dx from the
bf16 layer's (the same weights).

Usage (GPU machine): PYTHONPATH=python:bench MOEX_LIBRARY=build/libmoex.so \\
    python3 bench/moe_fp8_bench.py [--configs dsv3,mixtral] [--recipes block,current] [--iters N]
"""
import argparse
import json

import torch

import moex.torch as mt
from configs import select
from torch_baseline import median_ms

SPIN = 2_000_000
BF = torch.bfloat16


def peak_bytes(fn):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - base


def rel_diff(a, b):
    return round(((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item(), 4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="dsv3,mixtral")
    ap.add_argument("--recipes", default="block,current")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    fc1 = {c.name[:-4]: c for c in select("CUDA").values() if c.name.endswith("-fc1")}
    rows = []
    for name in args.configs.split(","):
        c = fc1[name]
        k = 8 if name == "dsv3" else 2
        T = c.T // k
        flops = 18.0 * T * k * c.H * c.F
        layer = mt.MoELayer(c.G, c.H, c.F, k, params_dtype=BF, device=dev)
        x = torch.randn(T, c.H, device=dev, dtype=BF, requires_grad=True)
        dy = torch.randn(T, c.H, device=dev, dtype=BF)
        params = [x] + [p for p in layer.parameters()]

        def step():
            return torch.autograd.grad(layer(x), params, dy)

        r = {"config": name, "E": c.G, "T": T, "k": k, "H": c.H, "F": c.F}
        layer.fp8_recipe = None
        y16, g16 = layer(x).detach(), step()
        r["bf16_peak_mb"] = round(peak_bytes(step) / 1e6, 1)
        r["bf16"] = round(flops / median_ms(step, args.iters, SPIN) / 1e9, 1)
        for rec in args.recipes.split(","):
            layer.fp8_recipe = rec
            r[rec + "_peak_mb"] = round(peak_bytes(step) / 1e6, 1)
            r[rec] = round(flops / median_ms(step, args.iters, SPIN) / 1e9, 1)
            r[rec + "_diff"] = {"y": rel_diff(layer(x), y16), "x": rel_diff(step()[0], g16[0])}
        print(json.dumps(r), flush=True)
        rows.append(r)
        del layer, x, dy, params, y16, g16
        torch.cuda.empty_cache()
    print("\nMoE layer fwd+bwd, experts' GEMMs in FP8 (fp8_recipe=) against bf16, TFLOP/s (median; 18 T k H F); "
          "diff: relative difference of y and dx from bf16's; peak MB beyond inputs")
    print(f"{'config':<9}{'recipe':<9}{'bf16':>7}{'fp8':>7}{'fp8/bf16':>9}{'diff y':>8}{'diff dx':>8}"
          f"{'peak bf16':>10}{'peak fp8':>9}")
    for r in rows:
        for rec in args.recipes.split(","):
            print(f"{r['config']:<9}{rec:<9}{r['bf16']:>7.0f}{r[rec]:>7.0f}{r[rec] / r['bf16']:>9.3f}"
                  f"{r[rec + '_diff']['y']:>8.4f}{r[rec + '_diff']['x']:>8.4f}{r['bf16_peak_mb']:>10.1f}"
                  f"{r[rec + '_peak_mb']:>9.1f}")


if __name__ == "__main__":
    main()
