"""examples/moe_lm/compare.py - trains the language model of train.py once per MoE layer (each in
its own process, one after the other), or reads the JSON those runs left (--read), then prints a
table (final losses, how far each loss curve is from the plain PyTorch one, ms per step,
speedup) and writes loss.svg (the loss curves on one plot, the SVG written by hand).

The runs: moex, torch, torch_gmm (train.py --moe), and torch_perturbed, the control: the torch
model again from a start changed by rounding noise (train.py --perturb). Training amplifies
any difference (a token routed to another expert, a plateau left a few steps earlier), so two
runs of the same model drift apart; torch_perturbed's distance from torch measures how far,
and a variant at about that distance agrees within noise.

    python3 examples/moe_lm/compare.py --device cuda --out-dir DIR
    python3 examples/moe_lm/compare.py --device cpu --out-dir DIR --hidden 128 --ffn 256 --seq 128 --batch 16
    python3 examples/moe_lm/compare.py --read --out-dir DIR

Options it does not know go to train.py. Without --variants: all four (torch_gmm on CUDA
only). DIR gets <variant>.json (train.py --out) and loss.svg.
"""
import argparse
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The runs: train.py's options for each.
RUNS = {"moex": ["--moe", "moex"], "torch": ["--moe", "torch"], "torch_gmm": ["--moe", "torch_gmm"],
        "torch_perturbed": ["--moe", "torch", "--perturb"]}
COLOURS = {"moex": "#d62728", "torch": "#1f77b4", "torch_gmm": "#2ca02c", "torch_perturbed": "#7f7f7f"}
BASELINE = "torch"


def smooth(values, window):
    """The centred moving average over `window` values (odd), for the positions where the
    window fits: (first position, averages)."""
    h = window // 2
    return h, [sum(values[i - h:i + h + 1]) / window for i in range(h, len(values) - h)]


def summarise(runs, window):
    """Rows of the table, one per run, with the baseline's curves as the reference."""
    base = runs.get(BASELINE)
    rows = []
    for name, r in runs.items():
        loss = r["train_loss"]
        row = {"variant": name, "train": sum(loss[-window:]) / len(loss[-window:]), "val": r["val_loss"][-1][1],
               "ms": r["ms_per_step"], "speedup": None, "train_diff": None, "val_diff": None}
        if base is not None and name != BASELINE:
            _, a = smooth(loss, window)
            _, b = smooth(base["train_loss"], window)
            row["train_diff"] = max(abs(x - y) for x, y in zip(a, b))
            row["val_diff"] = max(abs(x[1] - y[1]) for x, y in zip(r["val_loss"], base["val_loss"]))
            if row["ms"] and base["ms_per_step"]:
                row["speedup"] = base["ms_per_step"] / row["ms"]
        rows.append(row)
    return rows


def batch_noise(loss, window):
    """The standard deviation of the train loss about its moving average: the step-to-step
    noise of the batches, against which the curves' differences are judged."""
    h, s = smooth(loss, window)
    d = [loss[h + i] - v for i, v in enumerate(s)]
    return math.sqrt(sum(x * x for x in d) / len(d))


def cell(v, width, spec, suffix=""):
    return ("-" if v is None else format(v, spec) + suffix).rjust(width)


def print_table(runs, window):
    print(f"\n{'variant':<16} {'train':>7} {'val':>7} {'ms/step':>8} {'speedup':>8} {'max|dtrain|':>11} "
          f"{'max|dval|':>9}")
    for r in summarise(runs, window):
        print(f"{r['variant']:<16} {r['train']:7.4f} {r['val']:7.4f} {cell(r['ms'], 8, '.2f')} "
              f"{cell(r['speedup'], 8, '.2f', 'x')} {cell(r['train_diff'], 11, '.4f')} {cell(r['val_diff'], 9, '.4f')}")
    first = next(iter(runs.values()))
    print(f"\ntrain: mean train loss of the last {window} steps; val: the last validation loss; "
          f"speedup: {BASELINE}'s ms/step over the variant's;\nmax|dtrain|: the largest difference "
          f"from {BASELINE}'s train loss after a {window}-step moving average; max|dval|: the largest "
          f"difference of the validation losses.")
    if BASELINE in runs and "torch_perturbed" in runs:
        print(f"torch_perturbed: {BASELINE} from a start changed by rounding noise; its distance from {BASELINE} "
              f"is how far two runs of one model drift apart")
    if BASELINE in runs:
        print(f"batch noise ({BASELINE}: std of the train loss about its {window}-step moving average): "
              f"{batch_noise(runs[BASELINE]['train_loss'], window):.4f}")
    c = first["config"]
    print(f"{first['device_name']}, {c['dtype']}, torch {first['torch']}; {first['params'] / 1e6:.1f}M parameters, "
          f"{c['layers']} layers, hidden {c['hidden']}, {c['experts']} experts top-{c['topk']}, ffn {c['ffn']}, "
          f"batch {c['batch']} x seq {c['seq']}, {c['steps']} steps; {first['text']['bytes']} bytes of text")


