#!/usr/bin/env python3
"""mlp_bench.py - the grouped MLP forward+backward (SwiGLU times the router's probs, FC2's bias
scaled by the same probs) of moex against its own six GEMMs run alone and against PyTorch
(eager, and torch.compile of the same math), with the peak memory of each; balanced and
skewed splits, in one run on one GPU.

Per config (the MLP shapes of tools/bench_configs.h: G experts, T rows, H hidden, F ffn):
  moex      moex.torch.grouped_mlp(x, w1, w2, splits, b2=b2, probs=p, scale_b2=True), then
            the backward of y to x, w1, w2, b2 and p (the time of fwd + bwd, autograd included)
  sz        moex with save_z=True: z saved by the forward, not recomputed by the backward
  gemms     moex's six grouped GEMMs of that step, each timed alone, no epilogue: FC1 and FC2
            forward, FC2 and FC1 backward-data, FC2 and FC1 backward-weight (the sum of their
            medians): the rate the MLP aims at
  eager     the same math in PyTorch: torch._grouped_mm, SwiGLU and the probs in f32, the
            scaled bias, autograd backward
  compile   torch.compile of the eager forward (default mode), autograd backward
TFLOP/s = 18 T H F / time. Peak memory: the most memory torch's allocator held during one
fwd+bwd beyond what was allocated before it (inputs, weights, dy: the same for all); moex's
workspaces come from torch's allocator, so they are counted. Gradients are returned by
torch.autograd.grad (none accumulated). Median of --iters CUDA-event timings after warm-up, each
behind a 3 ms GPU spin so that the host's time to enqueue the step is not timed (GPU time, for
every row alike); random data.

Usage (GPU machine): PYTHONPATH=python:bench MOEX_LIBRARY=build/libmoex.so \
    python3 bench/mlp_bench.py [--configs dsv3,...] [--splits balanced,skewed] [--iters N]
    [--no-compile] [--profile]
--profile prints, per config, the GPU time of each kernel of one moex fwd+bwd (torch.profiler);
with --fp8-only, of each recipe's step too.
--fp8 block,current,mxfp8 adds moex with that FP8 recipe (fp8_recipe=, docs/ops.md 9.11: every
GEMM of the step on FP8 operands quantized in the step, bf16 master weights) and a table of
its rate against moex bf16's and the relative (Frobenius) difference of its y and gradients
from moex bf16's; --fp8-only times only moex bf16 and the FP8 recipes; --fp8-kept adds each
recipe with the weights' FP8 copies kept between steps (<recipe>-kept: a GroupedMLP called with
is_first_microbatch=False after a first call made them; docs/ops.md 9.11).
"""
import argparse
import json

import torch
import torch.nn.functional as F

import moex.torch as mt
from moex import _capi
from moex.torch._linear import _backward_data, _backward_weight, _forward
from configs import select
from torch_baseline import median_ms, splits_of

BF = torch.bfloat16
MODELS = {}   # model name: (G, T, H, F), from the configs' fc1 rows
for _c in select("CUDA").values():
    if _c.name.endswith("-fc1"):
        MODELS[_c.name[:-4]] = (_c.G, _c.T, _c.H, _c.F)


LEAVES = ("x", "w1", "w2", "b2", "p")


SPIN = 6_000_000   # GPU cycles of the spin before each timed run: about 3 ms


def make_inputs(G, T, H, FF, kind, dev="cuda"):
    s = splits_of(G, T, kind)
    splits = torch.tensor(s, device=dev, dtype=torch.int64)
    return {
        "splits": splits,
        "offs": splits.cumsum(0).to(torch.int32),
        "gid": torch.repeat_interleave(torch.arange(G, device=dev), splits),
        "x": torch.randn(T, H, device=dev, dtype=BF).requires_grad_(),
        "w1": (torch.randn(G, 2 * FF, H, device=dev, dtype=BF) / H ** 0.5).requires_grad_(),
        "w2": (torch.randn(G, H, FF, device=dev, dtype=BF) / FF ** 0.5).requires_grad_(),
        "b2": (torch.randn(G, H, device=dev, dtype=BF) * 0.1).requires_grad_(),
        "p": torch.rand(T, device=dev, dtype=torch.float32).requires_grad_(),
        "dy": torch.randn(T, H, device=dev, dtype=BF),
    }


def torch_mlp(x, w1, w2, b2, p, offs, gid):
    """The grouped MLP in eager PyTorch: y = p * swiglu(x W1^T) W2^T + p b2 (per group), as a user
    would write it at its fastest: the scaled bias made in f32 and added to y in bf16 (adding it
    to an f32 copy of y costs torch.compile about 10% on dsv3, issue #33)."""
    h = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
    a, b = h.chunk(2, dim=-1)
    z = (F.silu(a.float()) * b.float() * p[:, None]).to(BF)
    y = torch._grouped_mm(z, w2.transpose(-2, -1), offs=offs)
    return y + (p[:, None] * b2.index_select(0, gid).float()).to(BF)


