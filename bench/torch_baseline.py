#!/usr/bin/env python3
"""torch_baseline.py - the PyTorch baseline for `moex bench --backend cuda`, on the same
shapes and splits in the same run: torch._grouped_mm (bf16) for the grouped linear forward,
backward-data and backward-weight, and an eager grouped MLP forward+backward (two
_grouped_mm, SwiGLU times probs in f32). Median of CUDA-event timings after warm-up, random
data. Prints one JSON object per line (rates in TFLOP/s), then a table. Usage: python3 bench/torch_baseline.py
[--configs a,b,...] [--iters N]
"""
import argparse
import json

import torch
import torch.nn.functional as F

CONFIGS = {  # name: G, T, K, N, H, F (as tools/cmd_bench.c)
    "dsv3-fc1": (8, 32768, 7168, 4096, 7168, 2048),
    "dsv3-fc2": (8, 32768, 2048, 7168, 7168, 2048),
    "qwen3-30b-fc1": (128, 32768, 2048, 1536, 2048, 768),
    "qwen3-30b-fc2": (128, 32768, 768, 2048, 2048, 768),
    "mixtral-fc1": (8, 16384, 4096, 28672, 4096, 14336),
    "gptoss-fc1": (32, 16384, 2880, 5760, 2880, 2880),
}


def median_ms(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
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

                def fb():
                    h = torch._grouped_mm(xm, w1.transpose(-2, -1), offs=offs)
                    a, b = h.chunk(2, dim=-1)
                    z = (F.silu(a.float()) * b.float() * probs[:, None]).to(torch.bfloat16)
                    torch._grouped_mm(z, w2.transpose(-2, -1), offs=offs).backward(dym)

                r["mlp_fwdbwd"] = 18.0 * T * H * FF / median_ms(fb, max(5, args.iters // 2)) / 1e9
                del xm, w1, w2, probs, dym
            torch.cuda.empty_cache()
            r = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()}
            print(json.dumps(r), flush=True)
            rows.append(r)
    print("\ntorch._grouped_mm bf16, TFLOP/s (median)")
    print(f"{'config':<16}{'splits':<10}{'fwd':>10}{'dgrad':>10}{'wgrad':>10}{'mlp f+b':>10}")
    for r in rows:
        print(f"{r['config']:<16}{r['splits']:<10}{r.get('fwd', 0):>10.0f}{r.get('dgrad', 0):>10.0f}"
              f"{r.get('wgrad', 0):>10.0f}{r.get('mlp_fwdbwd', 0):>10.0f}")


if __name__ == "__main__":
    main()