# ---- the plot ----------------------------------------------------------------------------------

def ticks(lo, hi, n=6):
    """About n round values covering [lo, hi]."""
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if step * m >= raw)
    return [i * step for i in range(math.floor(lo / step), math.ceil(hi / step) + 1)]


def write_svg(path, runs, window, title):
    """Train loss (faint: every step; solid: the moving average) and validation loss (dashed,
    dots) of every run against the step."""
    W, Hh, left, right, top, bottom = 760, 460, 60, 150, 40, 45
    steps = max(len(r["train_loss"]) for r in runs.values())
    values = [v for r in runs.values() for v in r["train_loss"] + [p[1] for p in r["val_loss"]]]
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
    for name, r in reversed(runs.items()):  # the first run (moex) on top
        colour = COLOURS[name]
        loss = r["train_loss"]
        out.append(line([px(s + 1, v) for s, v in enumerate(loss)], colour, 'stroke-opacity="0.25"'))
        h, s = smooth(loss, window)
        out.append(line([px(h + j + 1, v) for j, v in enumerate(s)], colour, 'stroke-width="2"'))
        val = [px(step, v) for step, v in r["val_loss"]]
        out.append(line(val, colour, 'stroke-dasharray="6 4"'))
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in val]
    for i, name in enumerate(runs):
        ly = top + 14 + 20 * i
        out.append(f'<line x1="{W - right + 12}" x2="{W - right + 36}" y1="{ly}" y2="{ly}" stroke="{COLOURS[name]}" '
                   f'stroke-width="2"/>')
        out.append(f'<text x="{W - right + 42}" y="{ly + 4}">{name}</text>')
    ly = top + 14 + 20 * len(runs) + 10
    out.append(f'<text x="{W - right + 12}" y="{ly}" font-size="11">solid: train,</text>')
    out.append(f'<text x="{W - right + 12}" y="{ly + 14}" font-size="11">{window}-step average</text>')
    out.append(f'<text x="{W - right + 12}" y="{ly + 28}" font-size="11">dashed: validation</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True, help="where the JSON of the runs and loss.svg go")
    p.add_argument("--device", default="cuda", help="passed to train.py (default cuda)")
    p.add_argument("--variants", help=f"comma-separated, of {','.join(RUNS)} (default all; torch_gmm on CUDA only)")
    p.add_argument("--read", action="store_true", help="read the runs' JSON in --out-dir instead of training")
    p.add_argument("--smooth", type=int, default=21, help="moving-average window in steps (odd)")
    args, train_args = p.parse_known_args()
    if args.smooth < 1 or args.smooth % 2 == 0:
        p.error("--smooth must be odd")
    if args.variants:
        variants = args.variants.split(",")
        if any(v not in RUNS for v in variants):
            p.error(f"--variants: each one of {', '.join(RUNS)}")
    else:
        variants = [v for v in RUNS if v != "torch_gmm" or args.device.startswith("cuda")]
    os.makedirs(args.out_dir, exist_ok=True)

    runs = {}
    for v in variants:
        path = os.path.join(args.out_dir, f"{v}.json")
        if not args.read:
            subprocess.run([sys.executable, os.path.join(HERE, "train.py")] + RUNS[v] +
                           ["--device", args.device, "--out", path] + train_args, check=True)
        with open(path) as f:
            runs[v] = json.load(f)

    n = min(len(r["train_loss"]) for r in runs.values())
    window = min(args.smooth, n if n % 2 else n - 1)
    print_table(runs, window)
    first = next(iter(runs.values()))
    c = first["config"]
    title = (f"byte-level MoE LM, {os.path.basename(first['text']['dir'])}: {c['layers']} layers, "
             f"hidden {c['hidden']}, {c['experts']} experts top-{c['topk']}, {c['dtype']}, {first['device_name']}")
    svg = os.path.join(args.out_dir, "loss.svg")
    write_svg(svg, runs, window, title)
    print(f"wrote {svg}")


if __name__ == "__main__":
    main()
