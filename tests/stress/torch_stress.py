"""torch_stress.py - a long mixed run of moex calls as a training job makes them, on one device
(CUDA by default), that must end with zero failures: every op of moex.torch forward and
backward (functions, modules with packed and separate weights, routing, the GLU, offsets) and
the C API itself through ctypes (moex._capi), with varied shapes (sizes off the tiles, empty
groups, sum(splits) < T), dtypes (bf16, f16, f32) and split kinds (host lists, device int64
tensors), some on new threads (whose first CUDA work is the moex call), some under no_grad,
with module constructions in between. Each grouped-linear result is checked against an f64
reference (normwise 2e-2 for 16-bit, 1e-4 for f32); every other output must be finite.

Usage: python3 tests/stress/torch_stress.py [--calls N] [--seed S] [--device cuda|cpu]
Prints one line per failure (op, case, error) and a summary; exits 1 on any failure.
scripts/gpu_check.sh's `stress` stage runs it in several fresh processes.
"""
import argparse
import random
import sys
import threading
import traceback

import torch

import moex.torch as mt
from moex import _capi, _torch_ext

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def rand_splits(rng, G, T):
    """G split values summing to at most T, some groups empty."""
    used = rng.randint(0, T)
    cuts = sorted(rng.randint(0, used) for _ in range(G - 1))
    s = [b - a for a, b in zip([0] + cuts, cuts + [used])]
    for g in range(G):
        if rng.random() < 0.2:
            s[g] = 0
    return s


def as_splits(rng, s, dev):
    return list(s) if rng.random() < 0.4 else torch.tensor(s, dtype=torch.int64, device=dev)


def ref_linear(x, w, s, bias=None):
    """y[r] = x[r] w_g^T (+ b_g) in f64 for the rows of each group; rows past sum(s) are 0."""
    y = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float64, device=x.device)
    r = 0
    for g, n in enumerate(s):
        y[r:r + n] = x[r:r + n].double() @ w[g].double().t()
        if bias is not None:
            y[r:r + n] += bias[g].double()
        r += n
    return y


def close(got, want, dtype, rows):
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    g, w = got[:rows].double(), want[:rows]
    return (g - w).norm() <= tol * (w.norm() + 1e-6)


def dims(rng):
    return 8 * rng.randint(1, 40), 8 * rng.randint(1, 40)


def case_grouped_linear(rng, dev):
    G, T = rng.choice((1, 3, 8, 16)), rng.randint(1, 700)
    K, N = dims(rng)
    dt = rng.choice(DTYPES)
    s = rand_splits(rng, G, T)
    x = torch.randn(T, K, device=dev, dtype=dt, requires_grad=True)
    w = (0.1 * torch.randn(G, N, K, device=dev, dtype=dt)).requires_grad_()
    b = torch.randn(G, N, device=dev, dtype=dt, requires_grad=True) if rng.random() < 0.5 else None
    y = mt.grouped_linear(x, w, as_splits(rng, s, dev), bias=b)
    assert close(y, ref_linear(x.detach(), w.detach(), s, None if b is None else b.detach()), dt, sum(s)), \
        "y differs from the f64 reference"
    (y[:sum(s)].float() ** 2).sum().backward()
    assert torch.isfinite(w.grad.float()).all() and torch.isfinite(x.grad[:sum(s)].float()).all()
    return f"G={G} T={T} K={K} N={N} {dt} bias={b is not None} s={s}"


def case_module(rng, dev):
    G, T = rng.choice((1, 4, 8)), rng.randint(1, 600)
    K, N = dims(rng)
    dt = rng.choice(DTYPES)
    packed = rng.random() < 0.5
    layer = mt.GroupedLinear(G, K, N, bias=rng.random() < 0.5, params_dtype=dt, device=dev, packed=packed)
    s = rand_splits(rng, G, T)
    x = torch.randn(T, K, device=dev, dtype=dt, requires_grad=True)
    if rng.random() < 0.3:
        with torch.no_grad():
            y = layer(x, as_splits(rng, s, dev))
    else:
        y = layer(x, as_splits(rng, s, dev))
        y[:sum(s)].float().sum().backward()
    assert torch.isfinite(y[:sum(s)].float()).all()
    return f"GroupedLinear G={G} T={T} K={K} N={N} {dt} packed={packed} s={s}"


def case_gmm(rng, dev):
    G, T = rng.choice((2, 8)), rng.randint(1, 600)
    K, N = dims(rng)
    dt = rng.choice((torch.bfloat16, torch.float16))
    s = rand_splits(rng, G, T)
    trans_b = rng.random() < 0.5
    a = torch.randn(T, K, device=dev, dtype=dt, requires_grad=True)
    b = (0.1 * torch.randn(G, N, K, device=dev, dtype=dt) if trans_b else
         0.1 * torch.randn(G, K, N, device=dev, dtype=dt)).requires_grad_()
    y = mt.gmm(a, b, torch.tensor(s), trans_b=trans_b)   # batch_sizes on the host, as grouped_gemm takes them
    w = b.detach() if trans_b else b.detach().transpose(1, 2)
    assert close(y, ref_linear(a.detach(), w, s), dt, sum(s)), "gmm differs from the f64 reference"
    y[:sum(s)].float().sum().backward()
    return f"gmm G={G} T={T} K={K} N={N} {dt} trans_b={trans_b} s={s}"


