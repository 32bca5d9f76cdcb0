"""examples/moe_lm/compare.py - trains the language model of train.py with each MoE layer, in
each dtype, from several seeds (each run in its own process, one after the other), or reads the
JSON those runs left (--read); then judges moex against plain PyTorch and prints a table, and
writes summary.json and loss.svg.

A seed fixes the start (the weights) and the batches; for one seed every variant starts from the
same weights and sees the same batches. Training amplifies any difference of rounding (a token
routed to another expert, a plateau left a few steps earlier), so two correct runs drift apart;
how far is measured by the spread of the final losses over the seeds. Two checks:

1. f32 parity, the correctness gate. For each seed, moex's and torch's f32 train losses agree
   within --parity-rtol (1e-5) relative at each of the first --parity-steps (10) steps, before
   the drift sets in. Both compute the same function in f32 (docs/conventions.md: no TF32),
   with sums in other orders; measured on the CPU: 1.2e-7 at most over 12 steps. A wrong layer
   (the GLU's halves swapped, p not applied, no renormalisation) moves the loss by 5e-5 to 2e-3
   relative from the second step on (tests/python/test_example_moe_lm.py).
2. The final losses against the seed spread, in every dtype (bf16 is where the question is). The
   final train loss (the mean of the last --smooth steps) and the final validation loss of
   moex's seeds against torch's: the difference of their means must lie within
   t * s * sqrt(1/n_moex + 1/n_torch), s the pooled standard deviation over the seeds of both,
   t the two-sided 99% quantile of Student's t with n_moex + n_torch - 2 degrees of freedom
   (the two-sample t-test at the 1% level). Why this rule and not "within torch's min-max":
   with 3 or 4 seeds the range of torch's seeds is narrow, and the mean of moex's seeds falls
   outside it 37% (3 seeds each) or 23% (4 each) of the time when both variants train alike;
   the t rule fails such a pair 1% of the time per comparison, whatever the number of seeds.
   Its power is that of few seeds: a shift of 2 (3) seed standard deviations fails it 32%
   (69%) of the time with 4 + 4 seeds, 47% (87%) with 5 + 5 (all simulated with normal final
   losses). A pass therefore says "no difference as large as the spread shows", and the table
   prints the spread it was judged against.

The table: per variant and dtype, the seeds, the mean, min and max of the final train and
validation losses, ms per step (the mean over the seeds), and how much the train loss still
fell at the end (the mean of the last 10% of the steps minus that of the 10% before, mean over
the seeds): near 0 when the curve has flattened. Exit status 1 when a check fails.

    python3 examples/moe_lm/compare.py --device cuda --out-dir DIR [--gpus 4]
    python3 examples/moe_lm/compare.py --device cpu --out-dir DIR --hidden 128 --ffn 256 --seq 128 --batch 16
    python3 examples/moe_lm/compare.py --read --out-dir DIR
    python3 examples/moe_lm/compare.py --device cuda --out-dir DIR --variants moex,torch,ep_moex,ep_torch \
        --ep-ranks 2 --dtypes bf16

Expert parallelism: the variants ep_moex and ep_torch train the same model with train_ep.py on
--ep-ranks ranks (moex's EP layer, or the all-to-all EP layer), each judged as above against the
one-process run of its layer (moex, torch), whose losses it must give: f32 parity, and the final
losses within the seed spread; the report adds the EP step's time of ep_moex against ep_torch.

FP8: the variant moex_fp8 (moex's layer with fp8_recipe="block") is judged against moex's runs
on the seed spread alone (FP8 rounds the GEMMs' operands, so no f32 parity), as issue 34's
accuracy gate asks: FP8 training within the bf16 runs' spread.

Options it does not know go to train.py. DIR gets <variant>_<dtype>_seed<S>.json (train.py
--out), summary.json (what the table and the checks show) and loss.svg.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("moex", "moex_fp8", "torch", "torch_gmm", "ep_moex", "ep_torch")
DTYPES = ("f32", "bf16")
# (variant, its reference): the checks below judge each variant against its reference where
# both ran; an EP variant (train_ep.py on --ep-ranks ranks) against the one-process run of the
# same layer, whose losses it must give
PAIRS = (("moex", "torch"), ("moex_fp8", "moex"), ("ep_moex", "moex"), ("ep_torch", "torch"))
NO_PARITY = {"moex_fp8"}   # variants judged on the seed spread only (not the same function in f32)
# (variant, dtype) -> colour of its curves
COLOURS = {("moex", "f32"): "#d62728", ("moex", "bf16"): "#ff9896", ("torch", "f32"): "#1f77b4",
           ("torch", "bf16"): "#aec7e8", ("torch_gmm", "f32"): "#2ca02c", ("torch_gmm", "bf16"): "#98df8a",
           ("ep_moex", "f32"): "#9467bd", ("ep_moex", "bf16"): "#c5b0d5", ("ep_torch", "f32"): "#8c564b",
           ("ep_torch", "bf16"): "#c49c94", ("moex_fp8", "f32"): "#e377c2", ("moex_fp8", "bf16"): "#f7b6d2"}
# the two-sided 99% quantile of Student's t by degrees of freedom (beyond 30: the normal's)
T99 = {1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250, 10: 3.169,
       11: 3.106, 12: 3.055, 13: 3.012, 14: 2.977, 15: 2.947, 16: 2.921, 17: 2.898, 18: 2.878, 19: 2.861,
       20: 2.845, 22: 2.819, 24: 2.797, 26: 2.779, 28: 2.763, 30: 2.750}
TAIL = 0.1   # the flatness column: the last 10% of the steps against the 10% before


def t99(dof):
    """The two-sided 99% quantile of Student's t with dof degrees of freedom (conservative
    between the table's entries)."""
    if dof > 30:
        return 2.576
    return T99[max(d for d in T99 if d <= dof)]


