#!/usr/bin/env python3
"""moe_bench.py - the whole MoE layer forward + backward (router, top-k, permute, grouped MLP with
SwiGLU times the probs, unpermute) of moex.torch.MoELayer in bf16 against the same layer in plain
PyTorch, eager and under torch.compile, on one GPU, in one run, on the same inputs and weights.

Per config (T tokens, E experts, top-k, hidden H, ffn F; CONFIGS):
  moex     moex.torch.MoELayer(E, H, F, k) as constructed by default: softmax scores, the top-k
           renormalised, SwiGLU of the contiguous halves of w1 [E, 2F, H] (h = [a | b], z = p silu(a) b),
           no biases; one moex call each way
  eager    torch_moe, the same math: f32 router logits of the bf16 inputs (as moex's), softmax, topk,
           renormalise; a stable sort of the expert ids, index_select of the tokens, offs by
           searchsorted (no host sync); two torch._grouped_mm, the SwiGLU and probs in f32, rounded to
           bf16; unpermute by the inverse permutation, index_select and a sum over the k rows
  compile  torch.compile(torch_moe) (default mode, static shapes); when it fails, its error is
           reported and the config goes on without it
One step: y = layer(x), then torch.autograd.grad(y, [x, router_w, w1, w2], dy) (all parameters; none
accumulated). x ~ randn, router_w ~ randn / sqrt(H), w1 ~ randn / sqrt(H), w2 ~ randn / sqrt(F): the
moex layer's parameters, copied into torch_moe's. Before timing, the relative (Frobenius) difference
of y and of each gradient from eager's is printed (diff; ~1e-2 in bf16); the run exits nonzero
when y's or dx's exceeds 0.05. TFLOP/s = 18 T k H F / time: the experts' GEMMs only (FC1 and FC2,
forward, backward-data, backward-weight), not the router's. Time: the median of --iters CUDA-event
timings after warm-up, each behind a GPU spin (torch_baseline.median_ms, mlp_bench.SPIN: GPU time);
peak: MB torch's allocator held during one step beyond what was allocated before it (moex's
workspaces included; mlp_bench.peak_bytes).
--skewed: x[:, 0] = 1 and router_w[:, 0] = SKEW for the first max(1, E // 16) experts, 0 for the
others, so that their logits carry a fixed bias SKEW (the same for both layers); load: the most
rows an expert gets over the mean, T k / E.
--profile: each config's kernels of one moex step and one eager step (torch.profiler, GPU time).
--device cpu --configs tiny: a smoke run of the agreement check on the CPU (host timing, no
compile, no peak), with a CPU libmoex as MOEX_LIBRARY and MOEX_TORCH_EXTENSION=0.

Usage (GPU machine; the build of scripts/gpu_python.sh): PYTHONPATH=python:bench \\
    MOEX_LIBRARY=build-py/libmoex/libmoex.so MOEX_TORCH_EXTENSION=build-py/libmoex_torch.so \\
    python3 bench/moe_bench.py [--configs qwen3-30b,dsv3-32,mixtral,gptoss] [--iters N] [--skewed]
    [--no-compile] [--profile] [--device cpu]
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

import moex.torch as mt
from mlp_bench import SPIN, peak_bytes, profile, rel_diff
from torch_baseline import median_ms

BF = torch.bfloat16
CONFIGS = {   # name: (T, E, k, H, F)
    "qwen3-30b": (4096, 128, 8, 2048, 768),
    "dsv3-32": (4096, 32, 8, 7168, 2048),   # DeepSeek-V3's experts, 32 of them local
    "mixtral": (8192, 8, 2, 4096, 14336),
    "gptoss": (8192, 32, 4, 2880, 2880),
    "tiny": (64, 4, 2, 32, 16),   # the CPU smoke run
}
SKEW = 1.5   # --skewed: the logit bias of the favoured experts (the unbiased logits have std ~1)
MAX_DIFF = 0.05


def expert_mm(a, w, offs):
    """a [rows, K] grouped by offs (int32 cumulative counts) times w [E, N, K]^T: torch._grouped_mm,
    whose backward has no CPU kernel (torch 2.15), so on the CPU a loop over the experts."""
    if a.is_cuda:
        return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    ends = offs.tolist()
    return torch.cat([a[s:e] @ w[g].t() for g, (s, e) in enumerate(zip([0] + ends[:-1], ends))])


def torch_moe(x, wr, w1, w2, k):
    """y [T, H] of moex's default MoELayer (softmax, renormalised top-k, contiguous SwiGLU, no
    biases) in PyTorch, written for speed."""
    T, E = x.shape[0], w1.shape[0]
    probs = torch.softmax(F.linear(x.float(), wr.float()), dim=-1)
    q, ids = torch.topk(probs, k, dim=-1)
    p = q / q.sum(dim=-1, keepdim=True)
    sorted_ids, order = torch.sort(ids.reshape(-1), stable=True)   # row r of xp is copy order[r] = t k + j
    offs = torch.searchsorted(sorted_ids, torch.arange(1, E + 1, device=x.device)).to(torch.int32)
    xp = x.index_select(0, order // k)
    h = expert_mm(xp, w1, offs)
    a, b = h.chunk(2, dim=-1)
    z = (F.silu(a.float()) * b.float() * p.reshape(-1).index_select(0, order)[:, None]).to(BF)
    yp = expert_mm(z, w2, offs)
    row_of = torch.empty_like(order)
    row_of[order] = torch.arange(T * k, device=x.device)   # copy t k + j -> its row of yp
    return yp.index_select(0, row_of).view(T, k, -1).sum(dim=1)


def make(T, E, k, H, FF, skewed, dev):
    """(moex layer, torch_moe's [router_w, w1, w2], x, dy)."""
    layer = mt.MoELayer(E, H, FF, k, params_dtype=BF, device=dev)
    x = torch.randn(T, H, device=dev, dtype=BF)
    with torch.no_grad():
        for w, fan_in in ((layer.router_w, H), (layer.w1, H), (layer.w2, FF)):
            w.copy_(torch.randn(w.shape, device=dev) / fan_in ** 0.5)
        if skewed:
            x[:, 0] = 1.0
            layer.router_w[:, 0] = 0.0
            layer.router_w[:max(1, E // 16), 0] = SKEW
    weights = [w.detach().clone().requires_grad_() for w in (layer.router_w, layer.w1, layer.w2)]
    return layer, weights, x.requires_grad_(), torch.randn(T, H, device=dev, dtype=BF)


def step_ms(fn, iters, dev):
    """Median ms of fn(): GPU time by torch_baseline.median_ms on CUDA, the host's clock on the CPU."""
    if dev.type == "cuda":
        return median_ms(fn, iters, SPIN)
    fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[len(ts) // 2]


def bench_config(name, args, dev, compiled):
    """The JSON row of config `name`; exits nonzero when moex and torch_moe disagree."""
    T, E, k, H, FF = CONFIGS[name]
    layer, weights, x, dy = make(T, E, k, H, FF, args.skewed, dev)
    mleaves, tleaves = [x, layer.router_w, layer.w1, layer.w2], [x] + weights

    def step(fwd, leaves):
        def run():
            y = fwd()
            return (y,) + torch.autograd.grad(y, leaves, dy)
        return run

    fns = {"moex": step(lambda: layer(x), mleaves), "eager": step(lambda: torch_moe(x, *weights, k), tleaves)}
    if compiled is not None:
        fns["compile"] = step(lambda: compiled(x, *weights, k), tleaves)
    counts = torch.bincount(F.linear(x.float(), weights[0].float()).topk(k).indices.flatten(), minlength=E)
    r = {"config": name, "T": T, "E": E, "k": k, "H": H, "F": FF, "skewed": args.skewed,
         "load": round(counts.max().item() * E / (T * k), 2)}
    outs = {}
    for fname in list(fns):
        try:
            outs[fname] = fns[fname]()
        except Exception as ex:  # noqa: BLE001 - torch.compile's failure: report it and go on eager
            if fname != "compile":
                raise
            r["compile_error"] = str(ex)[:300]
            del fns[fname]
    for fname in [f for f in outs if f != "eager"]:
        r[f"diff_{fname}"] = {n: rel_diff(a, b)
                              for n, a, b in zip(("y", "x", "router_w", "w1", "w2"), outs[fname], outs["eager"])}
    del outs   # (y and the gradients of each: GBs)
    if max(r["diff_moex"]["y"], r["diff_moex"]["x"]) > MAX_DIFF:
        print(json.dumps(r), flush=True)
        sys.exit(f"moe_bench: {name}: moex and torch differ by more than {MAX_DIFF} (diff_moex)")
    flops = 18.0 * T * k * H * FF
    for fname, fn in fns.items():
        if dev.type == "cuda":
            r[f"{fname}_peak_mb"] = round(peak_bytes(fn) / 1e6, 1)
        r[f"{fname}_ms"] = round(step_ms(fn, args.iters, dev), 4)
        r[fname] = round(flops / r[f"{fname}_ms"] / 1e9, 1)
    if args.profile and dev.type == "cuda":
        print(json.dumps(r), flush=True)   # (the row so far, above its kernels)
        for fname in ("moex", "eager"):
            profile(fns[fname], f"{name} {fname}", top=24)
    r["vs_eager"] = round(r["eager_ms"] / r["moex_ms"], 3)
    r["vs_torch"] = round(min(r["eager_ms"], r.get("compile_ms", float("inf"))) / r["moex_ms"], 3)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="qwen3-30b,dsv3-32", help=f"of {','.join(CONFIGS)}")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--skewed", action="store_true", help=f"bias the logits of a few experts by {SKEW}")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--profile", action="store_true", help="the kernels of one moex and one eager step")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run (no compile)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    print(json.dumps({"torch": torch.__version__,
                      "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}), flush=True)
    compiled = None if args.no_compile or dev.type != "cuda" else torch.compile(torch_moe, dynamic=False)
    rows = []
    for name in args.configs.split(","):
        rows.append(bench_config(name, args, dev, compiled))
        print(json.dumps(rows[-1]), flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    skew = " (skewed routing)" if args.skewed else ""
    print(f"\nMoE layer fwd+bwd, bf16, moex.torch.MoELayer against PyTorch{skew}: ms and TFLOP/s (median; "
          "18 T k H F, the experts' GEMMs); x: moex's speedup; peak MB beyond the inputs\n")
    print("| config | load | moex | eager | compile | x eager | x best torch | peak moex | eager | compile "
          "| diff y, dx |")
    print("|---" * 11 + "|")
    names = ("moex", "eager", "compile")
    for r in rows:
        timed = [f"{r[f + '_ms']:.3f} ms, {r[f]:.0f} TF" if f + "_ms" in r else "-" for f in names]
        peaks = [str(r.get(f + "_peak_mb", "-")) for f in names]
        print(" | ".join([f"| {r['config']}", str(r["load"])] + timed + [str(r["vs_eager"]), str(r["vs_torch"])] +
                         peaks + [f"{r['diff_moex']['y']}, {r['diff_moex']['x']} |"]))


if __name__ == "__main__":
    main()