def case_mlp(rng, dev):
    G, T = rng.choice((1, 4, 8)), rng.randint(1, 500)
    H, F = 8 * rng.randint(1, 32), 8 * rng.randint(1, 32)
    dt = rng.choice(DTYPES)
    mlp = mt.GroupedMLP(G, H, F, bias1=rng.random() < 0.5, bias2=True, scale_b2=rng.random() < 0.5,
                        params_dtype=dt, device=dev, glu=rng.choice(("swiglu", "clamped_swiglu")))
    s = rand_splits(rng, G, T)
    x = torch.randn(T, H, device=dev, dtype=dt, requires_grad=True)
    p = torch.rand(T, device=dev, requires_grad=True)
    y = mlp(x, as_splits(rng, s, dev), p)
    y[:sum(s)].float().sum().backward()
    assert torch.isfinite(y[:sum(s)].float()).all() and torch.isfinite(p.grad[:sum(s)]).all()
    return f"GroupedMLP G={G} T={T} H={H} F={F} {dt} s={s}"


def case_moe(rng, dev):
    E, T = rng.choice((2, 4, 8, 16)), rng.randint(1, 400)
    H, F = 8 * rng.randint(1, 24), 8 * rng.randint(1, 24)
    k = rng.randint(1, min(E, 4))
    dt = rng.choice(DTYPES)
    moe = mt.MoELayer(E, H, F, topk=k, score=rng.choice(("softmax", "sigmoid")), params_dtype=dt, device=dev)
    x = torch.randn(T, H, device=dev, dtype=dt, requires_grad=True)
    y = moe(x)
    y.float().sum().backward()
    assert torch.isfinite(y.float()).all() and torch.isfinite(x.grad.float()).all()
    return f"MoELayer E={E} T={T} H={H} F={F} k={k} {dt}"


def case_routing(rng, dev):
    E, T = rng.choice((2, 8, 32)), rng.randint(1, 500)
    H = 8 * rng.randint(1, 32)
    k = rng.randint(1, min(E, 4))
    dt = rng.choice(DTYPES)
    logits = torch.randn(T, E, device=dev, requires_grad=True)
    probs, ids = mt.router(logits, k)
    x = torch.randn(T, H, device=dev, dtype=dt, requires_grad=True)
    xp, pp, splits, row_map = mt.permute(x, ids, probs, E)
    z = mt.scaled_glu(torch.cat([xp, xp], dim=1), pp, splits)
    y = mt.unpermute(z, row_map, k)
    y.float().sum().backward()
    offs = mt.splits_to_offsets(splits)
    assert int(offs[-1]) == T * k and torch.isfinite(logits.grad).all()
    return f"routing E={E} T={T} H={H} k={k} {dt}"


def case_capi(rng, dev):
    """moex_grouped_linear_forward through ctypes on torch's tensors, the C API as C callers use it."""
    G, T = rng.choice((1, 3, 8)), rng.randint(1, 600)
    K, N = dims(rng)
    dt = rng.choice(DTYPES)
    s = rand_splits(rng, G, T)
    x = torch.randn(T, K, device=dev, dtype=dt)
    w = 0.1 * torch.randn(G, N, K, device=dev, dtype=dt)
    y = torch.full((T, N), float("nan"), device=dev, dtype=dt)
    splits = torch.tensor(s, dtype=torch.int64, device=dev)
    code = {torch.float32: _capi.DTYPE_F32, torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_F16}[dt]

    def view(t, c):
        v = _capi.Tensor(t.data_ptr(), c, t.dim())
        v.shape[:t.dim()] = t.shape
        return v

    a = _capi.GroupedLinearArgs()
    a.x, a.w.t, a.splits, a.y = view(x, code), view(w, code), view(splits, _capi.DTYPE_I64), view(y, code)
    cuda = dev == "cuda"
    ctx = _capi.context(_capi.BACKEND_CUDA if cuda else _capi.BACKEND_CPU, torch.cuda.current_device() if cuda else 0)
    stream = torch.cuda.current_stream().cuda_stream if cuda else None
    keep = []

    def alloc(n):
        buf = torch.empty(n, dtype=torch.uint8, device=dev)
        keep.append(buf)
        return buf.data_ptr(), buf

    _capi.run(ctx, "grouped_linear_forward", a, alloc, stream)
    assert close(y, ref_linear(x, w, s), dt, sum(s)), "C API y differs from the f64 reference"
    return f"C API G={G} T={T} K={K} N={N} {dt} s={s}"


CASES = [case_grouped_linear, case_module, case_gmm, case_mlp, case_moe, case_routing, case_capi]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    failures, threaded = [], 0
    for i in range(args.calls):
        case = rng.choice(CASES)
        seed = rng.randrange(1 << 30)
        on_thread = rng.random() < 0.25
        box = {}

        def body():
            try:
                box["what"] = case(random.Random(seed), args.device)
                if args.device == "cuda":
                    torch.cuda.synchronize()
            except Exception as e:   # every failure is reported, none stops the run
                box["err"] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"

        if on_thread:
            threaded += 1
            t = threading.Thread(target=body)
            t.start()
            t.join()
        else:
            body()
        if "err" in box:
            failures.append(f"call {i} {case.__name__} seed {seed} thread={on_thread}: {box['err']}")
            print(failures[-1], flush=True)
    path = "the C++ extension" if _torch_ext.PATH else "the ctypes binding"
    print(f"torch_stress: {args.calls} calls ({threaded} on new threads), seed {args.seed}, device {args.device}, "
          f"moex.torch through {path}: {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