def run_name(variant, dtype, seed):
    return f"{variant}_{dtype}_seed{seed}"


# ---- the measures ------------------------------------------------------------------------------

def smooth(values, window):
    """The centred moving average over `window` values (odd), for the positions where the
    window fits: (first position, averages)."""
    h = window // 2
    return h, [sum(values[i - h:i + h + 1]) / window for i in range(h, len(values) - h)]


def final_train(run, window):
    """The final train loss: the mean of the last `window` steps."""
    tail = run["train_loss"][-window:]
    return sum(tail) / len(tail)


def tail_drop(run):
    """The mean train loss of the last TAIL of the steps minus that of the TAIL before them
    (negative: it still falls; near 0: the curve has flattened)."""
    loss = run["train_loss"]
    m = max(1, int(len(loss) * TAIL))
    return statistics.fmean(loss[-m:]) - statistics.fmean(loss[-2 * m:-m])


def spread(values):
    return {"per_seed": values, "mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else None}


def groups(runs, window):
    """{(variant, dtype): the group's record}; runs is {(variant, dtype, seed): run}."""
    out = {}
    for (v, d, seed), r in sorted(runs.items(), key=lambda kv: (DTYPES.index(kv[0][1]), VARIANTS.index(kv[0][0]),
                                                                kv[0][2])):
        out.setdefault((v, d), []).append((seed, r))
    return {key: {"variant": key[0], "dtype": key[1], "seeds": [s for s, _ in rs],
                  "train": spread([final_train(r, window) for _, r in rs]),
                  "val": spread([r["val_loss"][-1][1] for _, r in rs]),
                  "ms_per_step": statistics.fmean(r["ms_per_step"] for _, r in rs) if all(r["ms_per_step"] for _, r in rs)
                  else None,
                  "tail_drop": statistics.fmean(tail_drop(r) for _, r in rs)}
            for key, rs in out.items()}


def parity(moex, ref, steps, rtol):
    """The f32 gate for one seed: the largest relative difference of the train losses over the
    first `steps` steps, and whether it is within rtol."""
    n = min(steps, len(moex["train_loss"]), len(ref["train_loss"]))
    worst, at = max((abs(a - b) / abs(b), i + 1) for i, (a, b) in
                    enumerate(zip(moex["train_loss"][:n], ref["train_loss"][:n])))
    return {"steps": n, "rtol": rtol, "max_rel_diff": worst, "at_step": at, "ok": worst <= rtol}


def against_spread(a, b):
    """moex's final losses `a` against torch's `b` (one per seed): the difference of the means,
    the pooled standard deviation s, and whether |difference| <= t99(n_a + n_b - 2) * s *
    sqrt(1/n_a + 1/n_b). None with fewer than 2 seeds on either side (no spread to judge by)."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        return None
    diff = statistics.fmean(a) - statistics.fmean(b)
    s = math.sqrt(((na - 1) * statistics.variance(a) + (nb - 1) * statistics.variance(b)) / (na + nb - 2))
    t = t99(na + nb - 2)
    allowed = t * s * math.sqrt(1 / na + 1 / nb)
    return {"diff": diff, "pooled_std": s, "t": t, "allowed": allowed, "ok": abs(diff) <= allowed}


def judge(runs, window, parity_steps, parity_rtol):
    """The summary: groups, and for each pair of PAIRS that ran (a variant and its reference) the
    f32 parity of every seed both ran and the variant's final losses against the reference's
    spread in every dtype both ran."""
    g = groups(runs, window)
    checks = {"parity": [], "spread": []}
    for v, ref in PAIRS:
        for (w, d, seed), r in sorted(runs.items()):
            if w == v and d == "f32" and (ref, d, seed) in runs and v not in NO_PARITY:
                checks["parity"].append({"variant": v, "reference": ref, "seed": seed,
                                         **parity(r, runs[(ref, d, seed)], parity_steps, parity_rtol)})
        for d in DTYPES:
            if (v, d) in g and (ref, d) in g:
                for metric in ("train", "val"):
                    res = against_spread(g[(v, d)][metric]["per_seed"], g[(ref, d)][metric]["per_seed"])
                    checks["spread"].append({"variant": v, "reference": ref, "dtype": d, "metric": metric,
                                             "judged": res is not None, **(res or {})})
    failed = [c for c in checks["parity"] + checks["spread"] if c.get("ok") is False]
    return {"groups": list(g.values()), "checks": checks, "ok": not failed}


# ---- the report --------------------------------------------------------------------------------

def print_report(summary, window, meta):
    print(f"\n{'variant':<10} {'dtype':<5} {'seeds':>5} {'train':>7} {'train min-max':>15} {'val':>7} "
          f"{'val min-max':>15} {'ms/step':>8} {'dtrain@end':>10}")
    for g in summary["groups"]:
        tr, va = g["train"], g["val"]
        ms = "-" if g["ms_per_step"] is None else f"{g['ms_per_step']:.2f}"
        print(f"{g['variant']:<10} {g['dtype']:<5} {len(g['seeds']):>5} {tr['mean']:7.4f} "
              f"{tr['min']:7.4f}-{tr['max']:7.4f} {va['mean']:7.4f} {va['min']:7.4f}-{va['max']:7.4f} "
              f"{ms:>8} {g['tail_drop']:+10.4f}")
    print(f"\ntrain: the mean train loss of the last {window} steps; val: the last validation loss (mean, min "
          f"and max over the seeds); dtrain@end: the mean train loss of the last {TAIL:.0%} of the steps minus "
          f"that of the {TAIL:.0%} before (mean over the seeds; near 0: the curve has flattened).")
    c = summary["checks"]
    for v, ref in PAIRS:
        par = [p for p in c["parity"] if p["variant"] == v]
        if par:
            print(f"f32 parity ({v} and {ref}, same seed: same start, same batches; the first {par[0]['steps']} "
                  f"steps within {par[0]['rtol']:g} relative):")
            for p in par:
                print(f"  seed {p['seed']}: max {p['max_rel_diff']:.1e} (step {p['at_step']})  "
                      f"{'ok' if p['ok'] else 'FAIL'}")
        spr = [s for s in c["spread"] if s["variant"] == v]
        if spr:
            print(f"final losses, {v} against {ref}'s seed spread: |mean difference| <= t99 * s * "
                  f"sqrt(1/n_{v} + 1/n_{ref}), s pooled over the seeds:")
        for s in spr:
            if not s["judged"]:
                print(f"  {s['dtype']:<4} {s['metric']:<5}: not judged (fewer than 2 seeds on a side)")
            else:
                print(f"  {s['dtype']:<4} {s['metric']:<5}: {v} - {ref} = {s['diff']:+.4f}, allowed "
                      f"+-{s['allowed']:.4f} (t {s['t']:.2f}, s {s['pooled_std']:.4f})  {'ok' if s['ok'] else 'FAIL'}")
    speed = {(g["variant"], g["dtype"]): g["ms_per_step"] for g in summary["groups"]}
    for d in DTYPES:
        a, b = speed.get(("ep_moex", d)), speed.get(("ep_torch", d))
        if a and b:
            print(f"expert parallelism, {d}: a step of ep_moex takes {a:.2f} ms, of ep_torch {b:.2f} ms: "
                  f"{b / a:.2f}x the tokens per second")
    print(f"{meta['device_name']}, torch {meta['torch']}; {meta['params'] / 1e6:.1f}M parameters, {meta['config']}")
    print("all checks passed" if summary["ok"] else "A CHECK FAILED")


# ---- the plot ----------------------------------------------------------------------------------

def ticks(lo, hi, n=6):
    """About n round values covering [lo, hi]."""
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if step * m >= raw)
    return [i * step for i in range(math.floor(lo / step), math.ceil(hi / step) + 1)]


def write_svg(path, runs, window, title):
    """The train loss's moving average (solid) and the validation loss (dashed) of every run
    against the step, one colour per variant and dtype (one curve per seed)."""
    W, Hh, left, right, top, bottom = 760, 460, 60, 150, 40, 45
    steps = max(len(r["train_loss"]) for r in runs.values())
    curves = {k: smooth(r["train_loss"], window) for k, r in runs.items()}
    values = [v for _, s in curves.values() for v in s] + [p[1] for r in runs.values() for p in r["val_loss"]]
    ys = ticks(min(values), max(values))
    xs = ticks(0, steps)
    y0, y1, x1 = ys[0], ys[-1], xs[-1]

    def px(step, loss):
        return (left + (W - left - right) * step / x1, top + (Hh - top - bottom) * (y1 - loss) / (y1 - y0))

    def line(points, colour, extra=""):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        return f'<polyline fill="none" stroke="{colour}" points="{pts}" {extra}/>'

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{Hh}" font-family="sans-serif" '
           f'font-size="12">', f'<rect width="{W}" height="{Hh}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for y in ys:
        _, py = px(0, y)
        out.append(f'<line x1="{left}" x2="{W - right}" y1="{py:.1f}" y2="{py:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{py + 4:.1f}" text-anchor="end">{y:g}</text>')
    for x in xs:
        qx, _ = px(x, y0)
        out.append(f'<line x1="{qx:.1f}" x2="{qx:.1f}" y1="{top}" y2="{Hh - bottom}" stroke="#ddd"/>')
        out.append(f'<text x="{qx:.1f}" y="{Hh - bottom + 16}" text-anchor="middle">{x:g}</text>')
    out.append(f'<text x="{(left + W - right) / 2}" y="{Hh - 8}" text-anchor="middle">step</text>')
    out.append(f'<text transform="translate(16 {(top + Hh - bottom) / 2}) rotate(-90)" '
               f'text-anchor="middle">loss (nats per byte)</text>')
    for key in sorted(runs, key=lambda k: (k[0] == "moex", k)):   # moex's curves on top
        colour = COLOURS[key[:2]]
        h, s = curves[key]
        out.append(line([px(h + j + 1, v) for j, v in enumerate(s)], colour, 'stroke-width="1.5"'))
        out.append(line([px(step, v) for step, v in runs[key]["val_loss"]], colour, 'stroke-dasharray="6 4"'))
    legend = sorted({k[:2] for k in runs}, key=lambda k: (VARIANTS.index(k[0]), k[1]))
    for i, (v, d) in enumerate(legend):
        ly = top + 14 + 20 * i
        out.append(f'<line x1="{W - right + 12}" x2="{W - right + 36}" y1="{ly}" y2="{ly}" stroke="{COLOURS[(v, d)]}" '
                   f'stroke-width="2"/>')
        out.append(f'<text x="{W - right + 42}" y="{ly + 4}">{v} {d}</text>')
    ly = top + 14 + 20 * len(legend) + 10
    out.append(f'<text x="{W - right + 12}" y="{ly}" font-size="11">solid: train,</text>')
    out.append(f'<text x="{W - right + 12}" y="{ly + 14}" font-size="11">{window}-step average</text>')
    out.append(f'<text x="{W - right + 12}" y="{ly + 28}" font-size="11">dashed: validation</text>')
    out.append(f'<text x="{W - right + 12}" y="{ly + 42}" font-size="11">one line per seed</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def int_list(text):
    return [int(s) for s in text.split(",") if s]


def visible_gpus(n):
    """The names of the first n GPUs this process may use: CUDA_VISIBLE_DEVICES's entries
    when it is set (fewer than n: ValueError), else 0 .. n-1."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [g.strip() for g in visible.split(",") if g.strip()] if visible else [str(g) for g in range(n)]
    if len(names) < n:
        raise ValueError(f"--gpus {n}, but CUDA_VISIBLE_DEVICES={visible} names {len(names)}")
    return names[:n]


def ep_command(args, variant):
    """The launcher of train_ep.py for an EP variant: torchrun on --ep-ranks GPUs (CUDA), or
    mpirun on --ep-ranks processes (the CPU: moex's EP over MPI)."""
    script = [os.path.join(HERE, "train_ep.py"), "--moe", variant[len("ep_"):]]
    if args.device.startswith("cuda"):
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                str(args.ep_ranks)] + script
    return ["mpirun", "-np", str(args.ep_ranks), sys.executable] + script