def step_fns(d, compiled):
    """{name: fn} of one forward+backward each, returning the gradients of LEAVES."""
    leaves = [d[k] for k in LEAVES]

    def backward(y):
        return torch.autograd.grad(y, leaves, d["dy"])

    fns = {
        "moex": lambda: backward(mt.grouped_mlp(d["x"], d["w1"], d["w2"], d["splits"], b2=d["b2"], probs=d["p"],
                                                scale_b2=True)),
        "moex_sz": lambda: backward(mt.grouped_mlp(d["x"], d["w1"], d["w2"], d["splits"], b2=d["b2"], probs=d["p"],
                                                   scale_b2=True, save_z=True)),
        "eager": lambda: backward(torch_mlp(d["x"], d["w1"], d["w2"], d["b2"], d["p"], d["offs"], d["gid"])),
    }
    if compiled is not None:
        fns["compile"] = lambda: backward(compiled(d["x"], d["w1"], d["w2"], d["b2"], d["p"], d["offs"], d["gid"]))
    return fns


def fp8_fns(d, recipes, kept=False):
    """{fp8_<recipe>: fn} of moex's step with each FP8 recipe, and {recipe: fn} of its y; with
    kept, also <recipe>-kept: a GroupedMLP of the same weights that keeps their FP8 copies
    (made by a first call with is_first_microbatch=True, then reused: False)."""
    leaves = [d[k] for k in LEAVES]

    def run(rec):
        return mt.grouped_mlp(d["x"], d["w1"], d["w2"], d["splits"], b2=d["b2"], probs=d["p"], scale_b2=True,
                              fp8_recipe=rec)

    steps = {f"fp8_{rec}": (lambda rec=rec: torch.autograd.grad(run(rec), leaves, d["dy"])) for rec in recipes}
    ys = {rec: (lambda rec=rec: run(rec)) for rec in recipes}
    for rec in recipes if kept else ():
        G, F2, H = d["w1"].shape
        m = mt.GroupedMLP(G, H, F2 // 2, bias2=True, scale_b2=True, params_dtype=BF, device=d["x"].device,
                          fp8_recipe=rec)
        with torch.no_grad():
            m.w1.copy_(d["w1"]), m.w2.copy_(d["w2"]), m.b2.copy_(d["b2"])
        m(d["x"], d["splits"], d["p"], is_first_microbatch=True)   # the copies, made once
        mleaves = [d["x"], m.w1, m.w2, m.b2, d["p"]]

        def run_kept(m=m):
            return m(d["x"], d["splits"], d["p"], is_first_microbatch=False)
        steps[f"fp8_{rec}-kept"] = lambda f=run_kept, ml=mleaves: torch.autograd.grad(f(), ml, d["dy"])
        ys[f"{rec}-kept"] = run_kept
    return steps, ys


def ys_bf16(d):
    return mt.grouped_mlp(d["x"], d["w1"], d["w2"], d["splits"], b2=d["b2"], probs=d["p"], scale_b2=True)


