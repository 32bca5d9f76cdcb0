#!/usr/bin/env python3
"""torch_host_time.py - host time per call of moex.torch in eager mode against PyTorch's own
eager code, on tiny shapes (where the device finishes first and the host's time is what a step
costs): issue #30 item 4.

Each call is timed alone (time.perf_counter around it); 300 calls per row after a warm-up, in
groups of 20 with the rows interleaved (a slower spell of the host costs every row alike). On
CUDA the GPU is kept busy before each group (torch.cuda._sleep), so that no call waits for it,
and synchronized after the group, outside the timed calls; 20 calls of at most a few dozen
launches stay under the launch queue's depth. Printed: us per call, the minimum (the call's own
cost) and the median.

Rows (G groups, T rows, K in, N out, F the FFN half, bf16):
  torch._grouped_mm fwd                       the floor: one grouped GEMM through torch
  torch._grouped_mm fwd, separate weights     the same on G separate [N, K] weights, as torch code
                                              holding them calls it (torch.stack, then the GEMM)
  moex.torch.grouped_linear fwd               the function, device-tensor splits
  GroupedLinear fwd, separate weights / packed (weight0.. or one [G, N, K] parameter)
  GroupedLinear fwd+bwd step / torch eager    layer(x, splits).backward(dy) against
                                              torch._grouped_mm's forward + backward (packed
                                              weights, and separate ones through torch.stack:
                                              G gradients for autograd to accumulate, as the
                                              layer's weight0..)
  GroupedMLP fwd+bwd step / torch eager       FC1, p * SwiGLU, FC2 against the same math in eager
                                              PyTorch (_grouped_mm, silu, probs)
  MoELayer fwd+bwd step / torch eager         router, top-k, permute, experts, unpermute against
                                              eager PyTorch (linear, softmax, topk, argsort,
                                              _grouped_mm, silu, index_add)
and the issue's targets: GroupedLinear fwd <= _grouped_mm + 3 us, the GroupedLinear step <= 1.2x
torch's, the GroupedMLP and MoELayer steps <= eager PyTorch's (all on the minimum).

On the CPU (a smoke test; smaller default shapes), torch's grouped GEMM is a loop of F.linear
per group (torch._grouped_mm's CPU backward is not usable), so the torch rows are a different
baseline there.

The header says which path moex.torch's operators take: the compiled extension (python/csrc) or
the ctypes binding (MOEX_TORCH_EXTENSION=0, or no extension built); --compare-ctypes also runs
the ctypes path in a subprocess and prints its table.

Usage: pip install ./python, then
  python3 bench/torch_host_time.py [--device cuda|cpu] [--calls 300] [--shape G,T,K,N,F] [--compare-ctypes]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import moex._torch_ext as ext
import moex.torch as mt

GROUP = 20   # calls per timed group (under the GPU's launch queue depth)
WARMUP = 10


class Timer:
    """Per-call host times of several functions, interleaved; on CUDA the GPU is kept busy."""

    def __init__(self, device: str, calls: int):
        self.cuda = device == "cuda"
        self.calls = calls

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def busy(self):
        if self.cuda:
            torch.cuda._sleep(int(2e8))   # the GPU stays busy: every call below returns at host speed

    def run(self, fns):
        """{name: (min, median) us} of `fns` {name: fn or (before, fn)}: `before` runs untimed
        before each call (e.g. clearing gradients)."""
        fns = {name: f if isinstance(f, tuple) else (None, f) for name, f in fns.items()}
        for before, fn in fns.values():
            for _ in range(WARMUP):
                if before:
                    before()
                fn()
        self.sync()
        times = {name: [] for name in fns}
        for _ in range(max(1, self.calls // GROUP)):
            for name, (before, fn) in fns.items():
                self.busy()
                for _ in range(GROUP):
                    if before:
                        before()
                    t0 = time.perf_counter()
                    fn()
                    times[name].append((time.perf_counter() - t0) * 1e6)
                self.sync()
        return {name: (min(t), statistics.median(t)) for name, t in times.items()}


def clear(*tensors):
    def before():
        for t in tensors:
            t.grad = None
    return before


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--shape", default=None, help="G,T,K,N,F (default 8,256,128,256,128 on CUDA, 4,32,32,32,16 on CPU)")
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--compare-ctypes", action="store_true", help="also run the ctypes path (a subprocess)")
    args = ap.parse_args()
    dev = args.device
    G, T, K, N, F_ = map(int, (args.shape or ("8,256,128,256,128" if dev == "cuda" else "4,32,32,32,16")).split(","))
    dt = torch.bfloat16
    torch.manual_seed(0)
    timer = Timer(dev, args.calls)

    splits_list = [T // G] * (G - 1) + [T - (T // G) * (G - 1)]
    splits = torch.tensor(splits_list, device=dev)
    offs = torch.cumsum(splits, 0).to(torch.int32)

    def torch_gmm(a, w):
        """a [T, K] @ w_g^T per group: torch._grouped_mm on CUDA, a loop of F.linear on the CPU."""
        if dev == "cuda":
            return torch._grouped_mm(a, w.transpose(1, 2), offs=offs)
        return torch.cat([F.linear(part, w[g]) for g, part in enumerate(torch.split(a, splits_list))])

    gmm_name = "torch._grouped_mm" if dev == "cuda" else "torch F.linear loop"
    x = torch.randn(T, K, device=dev, dtype=dt)
    dy = torch.randn(T, N, device=dev, dtype=dt)
    sep = mt.GroupedLinear(G, K, N, bias=False, params_dtype=dt, device=dev)
    packed = mt.GroupedLinear(G, K, N, bias=False, params_dtype=dt, device=dev, packed=True)
    w = packed.weight.detach().clone()
    ws = [w[g].clone() for g in range(G)]
    rows = {}

    with torch.no_grad():
        rows.update(timer.run({
            f"{gmm_name} fwd": lambda: torch_gmm(x, w),
            f"{gmm_name} fwd, separate weights": lambda: torch_gmm(x, torch.stack(ws)),
            "moex.torch.grouped_linear fwd": lambda: mt.grouped_linear(x, w, splits),
            "GroupedLinear fwd, separate weights": lambda: sep(x, splits),
            "GroupedLinear fwd, packed": lambda: packed(x, splits)}))

    xg = x.clone().requires_grad_(True)
    wg = w.clone().requires_grad_(True)
    wsg = [t.clone().requires_grad_(True) for t in ws]
    rows.update(timer.run({
        "GroupedLinear fwd+bwd step, packed": (clear(xg, packed.weight), lambda: packed(xg, splits).backward(dy)),
        "GroupedLinear fwd+bwd step, separate weights": (clear(xg, *sep.parameters()),
                                                         lambda: sep(xg, splits).backward(dy)),
        f"torch eager fwd+bwd step ({gmm_name})": (clear(xg, wg), lambda: torch_gmm(xg, wg).backward(dy)),
        f"torch eager fwd+bwd step ({gmm_name}), separate weights": (
            clear(xg, *wsg), lambda: torch_gmm(xg, torch.stack(wsg)).backward(dy))}))

    mlp = mt.GroupedMLP(G, K, F_, params_dtype=dt, device=dev)
    probs = torch.rand(T, device=dev)
    gy = torch.randn(T, K, device=dev, dtype=dt)
    w1 = mlp.w1.detach().clone().requires_grad_(True)
    w2 = mlp.w2.detach().clone().requires_grad_(True)

    def torch_mlp_step():
        h = torch_gmm(xg, w1)
        a, b = h.float().chunk(2, dim=1)
        z = (F.silu(a) * b * probs[:, None]).to(dt)
        torch_gmm(z, w2).backward(gy)

    rows.update(timer.run({"GroupedMLP fwd+bwd step": (clear(xg, *mlp.parameters()),
                                                       lambda: mlp(xg, splits, probs).backward(gy)),
                           "torch eager MLP fwd+bwd step": (clear(xg, w1, w2), torch_mlp_step)}))

    E, k = G, args.topk
    moe = mt.MoELayer(E, K, F_, topk=k, params_dtype=dt, device=dev)
    rw = moe.router_w.detach().clone().requires_grad_(True)
    mw1 = moe.w1.detach().clone().requires_grad_(True)
    mw2 = moe.w2.detach().clone().requires_grad_(True)

    def torch_moe_step():
        """The MoE layer as plain eager PyTorch: softmax top-k renormalised, tokens sorted by
        expert, the experts' MLPs as grouped GEMMs, the weighted sum back per token."""
        logits = F.linear(xg.float(), rw.float())
        p, ids = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
        p = p / p.sum(dim=-1, keepdim=True)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        token = order // k
        counts = torch.bincount(flat, minlength=E)
        if dev == "cuda":
            o = torch.cumsum(counts, 0).to(torch.int32)
            gmm = lambda a, wt: torch._grouped_mm(a, wt.transpose(1, 2), offs=o)   # noqa: E731
        else:
            sizes = counts.tolist()
            gmm = lambda a, wt: torch.cat([F.linear(part, wt[e]) for e, part in enumerate(torch.split(a, sizes))])  # noqa: E731
        h = gmm(xg[token], mw1)
        a, b = h.float().chunk(2, dim=1)
        z = (F.silu(a) * b * p.flatten()[order][:, None]).to(dt)
        y = torch.zeros_like(xg).index_add(0, token, gmm(z, mw2))
        y.backward(gy)

    rows.update(timer.run({"MoELayer fwd+bwd step": (clear(xg, *moe.parameters()), lambda: moe(xg).backward(gy)),
                           "torch eager MoE fwd+bwd step": (clear(xg, rw, mw1, mw2), torch_moe_step)}))

    name = torch.cuda.get_device_name() if dev == "cuda" else "CPU"
    path = f"C++ extension ({ext.PATH})" if ext.PATH else f"ctypes binding (extension: {ext.LOAD_ERROR})"
    print(f"host us per call, G={G} T={T} K={K} N={N} F={F_} topk={k} bf16, {name}, torch {torch.__version__}")
    print(f"moex.torch operators: {path}")
    print(f"  {'':62s} {'min':>8s} {'median':>8s}")
    for row, (low, mid) in rows.items():
        print(f"  {row:62s} {low:8.1f} {mid:8.1f}")

    def lo(row):
        return rows[row][0]

    print("targets (issue #30 item 4, on the minimum):")
    fwd, sep_fwd = lo(f"{gmm_name} fwd"), lo(f"{gmm_name} fwd, separate weights")
    print(f"  GroupedLinear fwd, packed - {gmm_name} fwd = {lo('GroupedLinear fwd, packed') - fwd:+.1f} us "
          f"(separate weights {lo('GroupedLinear fwd, separate weights') - fwd:+.1f}; against torch on separate "
          f"weights {lo('GroupedLinear fwd, separate weights') - sep_fwd:+.1f}); target <= +3")
    step = lo(f"torch eager fwd+bwd step ({gmm_name})")
    sep_step = lo(f"torch eager fwd+bwd step ({gmm_name}), separate weights")
    print(f"  GroupedLinear step / torch step = {lo('GroupedLinear fwd+bwd step, packed') / step:.2f} "
          f"(separate weights {lo('GroupedLinear fwd+bwd step, separate weights') / step:.2f}; against torch on "
          f"separate weights {lo('GroupedLinear fwd+bwd step, separate weights') / sep_step:.2f}); target <= 1.2")
    print(f"  GroupedMLP step / eager = {lo('GroupedMLP fwd+bwd step') / lo('torch eager MLP fwd+bwd step'):.2f}; "
          "target <= 1.0")
    print(f"  MoELayer step / eager = {lo('MoELayer fwd+bwd step') / lo('torch eager MoE fwd+bwd step'):.2f}; "
          "target <= 1.0")
    sys.stdout.flush()

    if args.compare_ctypes:
        print("\n---- the same through the ctypes binding (MOEX_TORCH_EXTENSION=0) ----", flush=True)
        argv = [a for a in sys.argv[1:] if a != "--compare-ctypes"]
        subprocess.run([sys.executable, os.path.abspath(__file__), *argv],
                       env={**os.environ, "MOEX_TORCH_EXTENSION": "0"}, check=True)


if __name__ == "__main__":
    main()