def train_all(args, seeds, dtypes, variants, train_args):
    """Every run, each in its own process (group): seed by seed (an interrupted comparison leaves
    whole seeds). train.py's on --gpus GPUs at once (seed i on GPU i mod N, one run per GPU at a
    time, so that every run's ms per step is that of a GPU of its own; GPU i is the i-th of
    CUDA_VISIBLE_DEVICES when that is set); then the EP variants' (train_ep.py on --ep-ranks
    GPUs or processes), one at a time."""
    plain, ep = [v for v in variants if not v.startswith("ep_")], [v for v in variants if v.startswith("ep_")]
    workers = max(1, min(args.gpus, len(seeds)))
    gpus = visible_gpus(args.gpus)
    errors = []

    def work(gpu):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpus[gpu]) if args.gpus > 1 else None
        try:
            for seed in seeds[gpu::workers]:
                for d in dtypes:
                    for v in plain:
                        path = os.path.join(args.out_dir, run_name(v, d, seed) + ".json")
                        subprocess.run([sys.executable, os.path.join(HERE, "train.py"), "--moe", v, "--dtype", d,
                                        "--seed", str(seed), "--device", args.device, "--out", path] + train_args,
                                       check=True, env=env)
        except subprocess.CalledProcessError as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(g,)) for g in range(workers)] if plain else []
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for seed in seeds:
        for d in dtypes:
            for v in ep:
                path = os.path.join(args.out_dir, run_name(v, d, seed) + ".json")
                subprocess.run(ep_command(args, v) + ["--dtype", d, "--seed", str(seed), "--device", args.device,
                                                      "--out", path] + train_args, check=True, env=None)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True, help="where the JSON of the runs, summary.json and loss.svg go")
    p.add_argument("--device", default="cuda", help="passed to train.py (default cuda)")
    p.add_argument("--variants", default="moex,torch", help=f"comma-separated, of {','.join(VARIANTS)} (default "
                   "moex,torch)")
    p.add_argument("--dtypes", help="comma-separated, of f32,bf16 (default f32,bf16 on CUDA, f32 on the CPU)")
    p.add_argument("--seeds", default="0,1,2,3", help="comma-separated seeds, each a run of every variant and dtype "
                   "(default 0,1,2,3)")
    p.add_argument("--gpus", type=int, default=1, help="run the seeds on this many GPUs at once (CUDA_VISIBLE_DEVICES "
                   "per run; default 1)")
    p.add_argument("--ep-ranks", type=int, default=2, help="the ranks of the EP variants (ep_moex, ep_torch: "
                   "train_ep.py under torchrun, one GPU a rank, or on the CPU under mpirun; default 2)")
    p.add_argument("--read", action="store_true", help="read the runs' JSON in --out-dir instead of training")
    p.add_argument("--smooth", type=int, default=21, help="moving-average window in steps (odd; default 21)")
    p.add_argument("--parity-steps", type=int, default=10, help="f32 parity: the first steps compared (default 10)")
    p.add_argument("--parity-rtol", type=float, default=1e-5, help="f32 parity: the relative tolerance (default 1e-5)")
    args, train_args = p.parse_known_args()
    if args.smooth < 1 or args.smooth % 2 == 0:
        p.error("--smooth must be odd")
    variants = args.variants.split(",")
    if args.gpus < 1:
        p.error("--gpus: at least 1")
    if args.ep_ranks < 1:
        p.error("--ep-ranks: at least 1")
    try:
        visible_gpus(args.gpus)
    except ValueError as e:
        p.error(str(e))
    if any(v not in VARIANTS for v in variants):
        p.error(f"--variants: each one of {', '.join(VARIANTS)}")
    dtypes = (args.dtypes or ("f32,bf16" if args.device.startswith("cuda") else "f32")).split(",")
    if any(d not in DTYPES for d in dtypes):
        p.error("--dtypes: each one of f32, bf16")
    try:
        seeds = int_list(args.seeds)
    except ValueError:
        p.error("--seeds: comma-separated integers")
    if not seeds:
        p.error("--seeds: at least one")
    os.makedirs(args.out_dir, exist_ok=True)

    t0 = time.time()
    if not args.read:
        train_all(args, seeds, dtypes, variants, train_args)
    runs = {}
    for seed in seeds:
        for d in dtypes:
            for v in variants:
                with open(os.path.join(args.out_dir, run_name(v, d, seed) + ".json")) as f:
                    runs[(v, d, seed)] = json.load(f)

    n = min(len(r["train_loss"]) for r in runs.values())
    window = min(args.smooth, n if n % 2 else n - 1)
    summary = judge(runs, window, args.parity_steps, args.parity_rtol)
    first = next(iter(runs.values()))
    c = first["config"]
    config = (f"{c['layers']} layers, hidden {c['hidden']}, {c['experts']} experts top-{c['topk']}, ffn {c['ffn']}, "
              f"batch {c['batch']} x seq {c['seq']}, {c['steps']} steps; {first['text']['bytes']} bytes of text")
    meta = {"device_name": first["device_name"], "torch": first["torch"], "params": first["params"], "config": config}
    summary.update({"meta": meta, "window": window, "runs": sorted(run_name(*k) for k in runs)})
    if not args.read:
        summary["wall_s"] = time.time() - t0
    print_report(summary, window, meta)
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    title = (f"byte-level MoE LM, {os.path.basename(first['text']['dir'])}: {c['layers']} layers, "
             f"hidden {c['hidden']}, {c['experts']} experts top-{c['topk']}, {first['device_name']}")
    svg = os.path.join(args.out_dir, "loss.svg")
    write_svg(svg, runs, window, title)
    print(f"wrote {os.path.join(args.out_dir, 'summary.json')} and {svg}"
          + (f"; {summary['wall_s']:.0f} s" if "wall_s" in summary else ""))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