def rel_diff(a, b):
    return round(((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item(), 4)


def gemm_fns(d):
    """moex's six GEMMs of the step, plain, on inputs of the right shapes."""
    x, w1, w2, dy, s = d["x"].detach(), d["w1"].detach(), d["w2"].detach(), d["dy"], d["splits"]
    T, FF = x.shape[0], w2.shape[2]
    z = torch.randn(T, FF, device=x.device, dtype=BF)
    dh = torch.randn(T, 2 * FF, device=x.device, dtype=BF)
    none = _capi.BIAS_NONE
    return {
        "fc1_fwd": lambda: _forward(x, w1, s, None, None, none),
        "fc2_fwd": lambda: _forward(z, w2, s, None, None, none),
        "fc2_dgrad": lambda: _backward_data(dy, w2, s, None, None, none, True, False, False),
        "fc1_dgrad": lambda: _backward_data(dh, w1, s, None, None, none, True, False, False),
        "fc2_wgrad": lambda: _backward_weight(z, dy, s, _capi.DTYPE_BF16),
        "fc1_wgrad": lambda: _backward_weight(x, dh, s, _capi.DTYPE_BF16),
    }


def peak_bytes(fn):
    """The most memory held during one fn() beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = fn()
    torch.cuda.synchronize()
    del grads
    return torch.cuda.max_memory_allocated() - base


def check_same(fns):
    """{leaf: relative difference of moex's gradient from eager torch's}: not a test (tests/
    compare against fp64), a guard that the timed paths compute the same thing."""
    got, want = fns["moex"](), fns["eager"]()
    return {k: round(((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item(), 5)
            for k, a, b in zip(LEAVES, got, want)}


def profile(fn, label="moex", top=14):
    from torch.profiler import ProfilerActivity, profile as tprofile
    fn()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((t, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"  kernels of one {label} fwd+bwd: {total / 1e3:.3f} ms GPU")
    for t, n, key in rows[:top]:
        print(f"    {t / 1e3:8.3f} ms {n:>3}x  {key[:100]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=",".join(MODELS))
    ap.add_argument("--splits", default="balanced,skewed")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--fp8", default="", help="FP8 recipes to time too, e.g. block,current")
    ap.add_argument("--fp8-only", action="store_true", help="time only moex bf16 and the --fp8 recipes")
    ap.add_argument("--fp8-kept", action="store_true", help="also each --fp8 recipe with the weights' FP8 copies "
                    "kept between steps (GroupedMLP, is_first_microbatch=False)")
    args = ap.parse_args()
    recipes = [r for r in args.fp8.split(",") if r]
    labels = recipes + ([f"{r}-kept" for r in recipes] if args.fp8_kept else [])
    torch.manual_seed(0)
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    compiled = None if args.no_compile or args.fp8_only else torch.compile(torch_mlp)
    rows = []
    for name in args.configs.split(","):
        G, T, H, FF = MODELS[name]
        flops = 18.0 * T * H * FF
        for kind in args.splits.split(","):
            d = make_inputs(G, T, H, FF, kind)
            r = {"config": name, "splits": kind, "G": G, "T": T, "H": H, "F": FF}
            fns = step_fns(d, compiled)
            if args.fp8_only:
                fns = {"moex": fns["moex"]}
            else:
                r["rel_diff_moex_eager"] = check_same(fns)
            steps, ys = fp8_fns(d, recipes, args.fp8_kept)
            fns.update(steps)
            for fname, fn in fns.items():
                r[fname + "_peak_mb"] = round(peak_bytes(fn) / 1e6, 1)
                r[fname] = round(flops / median_ms(fn, args.iters, SPIN) / 1e9, 1)
            if recipes:
                y16, g16 = ys_bf16(d), fns["moex"]()
                for rec in labels:
                    r[f"fp8_{rec}_vs_bf16"] = round(r[f"fp8_{rec}"] / r["moex"], 3)
                    r[f"fp8_{rec}_diff"] = dict(y=rel_diff(ys[rec](), y16),
                                                **{k: rel_diff(a, b) for k, a, b in zip(LEAVES, steps[f"fp8_{rec}"](),
                                                                                        g16)})
            if args.fp8_only:
                print(json.dumps(r), flush=True)
                if args.profile:
                    for fname, fn in fns.items():
                        profile(fn, fname)
                rows.append(r)
                del d, fns
                torch.cuda.empty_cache()
                continue
            gms = {g: median_ms(fn, args.iters, SPIN) for g, fn in gemm_fns(d).items()}
            r["gemms"] = round(flops / sum(gms.values()) / 1e9, 1)
            r["gemm_ms"] = {g: round(v, 4) for g, v in gms.items()}
            best = max(r["eager"], r.get("compile", 0.0))
            r["vs_gemms"] = round(r["moex"] / r["gemms"], 3)
            r["vs_torch"] = round(r["moex"] / best, 3)
            print(json.dumps(r), flush=True)
            if args.profile:
                profile(fns["moex"])
            rows.append(r)
            del d, fns
            torch.cuda.empty_cache()
    if recipes:
        print("\ngrouped MLP fwd+bwd in FP8 (fp8_recipe=) against moex bf16, TFLOP/s (median; 18 T H F flops); "
              "diff: relative difference of y and dx from moex bf16's; peak MB beyond inputs")
        print(f"{'config':<11}{'splits':<9}{'recipe':<13}{'bf16':>7}{'fp8':>7}{'fp8/bf16':>9}{'diff y':>8}{'diff dx':>8}"
              f"{'peak bf16':>10}{'peak fp8':>9}")
        for r in rows:
            for rec in labels:
                k = f"fp8_{rec}"
                print(f"{r['config']:<11}{r['splits']:<9}{rec:<13}{r['moex']:>7.0f}{r[k]:>7.0f}{r[k + '_vs_bf16']:>9.3f}"
                      f"{r[k + '_diff']['y']:>8.4f}{r[k + '_diff']['x']:>8.4f}{r['moex_peak_mb']:>10.1f}"
                      f"{r[k + '_peak_mb']:>9.1f}")
    if args.fp8_only:
        return
    print("\ngrouped MLP fwd+bwd (SwiGLU x probs, probs-scaled b2), bf16, TFLOP/s (median); peak MB beyond inputs")
    print(f"{'config':<11}{'splits':<9}{'moex':>7}{'sz':>6}{'gemms':>7}{'eager':>7}{'compile':>8}{'/gemms':>8}"
          f"{'/torch':>8}{'peak moex':>10}{'sz':>9}{'eager':>9}{'compile':>9}")
    for r in rows:
        print(f"{r['config']:<11}{r['splits']:<9}{r['moex']:>7.0f}{r['moex_sz']:>6.0f}{r['gemms']:>7.0f}"
              f"{r['eager']:>7.0f}{r.get('compile', 0):>8.0f}{r['vs_gemms']:>8.3f}{r['vs_torch']:>8.3f}"
              f"{r['moex_peak_mb']:>10.1f}{r['moex_sz_peak_mb']:>9.1f}{r['eager_peak_mb']:>9.1f}"
              f"{r.get('compile_peak_mb', 0):>9.1f}")


if __name__ == "__main__":
    main()
