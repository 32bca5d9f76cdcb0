#!/usr/bin/env python3
"""gemm_bench.py - the three GEMMs of moex's grouped linear layer against PyTorch, in one run.

What it measures (one H200, bf16, the CUDA configs of tools/bench_configs.h, balanced and
skewed splits), for every (config, splits, op):

  op         moex (public API, ctypes)            torch                                   dense ceiling
  fwd        grouped_linear_forward, BIAS_NONE    _grouped_mm(x, w^T, offs)     2d-3d     mm([T,K] x [K,N])
  dgrad      grouped_linear_backward_data (dx)    _grouped_mm(dy, w, offs)      2d-3d     mm([T,N] x [N,K])
  wgrad      grouped_linear_backward_weight,      _grouped_mm(dy^T, x, offs)    2d-2d     mm([N,T] x [T,K])
             dw_mode WRITE, dw bf16 [G,N,K]       (dy^T: a transposed view of dy [T,N])
  fwd_bias   forward, BIAS_ADD (bias [G,N] bf16)  _grouped_mm + bias[group_of_row]         as fwd
  fwd_sbias  forward, BIAS_SCALED (probs [T] f32) _grouped_mm + probs[:,None] * bias[group_of_row]   as fwd

plus the per-expert loop (one torch.mm / addmm per non-empty group on row slices; wgrad
writes dy_g^T x_g into a zeroed [G,N,K] tensor; fwd_sbias adds the same eager epilogue as
the torch column after the loop). TFLOP/s = 2*T*K*N / time for every op (T = sum(splits)).

How: all four functions of one (config, splits, op) are launched back to back in rotating
order, so clock and temperature drift hit them alike; each launch is timed by its own CUDA
events; medians are reported. Before each timed launch a spin kernel (torch.cuda._sleep)
keeps the GPU busy for longer than the function's host launch time, so a host-bound
function (the loop over 128 experts) never leaves the GPU idle inside another function's
timed window: every column is GPU time (the JSON also records each function's host time per
call, <f>_host_us, measured before the timed launches). Inputs are random (x, dy ~ randn, w ~ randn*0.02,
bias ~ randn, probs ~ U[0,1)); skewed splits are Dirichlet(0.5) with one empty group, drawn
by make_splits below (numpy RNG seeded 1000+G). Correctness: relative
Frobenius error of moex's output (poisoned with NaN first) against torch's; rows with
relerr > 2e-2 are marked BAD and make the exit status 1. A moex status != 0 raises with
moex_last_error.

Usage (GPU machine, repository root, libmoex.so built with CUDA):
    python3 bench/gemm_bench.py --lib build-gpu/libmoex.so --out $OUT
        [--configs dsv3-fc1,...] [--ops fwd,dgrad,wgrad,fwd_bias,fwd_sbias] [--iters N] [--json PATH]
        [--lib-baseline OLD/libmoex.so]
--torch-path adds the same op through moex.torch (the user's path: the extension's operator,
its outputs and workspace from torch's allocator, the rows past sum(splits) zeroed) as the
columns "mt TF" and "mt/moex" (its speed over the ctypes call with a kept workspace; JSON mt_ms,
mt_tflops, mt_over_moex, relerr_mt). --profile prints, per row, the GPU kernels and the CUDA
runtime calls of one moex call and (with --torch-path) one moex.torch call (torch.profiler).
--lib-baseline adds a fifth function to every rotation: the same moex call through another
build of the library (loaded beside --lib in the same process, writing its own output), as
the columns "base TF" and "moex/base" (speed of --lib over the baseline) and the JSON fields
moex_base_ms, moex_base_tflops, moex_over_base, relerr_base (scripts/compare_builds.sh).
--cpu times only the moex column (and moex_base) on the CPU backend, f32, by the wall clock in
the same rotation, on the CPU configs of tools/bench_configs.h (default tiny): the timing and
the comparison without a GPU or torch (skewed splits need numpy; without it, balanced only).
The structs of moex.h come from moex._capi (python/moex/_capi.py of this tree, loaded with --lib
as its library; tests/abi checks its layout against the header).
Checks without a GPU or torch (the CPU library, e.g. build-bench/libmoex.so):
    python3 bench/gemm_bench.py --selftest-cpu --lib build-bench/libmoex.so
    python3 bench/gemm_bench.py --cpu --lib NEW/libmoex.so --lib-baseline OLD/libmoex.so --out DIR
"""
import argparse
import ctypes
import importlib.util
import json
import math
import os
import random
import statistics
import sys
import time

from configs import select   # tools/bench_configs.h, the one list of benchmark configs

CONFIGS = {c.name: (c.G, c.T, c.K, c.N) for c in select("CUDA").values()}  # name: G, T, K, N
CPU_CONFIGS = {c.name: (c.G, c.T, c.K, c.N) for c in select("CPU").values()}   # --cpu
OPS = ("fwd", "dgrad", "wgrad", "fwd_bias", "fwd_sbias")
KINDS = ("balanced", "skewed")
RELERR_BAD = 2e-2

# ---- moex.h through moex._capi ---------------------------------------------------------------

capi = None   # moex._capi: load_capi sets it once --lib is known


def load_capi(lib_path):
    """Imports moex._capi (the tree's one mirror of moex.h's structs) from python/ beside this
    folder, with lib_path as the library it loads."""
    global capi
    os.environ["MOEX_LIBRARY"] = lib_path
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from moex import _capi
    capi = _capi


# op name -> the stem of its public functions (moex_<stem>, moex_<stem>_workspace_size; the
# args struct is capi.OPS[stem])
MOEX_OPS = {"forward": "grouped_linear_forward", "backward_data": "grouped_linear_backward_data",
            "backward_weight": "grouped_linear_backward_weight"}
# op name -> the args field it writes
MOEX_OUT = {"forward": "y", "backward_data": "dx", "backward_weight": "dw"}


def mtensor(ptr, dtype, *shape):
    """A moex_tensor view of `shape` at address ptr (what moex_tensor_2d etc. build in C)."""
    t = capi.Tensor()
    t.data, t.dtype, t.ndim = ptr, dtype, len(shape)
    for i, s in enumerate(shape):
        t.shape[i] = s
    return t


def packed(t):
    """moex_weight_packed(t)."""
    return capi.Weight(t, None)


class Moex:
    """libmoex.so, one context, and the three grouped-linear calls with their workspaces."""

    def __init__(self, lib_path, backend, device=0, stream=0):
        self.lib = lib = ctypes.CDLL(lib_path)
        lib.moex_version_string.restype = ctypes.c_char_p
        lib.moex_status_string.restype = ctypes.c_char_p
        lib.moex_status_string.argtypes = [ctypes.c_int]
        lib.moex_last_error.restype = ctypes.c_char_p
        lib.moex_last_error.argtypes = [ctypes.c_void_p]
        lib.moex_context_create.restype = ctypes.c_int
        lib.moex_context_create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        lib.moex_context_destroy.argtypes = [ctypes.c_void_p]
        lib.moex_context_check_splits.restype = ctypes.c_int
        lib.moex_context_check_splits.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.fn = {}
        for op, stem in MOEX_OPS.items():
            S = capi.OPS[stem]
            run = getattr(lib, "moex_" + stem)
            run.restype = ctypes.c_int
            run.argtypes = [ctypes.c_void_p, ctypes.POINTER(S), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            size = getattr(lib, f"moex_{stem}_workspace_size")
            size.restype = ctypes.c_int
            size.argtypes = [ctypes.c_void_p, ctypes.POINTER(S), ctypes.POINTER(ctypes.c_size_t)]
            self.fn[op] = (run, size)
        ctx = ctypes.c_void_p()
        st = lib.moex_context_create(ctypes.byref(ctx), backend, device)
        if st != 0:
            raise RuntimeError(f"moex_context_create: {self.status(st)}: {lib.moex_last_error(None).decode()}")
        self.ctx = ctx
        self.stream = ctypes.c_void_p(stream or None)

    def version(self):
        return self.lib.moex_version_string().decode()

    def status(self, st):
        return self.lib.moex_status_string(st).decode()

    def check(self, st, what):
        if st != 0:
            raise RuntimeError(f"{what}: {self.status(st)}: {self.lib.moex_last_error(self.ctx).decode()}")

    def workspace_size(self, op, args):
        n = ctypes.c_size_t()
        self.check(self.fn[op][1](self.ctx, ctypes.byref(args), ctypes.byref(n)), f"{op}_workspace_size")
        return n.value

    def call(self, op, args, ws_ptr, ws_bytes):
        """Runs op; returns its status (0 = MOEX_OK) without raising."""
        return self.fn[op][0](self.ctx, ctypes.byref(args), ws_ptr, ws_bytes, self.stream)

    def run(self, op, args, ws_ptr, ws_bytes):
        self.check(self.call(op, args, ws_ptr, ws_bytes), "moex_" + MOEX_OPS[op])

    def check_splits(self):
        self.check(self.lib.moex_context_check_splits(self.ctx, self.stream), "moex_context_check_splits")

    def close(self):
        self.lib.moex_context_destroy(self.ctx)
        self.ctx = None


# ---- --selftest-cpu: all five ops through the CPU backend, pure Python reference ----------

class HostBuf:
    """A zero-initialised f32 (or int64) host array that moex reads or writes."""

    def __init__(self, n, ctype=ctypes.c_float, values=None):
        self.arr = (ctype * max(n, 1))()
        if values is not None:
            for i, v in enumerate(values):
                self.arr[i] = v
        self.ptr = ctypes.addressof(self.arr)

    def list(self, n):
        return list(self.arr[:n])


def selftest_cpu(lib_path):
    """T=37, G=3 (splits 15, 0, 19: an empty group and 3 tail rows), K=24, N=16, f32. Checks
    each op against a float64 Python reference, tail rows and the empty group of dW poisoned."""
    T, G, K, N = 37, 3, 24, 16
    splits = [15, 0, 19]
    used = sum(splits)
    rng = random.Random(0)
    rnd = lambda n, s=1.0: [rng.uniform(-s, s) for _ in range(n)]  # noqa: E731
    x, dy, w, bias = rnd(T * K), rnd(T * N), rnd(G * N * K, 0.2), rnd(G * N)
    probs = [rng.random() for _ in range(T)]
    group = [g for g, s in enumerate(splits) for _ in range(s)]  # group of each used row
    POISON = 777.0
    mx = Moex(lib_path, capi.BACKEND_CPU)
    bx, bdy, bw = HostBuf(T * K, values=x), HostBuf(T * N, values=dy), HostBuf(G * N * K, values=w)
    bb, bp = HostBuf(G * N, values=bias), HostBuf(T, values=probs)
    bs = HostBuf(G, ctypes.c_int64, splits)
    F32 = capi.DTYPE_F32
    tx, tdy, tb, tp = (mtensor(bx.ptr, F32, T, K), mtensor(bdy.ptr, F32, T, N),
                       mtensor(bb.ptr, F32, G, N), mtensor(bp.ptr, F32, T))
    tw, ts = packed(mtensor(bw.ptr, F32, G, N, K)), mtensor(bs.ptr, capi.DTYPE_I64, G)
    absent = capi.Tensor()

    def fwd_ref(mode):
        out = []
        for r in range(used):
            g = group[r]
            for n in range(N):
                v = sum(x[r * K + k] * w[(g * N + n) * K + k] for k in range(K))
                v += bias[g * N + n] * (1.0 if mode == capi.BIAS_ADD else probs[r] if mode == capi.BIAS_SCALED else 0.0)
                out.append(v)
        return out

    def dgrad_ref():
        return [sum(dy[r * N + n] * w[(group[r] * N + n) * K + k] for n in range(N))
                for r in range(used) for k in range(K)]

    def wgrad_ref():
        off = [sum(splits[:g]) for g in range(G)]
        return [sum(dy[r * N + n] * x[r * K + k] for r in range(off[g], off[g] + splits[g]))
                for g in range(G) for n in range(N) for k in range(K)]

    def run(op, args, out, n_out):
        ws = HostBuf(mx.workspace_size(op, args) // 4 + 1)
        mx.run(op, args, ws.ptr, len(ws.arr) * 4)
        return out.list(n_out)

    def compare(name, got, ref, tail):
        scale = max(1.0, max(abs(v) for v in ref))
        err = max(abs(a - b) for a, b in zip(got, ref)) / scale
        tail_ok = all(v == POISON for v in tail)
        ok = err < 1e-5 and tail_ok
        print(f"selftest-cpu {name:<10} max err/scale {err:.2e}  untouched tail {tail_ok}  {'ok' if ok else 'FAIL'}")
        return ok

    ok = True
    for name, mode in (("fwd", capi.BIAS_NONE), ("fwd_bias", capi.BIAS_ADD), ("fwd_sbias", capi.BIAS_SCALED)):
        y = HostBuf(T * N, values=[POISON] * (T * N))
        a = capi.GroupedLinearArgs(tx, tw, mode, tb if mode else absent, tp if mode == capi.BIAS_SCALED else absent,
                              ts, mtensor(y.ptr, F32, T, N))
        got = run("forward", a, y, T * N)
        ok &= compare(name, got[:used * N], fwd_ref(mode), got[used * N:])
    dx = HostBuf(T * K, values=[POISON] * (T * K))
    a = capi.GroupedLinearDgradArgs(tdy, tw, capi.BIAS_NONE, absent, absent, ts, mtensor(dx.ptr, F32, T, K),
                               absent, absent)
    got = run("backward_data", a, dx, T * K)
    ok &= compare("dgrad", got[:used * K], dgrad_ref(), got[used * K:])
    dw = HostBuf(G * N * K, values=[POISON] * (G * N * K))  # WRITE must also zero the empty group
    a = capi.GroupedLinearWgradArgs(tx, tdy, ts, capi.GRAD_WRITE, packed(mtensor(dw.ptr, F32, G, N, K)))
    ok &= compare("wgrad", run("backward_weight", a, dw, G * N * K), wgrad_ref(), [])
    # the error path: y of the wrong shape must fail with a message and leave y untouched
    y = HostBuf(T * N, values=[POISON] * (T * N))
    a = capi.GroupedLinearArgs(tx, tw, capi.BIAS_NONE, absent, absent, ts, mtensor(y.ptr, F32, T, N + 1))
    st = mx.call("forward", a, None, 0)
    msg = mx.lib.moex_last_error(mx.ctx).decode()
    err_ok = st != 0 and msg != "" and all(v == POISON for v in y.list(T * N))
    print(f"selftest-cpu bad shape  status {mx.status(st)}: \"{msg}\"  {'ok' if err_ok else 'FAIL'}")
    mx.close()
    ok &= err_ok
    print("selftest-cpu:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


# ---- splits and timing -------------------------------------------------------------------

def make_splits(G, T, kind):
    """Balanced, or Dirichlet(0.5) (numpy RNG seeded 1000 + G) with group 2 emptied."""
    if kind == "balanced":
        s = [T // G] * G
        s[-1] += T - sum(s)
        return s
    import numpy as np
    p = np.random.default_rng(1000 + G).dirichlet([0.5] * G)
    s = [int(v) for v in np.floor(p * T)]
    s[0] += T - sum(s)
    if G > 2:
        s[1] += s[2]
        s[2] = 0
    return s


class Spinner:
    """Keeps the GPU busy for `us` microseconds with torch.cuda._sleep (calibrated once)."""

    def __init__(self, torch):
        self.torch = torch
        self.cycles_per_us = 0.0
        if not hasattr(torch.cuda, "_sleep"):
            return
        torch.cuda._sleep(1000)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(20_000_000)
        b.record()
        torch.cuda.synchronize()
        self.cycles_per_us = 20_000_000 / (a.elapsed_time(b) * 1000.0)

    def spin(self, us):
        if self.cycles_per_us > 0 and us > 0:
            self.torch.cuda._sleep(int(us * self.cycles_per_us))


def host_us(torch, fn, reps=3):
    """Median host time of one call of fn (its launches only; the GPU runs on)."""
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)


def bench_interleaved(torch, spinner, fns, iters, warm=3, host=None):
    """Median ms of each of fns (name -> callable): launched back to back in rotating order,
    each launch timed by its own CUDA events, each preceded by a spin longer than its host
    launch time so that the GPU never waits for the host inside a timed window. The host
    times (us per call) go into the dict `host` when one is given."""
    names = list(fns)
    for n in names:
        for _ in range(warm):
            fns[n]()
    hus = {n: host_us(torch, fns[n]) for n in names}
    if host is not None:
        host.update(hus)
    spin_us = {n: 1.5 * hus[n] + 50.0 for n in names}
    ev = {n: [] for n in names}
    for i in range(iters):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            spinner.spin(spin_us[n])
            a.record()
            fns[n]()
            b.record()
            ev[n].append((a, b))
    torch.cuda.synchronize()
    return {n: statistics.median(a.elapsed_time(b) for a, b in ev[n]) for n in names}


# ---- the GPU benchmark -----------------------------------------------------------------

def ttensor(t):
    """moex_tensor view of a contiguous torch tensor."""
    import torch
    dt = {torch.float32: capi.DTYPE_F32, torch.bfloat16: capi.DTYPE_BF16, torch.float16: capi.DTYPE_F16,
          torch.int32: capi.DTYPE_I32, torch.int64: capi.DTYPE_I64}[t.dtype]
    if not t.is_contiguous():
        raise ValueError("moex tensors are dense row-major: pass a contiguous tensor")
    return mtensor(t.data_ptr(), dt, *t.shape)


class Splits:
    """One split vector on the device: int64 splits (moex), int32 inclusive offsets (torch),
    the group of every row (eager bias epilogues) and the host row ranges (the loop)."""

    def __init__(self, torch, s, dev="cuda"):
        self.s = s
        self.sd = torch.tensor(s, device=dev, dtype=torch.int64)
        self.offs = self.sd.cumsum(0).to(torch.int32)
        self.gid = torch.repeat_interleave(torch.arange(len(s)), torch.tensor(s)).to(dev)
        bounds, a = [], 0
        for g, n in enumerate(s):
            if n > 0:
                bounds.append((g, a, a + n))
            a += n
        self.bounds = bounds  # (group, first row, end row) of every non-empty group


def moex_fn(torch, mx, op, args, out):
    """A function that runs one moex op (workspace allocated once here) and returns `out`."""
    nbytes = mx.workspace_size(op, args)
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    ptr = ws.data_ptr() if nbytes else None

    def run():
        mx.run(op, args, ptr, nbytes)
        return out
    run.workspace, run.out, run.op, run.args = ws, out, op, args  # kept alive with the function
    return run


def baseline_fn(torch, mxb, run):
    """The call of moex_fn `run` through the baseline library mxb, writing its own output."""
    out = torch.empty_like(run.out)
    args = type(run.args).from_buffer_copy(run.args)
    t = ttensor(out)
    setattr(args, MOEX_OUT[run.op], packed(t) if run.op == "backward_weight" else t)
    return moex_fn(torch, mxb, run.op, args, out)


def forward_fns(torch, mx, d, sp, mode):
    """fwd / fwd_bias / fwd_sbias: y = x W_g^T (+ b_g | + p_i b_g)."""
    x, w, bias, probs = d["x"], d["w"], d["bias"], d["probs"]
    T, N = x.shape[0], w.shape[1]
    wt = w.transpose(-2, -1)
    y_m = torch.empty(T, N, device="cuda", dtype=x.dtype)
    y_l = torch.empty_like(y_m)
    y_d = torch.empty_like(y_m)
    args = capi.GroupedLinearArgs(ttensor(x), packed(ttensor(w)), mode,
                             ttensor(bias) if mode != capi.BIAS_NONE else capi.Tensor(),
                             ttensor(probs) if mode == capi.BIAS_SCALED else capi.Tensor(),
                             ttensor(sp.sd), ttensor(y_m))
    x_g = [(g, x[a:b], y_l[a:b]) for g, a, b in sp.bounds]

    if mode == capi.BIAS_NONE:
        def tfn():
            return torch._grouped_mm(x, wt, offs=sp.offs)

        def loop():
            for g, xs, ys in x_g:
                torch.mm(xs, w[g].t(), out=ys)
            return y_l
    elif mode == capi.BIAS_ADD:
        def tfn():
            return torch._grouped_mm(x, wt, offs=sp.offs) + bias[sp.gid]

        def loop():
            for g, xs, ys in x_g:
                torch.addmm(bias[g], xs, w[g].t(), out=ys)
            return y_l
    else:
        def tfn():
            return (torch._grouped_mm(x, wt, offs=sp.offs) + probs[:, None] * bias[sp.gid]).to(x.dtype)

        def loop():
            for g, xs, ys in x_g:
                torch.mm(xs, w[g].t(), out=ys)
            return (y_l + probs[:, None] * bias[sp.gid]).to(x.dtype)

    def dense():
        return torch.mm(x, w[0].t(), out=y_d)
    return {"moex": moex_fn(torch, mx, "forward", args, y_m), "torch": tfn, "loop": loop, "dense": dense}


def dgrad_fns(torch, mx, d, sp):
    """dgrad: dx = dy W_g (dx only)."""
    dy, w = d["dy"], d["w"]
    T, K = dy.shape[0], w.shape[2]
    dx_m = torch.empty(T, K, device="cuda", dtype=dy.dtype)
    dx_l = torch.empty_like(dx_m)
    dx_d = torch.empty_like(dx_m)
    args = capi.GroupedLinearDgradArgs(ttensor(dy), packed(ttensor(w)), capi.BIAS_NONE, capi.Tensor(), capi.Tensor(),
                                  ttensor(sp.sd), ttensor(dx_m), capi.Tensor(), capi.Tensor())
    dy_g = [(g, dy[a:b], dx_l[a:b]) for g, a, b in sp.bounds]

    def loop():
        for g, dys, dxs in dy_g:
            torch.mm(dys, w[g], out=dxs)
        return dx_l
    return {"moex": moex_fn(torch, mx, "backward_data", args, dx_m),
            "torch": lambda: torch._grouped_mm(dy, w, offs=sp.offs),
            "loop": loop,
            "dense": lambda: torch.mm(dy, w[0], out=dx_d)}


def wgrad_fns(torch, mx, d, sp):
    """wgrad: dW_g = dy_g^T x_g, written in bf16 (empty groups: zeros)."""
    x, dy, w = d["x"], d["dy"], d["w"]
    G, N, K = w.shape
    dw_m = torch.empty(G, N, K, device="cuda", dtype=x.dtype)
    dw_l = torch.zeros_like(dw_m)  # the loop skips empty groups: they stay zero
    dw_d = torch.empty(N, K, device="cuda", dtype=x.dtype)
    args = capi.GroupedLinearWgradArgs(ttensor(x), ttensor(dy), ttensor(sp.sd), capi.GRAD_WRITE,
                                  packed(ttensor(dw_m)))
    dyt = dy.t()  # [N, T], a transposed (column-major) view: torch's 2d-2d operand
    slices = [(dy[a:b].t(), x[a:b], dw_l[g]) for g, a, b in sp.bounds]

    def loop():
        for dyts, xs, dws in slices:
            torch.mm(dyts, xs, out=dws)
        return dw_l
    return {"moex": moex_fn(torch, mx, "backward_weight", args, dw_m),
            "torch": lambda: torch._grouped_mm(dyt, x, offs=sp.offs),
            "loop": loop,
            "dense": lambda: torch.mm(dyt, x, out=dw_d)}


def torch_path_fn(torch, op, d, sp):
    """The op through moex.torch's operators (python/moex/torch/_linear.py), as autograd calls
    them: fwd* the forward, dgrad the backward data (dx only), wgrad the backward weight (bf16)."""
    from moex.torch import _linear
    x, dy, w, bias, probs = d["x"], d["dy"], d["w"], d["bias"], d["probs"]
    if op == "dgrad":
        return lambda: _linear._backward_data(dy, w, sp.sd, None, None, capi.BIAS_NONE, True, False, False)[0]
    if op == "wgrad":
        return lambda: _linear._backward_weight(x, dy, sp.sd, capi.DTYPE_BF16)
    mode = {"fwd": capi.BIAS_NONE, "fwd_bias": capi.BIAS_ADD, "fwd_sbias": capi.BIAS_SCALED}[op]
    return lambda: _linear._forward(x, w, sp.sd, bias if mode != capi.BIAS_NONE else None,
                                    probs if mode == capi.BIAS_SCALED else None, mode)


def profile_row(torch, fns, names):
    """Prints the GPU kernels (name, us) and the CUDA runtime calls of one call of each of
    fns[names] (after the warm-up the timing did), by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    for n in names:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fns[n]()
            torch.cuda.synchronize()
        kern, api = [], {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kern.append(f"{e.name[:60]} {e.device_time:.1f}")
            elif e.name.startswith("cuda") and e.name != "cudaDeviceSynchronize":
                api[e.name] = api.get(e.name, 0) + 1
        print(f"  profile {n}: kernels (us): {' | '.join(kern)}", flush=True)
        print(f"  profile {n}: runtime calls: {', '.join(f'{k} x{v}' for k, v in sorted(api.items()))}", flush=True)


def op_fns(torch, mx, op, d, sp):
    if op == "fwd":
        return forward_fns(torch, mx, d, sp, capi.BIAS_NONE)
    if op == "fwd_bias":
        return forward_fns(torch, mx, d, sp, capi.BIAS_ADD)
    if op == "fwd_sbias":
        return forward_fns(torch, mx, d, sp, capi.BIAS_SCALED)
    if op == "dgrad":
        return dgrad_fns(torch, mx, d, sp)
    return wgrad_fns(torch, mx, d, sp)


def relerr(a, b):
    """||a - b||_F / ||b||_F, in f32."""
    return float((a.float() - b.float()).norm() / b.float().norm())


def check_outputs(torch, mx, fns):
    """relerr of moex (output poisoned with NaN first) and of the loop against torch; with a
    baseline function, the third value is its relerr (else None)."""
    base = fns.get("moex_base")
    for f in ("moex", "moex_base"):
        if f in fns:
            fns[f].out.fill_(float("nan"))
    got, ref, loop = fns["moex"](), fns["torch"](), fns["loop"]()
    got_base = base() if base else None
    got_mt = fns["mt"]() if "mt" in fns else None
    torch.cuda.synchronize()
    mx.check_splits()
    return (relerr(got, ref), relerr(loop, ref), relerr(got_base, ref) if base else None,
            relerr(got_mt, ref) if got_mt is not None else None)


def is_bad(r):
    return not (r["relerr"] <= RELERR_BAD and r.get("relerr_base", 0.0) <= RELERR_BAD
                and r.get("relerr_mt", 0.0) <= RELERR_BAD)


def row_line(r):
    """A table row; with a baseline, its TF and moex/base after the relerr; with --torch-path,
    mt TF and mt/moex."""
    base = f" {r['moex_base_tflops']:>8.0f} {r['moex_over_base']:>9.3f}" if "moex_base_ms" in r else ""
    if "mt_ms" in r:
        base += f" {r['mt_tflops']:>8.0f} {r['mt_over_moex']:>8.3f}"
    bad = "  BAD" if is_bad(r) else ""
    return (f"{r['config']:<14} {r['splits']:<8} {r['op']:<9} {r['moex_tflops']:>8.0f} {r['torch_tflops']:>8.0f} "
            f"{r['loop_tflops']:>8.0f} {r['dense_tflops']:>8.0f} {r['moex_over_torch']:>10.3f} "
            f"{r['relerr']:>8.1e}{base}{bad}")


HEADER = (f"{'config':<14} {'splits':<8} {'op':<9} {'moex TF':>8} {'torch TF':>8} {'loop TF':>8} {'dense TF':>8} "
          f"{'moex/torch':>10} {'relerr':>8}")
BASE_HEADER = f" {'base TF':>8} {'moex/base':>9}"   # with --lib-baseline
MT_HEADER = f" {'mt TF':>8} {'mt/moex':>8}"          # with --torch-path


def add_times(r, ms, flops, hus=None):
    """The <f>_ms, <f>_tflops (and <f>_host_us) fields of r for each function f in ms, and
    moex_over_base (speed of moex over the baseline) when there is one."""
    for f, m in ms.items():
        r[f + "_ms"] = m
        r[f + "_tflops"] = flops / m / 1e9
        if hus is not None:
            r[f + "_host_us"] = hus[f]
    if "moex_base" in ms:
        r["moex_over_base"] = ms["moex_base"] / ms["moex"]
    if "mt" in ms:
        r["mt_over_moex"] = ms["moex"] / ms["mt"]


def bench_config(torch, mx, mxb, spinner, name, args, jf, rows):
    G, T, K, N = CONFIGS[name]
    bf = torch.bfloat16
    d = {"x": torch.randn(T, K, device="cuda", dtype=bf),
         "dy": torch.randn(T, N, device="cuda", dtype=bf),
         "w": torch.randn(G, N, K, device="cuda", dtype=bf) * 0.02,
         "bias": torch.randn(G, N, device="cuda", dtype=bf),
         "probs": torch.rand(T, device="cuda", dtype=torch.float32)}
    iters = args.iters or (30 if K * N >= 2 ** 24 else 60)
    flops = 2.0 * T * K * N
    for kind in KINDS:
        s = make_splits(G, T, kind)
        assert sum(s) == T, "the eager bias compositions assume sum(splits) == T"
        sp = Splits(torch, s)
        for op in args.ops:
            fns = op_fns(torch, mx, op, d, sp)
            if mxb is not None:
                fns["moex_base"] = baseline_fn(torch, mxb, fns["moex"])
            if args.torch_path:
                fns["mt"] = torch_path_fn(torch, op, d, sp)
            hus = {}
            ms = bench_interleaved(torch, spinner, fns, iters, host=hus)
            err, err_loop, err_base, err_mt = check_outputs(torch, mx, fns)
            r = {"config": name, "splits": kind, "op": op, "G": G, "T": T, "K": K, "N": N, "iters": iters,
                 "empty_groups": s.count(0), "max_split": max(s), "min_split": min(s)}
            add_times(r, ms, flops, hus)
            r["moex_over_torch"] = ms["torch"] / ms["moex"]
            r["relerr"], r["relerr_loop_vs_torch"] = err, err_loop
            if err_base is not None:
                r["relerr_base"] = err_base
            if err_mt is not None:
                r["relerr_mt"] = err_mt
            jf.write(json.dumps(r) + "\n")
            jf.flush()
            rows.append(r)
            print(row_line(r), flush=True)
            if args.profile:
                profile_row(torch, fns, [n for n in ("moex", "mt") if n in fns])
            del fns
            torch.cuda.empty_cache()
    del d
    torch.cuda.empty_cache()


def dense_ceiling(torch, spinner):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    ms = bench_interleaved(torch, spinner, {"mm": lambda: torch.mm(a, b, out=c)}, 20)["mm"]
    return 2.0 * 8192 ** 3 / ms / 1e9


def run_gpu(args):
    import torch
    torch.manual_seed(0)
    mx = Moex(args.lib, capi.BACKEND_CUDA, torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)
    mxb = (Moex(args.lib_baseline, capi.BACKEND_CUDA, torch.cuda.current_device(),
                torch.cuda.current_stream().cuda_stream) if args.lib_baseline else None)
    spinner = Spinner(torch)
    os.makedirs(args.out, exist_ok=True)
    json_path = args.json or os.path.join(args.out, "gemm_bench.jsonl")
    ceiling = dense_ceiling(torch, spinner)
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) | {torch.cuda.get_device_name()} | "
          f"moex {mx.version()} ({args.lib}) | dense bf16 8192^3: {ceiling:.0f} TFLOP/s | "
          f"spin {spinner.cycles_per_us:.0f} cycles/us", flush=True)
    header = HEADER
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(),
            "moex": mx.version(), "dense_8192_tflops": ceiling}
    if mxb is not None:
        print(f"baseline: moex {mxb.version()} ({args.lib_baseline}), timed in the same rotation", flush=True)
        header += BASE_HEADER
        meta.update({"lib": args.lib, "lib_baseline": args.lib_baseline, "moex_base": mxb.version()})
    if args.torch_path:
        import moex.torch   # the extension is loaded here, before any timing
        header += MT_HEADER
        meta["torch_path"] = True
    print(header, flush=True)
    rows = []
    with open(json_path, "w") as jf:
        jf.write(json.dumps(meta) + "\n")
        for name in args.configs:
            bench_config(torch, mx, mxb, spinner, name, args, jf, rows)
    mx.close()
    if mxb is not None:
        mxb.close()
    print(f"\nTF = TFLOP/s (2*T*K*N / median time of interleaved launches); moex/torch = speed ratio; "
          f"relerr = ||moex - torch||_F / ||torch||_F (0: bitwise equal; BAD above {RELERR_BAD:g}); "
          f"dense = cuBLAS mm of the same size in the same rotation; JSON: {json_path}")
    if mxb is not None:
        print(f"base = the same moex call through {args.lib_baseline}, in the same rotation; moex/base = speed "
              f"ratio (BAD also when the baseline's relerr is above {RELERR_BAD:g})")
    if args.torch_path:
        print("mt = the same op through moex.torch (its operator: outputs and workspace from torch's allocator), "
              "in the same rotation; mt/moex = its speed over the ctypes call (target >= 0.98)")
    print(header)
    for r in rows:
        print(row_line(r))
    bad = [r for r in rows if is_bad(r)]
    if bad:
        print(f"{len(bad)} rows with relerr above {RELERR_BAD:g} (or NaN)")
    return 1 if bad else 0


# ---- --cpu: the moex column (and moex_base) on the CPU backend, no torch ---------------------

def host_op_args(op, t):
    """(moex op, args struct) of gemm_bench op `op` on the moex tensors t (x, dy, w, bias, probs,
    splits); host_fn sets the output."""
    absent = capi.Tensor()
    if op == "dgrad":
        return "backward_data", capi.GroupedLinearDgradArgs(t["dy"], packed(t["w"]), capi.BIAS_NONE, absent, absent,
                                                       t["splits"], absent, absent, absent)
    if op == "wgrad":
        return "backward_weight", capi.GroupedLinearWgradArgs(t["x"], t["dy"], t["splits"], capi.GRAD_WRITE,
                                                         packed(absent))
    mode = {"fwd": capi.BIAS_NONE, "fwd_bias": capi.BIAS_ADD, "fwd_sbias": capi.BIAS_SCALED}[op]
    return "forward", capi.GroupedLinearArgs(t["x"], packed(t["w"]), mode, t["bias"] if mode != capi.BIAS_NONE else absent,
                                        t["probs"] if mode == capi.BIAS_SCALED else absent, t["splits"], absent)


def host_fn(mx, op, args, out_shape):
    """A function that runs one moex op on the CPU into its own f32 host output of out_shape
    (set into args here; the workspace allocated once); .out is that output, .n its size."""
    n = math.prod(out_shape)
    out = HostBuf(n)
    t = mtensor(out.ptr, capi.DTYPE_F32, *out_shape)
    setattr(args, MOEX_OUT[op], packed(t) if op == "backward_weight" else t)
    nbytes = mx.workspace_size(op, args)
    ws = HostBuf(nbytes // 4 + 1)

    def run():
        mx.run(op, args, ws.ptr, nbytes)
    run.out, run.n, run.ws, run.args = out, n, ws, args  # kept alive with the function
    return run


def bench_rotating_cpu(fns, iters, warm=2):
    """Median ms of each of fns by the wall clock, called in the rotating order of
    bench_interleaved."""
    names = list(fns)
    for n in names:
        for _ in range(warm):
            fns[n]()
    ts = {n: [] for n in names}
    for i in range(iters):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            t0 = time.perf_counter()
            fns[n]()
            ts[n].append((time.perf_counter() - t0) * 1e3)
    return {n: statistics.median(v) for n, v in ts.items()}


def host_inputs(G, T, K, N, rng):
    """Random f32 host inputs of one config: {name: HostBuf} and {name: moex_tensor}."""
    def rnd(n, s=1.0):
        return [rng.uniform(-s, s) for _ in range(n)]
    b = {"x": HostBuf(T * K, values=rnd(T * K)), "dy": HostBuf(T * N, values=rnd(T * N)),
         "w": HostBuf(G * N * K, values=rnd(G * N * K, 0.05)), "bias": HostBuf(G * N, values=rnd(G * N)),
         "probs": HostBuf(T, values=[rng.random() for _ in range(T)])}
    shapes = {"x": (T, K), "dy": (T, N), "w": (G, N, K), "bias": (G, N), "probs": (T,)}
    return b, {k: mtensor(b[k].ptr, capi.DTYPE_F32, *shapes[k]) for k in b}


def run_cpu(args):
    """--cpu: the moex column, and moex_base with --lib-baseline, on the CPU backend."""
    mx = Moex(args.lib, capi.BACKEND_CPU)
    mxb = Moex(args.lib_baseline, capi.BACKEND_CPU) if args.lib_baseline else None
    libs = {"moex": mx, "moex_base": mxb} if mxb else {"moex": mx}
    os.makedirs(args.out, exist_ok=True)
    json_path = args.json or os.path.join(args.out, "gemm_bench.jsonl")
    kinds = KINDS
    if importlib.util.find_spec("numpy") is None:   # make_splits draws the skewed splits with numpy
        kinds = ("balanced",)
        print("no numpy: balanced splits only", flush=True)
    meta = {"backend": "cpu", "moex": mx.version(), "lib": args.lib}
    if mxb:
        meta.update({"lib_baseline": args.lib_baseline, "moex_base": mxb.version()})
    print(f"moex {mx.version()} ({args.lib}) on the CPU, f32, wall clock"
          + (f"; baseline moex {mxb.version()} ({args.lib_baseline})" if mxb else ""), flush=True)
    print(f"{'config':<14} {'splits':<8} {'op':<9} {'moex TF':>8}" + (f" {'base TF':>8} {'moex/base':>9}" if mxb else ""),
          flush=True)
    rng = random.Random(0)
    iters = args.iters or 30
    differ = 0
    with open(json_path, "w") as jf:
        jf.write(json.dumps(meta) + "\n")
        for name in args.configs:
            G, T, K, N = CPU_CONFIGS[name]
            keep, t = host_inputs(G, T, K, N, rng)
            flops = 2.0 * T * K * N
            for kind in kinds:
                bs = HostBuf(G, ctypes.c_int64, make_splits(G, T, kind))
                t["splits"] = mtensor(bs.ptr, capi.DTYPE_I64, G)
                for op in args.ops:
                    out_shape = (G, N, K) if op == "wgrad" else (T, K) if op == "dgrad" else (T, N)
                    fns = {f: host_fn(lib, *host_op_args(op, t), out_shape) for f, lib in libs.items()}
                    ms = bench_rotating_cpu(fns, iters)
                    r = {"config": name, "splits": kind, "op": op, "G": G, "T": T, "K": K, "N": N, "iters": iters,
                         "backend": "cpu"}
                    add_times(r, ms, flops)
                    line = f"{name:<14} {kind:<8} {op:<9} {r['moex_tflops']:>8.4f}"
                    if mxb:   # both libraries must compute the same values
                        a, b = fns["moex"].out.list(fns["moex"].n), fns["moex_base"].out.list(fns["moex"].n)
                        r["maxdiff_base"] = max(abs(u - v) for u, v in zip(a, b)) / max(1.0, max(map(abs, b)))
                        bad = not r["maxdiff_base"] <= 1e-5
                        differ += bad
                        line += f" {r['moex_base_tflops']:>8.4f} {r['moex_over_base']:>9.3f}" + ("  DIFFERS" if bad else "")
                    jf.write(json.dumps(r) + "\n")
                    jf.flush()
                    print(line, flush=True)
            del keep
    mx.close()
    if mxb:
        mxb.close()
    print(f"\nTF = TFLOP/s (2*T*K*N / median wall time of {iters} calls in rotation); moex/base = speed ratio; "
          f"DIFFERS: the outputs differ by more than 1e-5 of their largest value; JSON: {json_path}")
    return 1 if differ else 0


def parse_list(text, allowed, what):
    items = [v for v in text.split(",") if v]
    unknown = [v for v in items if v not in allowed]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(allowed)})")
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default="build-gpu/libmoex.so")
    ap.add_argument("--configs", default=None, help="default: every CUDA config (--cpu: tiny)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--iters", type=int, default=0, help="timed launches per function (default 30 big, 60 small)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--json", default=None, help="JSON lines path (default OUT/gemm_bench.jsonl)")
    ap.add_argument("--selftest-cpu", action="store_true", help="run all ops through the CPU backend and exit")
    ap.add_argument("--lib-baseline", default=None, metavar="PATH",
                    help="another libmoex.so, timed in the same rotation (columns base TF, moex/base)")
    ap.add_argument("--torch-path", action="store_true",
                    help="add the op through moex.torch (columns mt TF, mt/moex)")
    ap.add_argument("--profile", action="store_true",
                    help="print the kernels and runtime calls of one moex (and moex.torch) call per row")
    ap.add_argument("--cpu", action="store_true",
                    help="time moex (and the baseline) on the CPU backend, CPU configs, no torch")
    args = ap.parse_args()
    load_capi(args.lib)
    if args.selftest_cpu:
        return selftest_cpu(args.lib)
    known = CPU_CONFIGS if args.cpu else CONFIGS
    args.configs = parse_list(args.configs or ("tiny" if args.cpu else ",".join(CONFIGS)), list(known), "config")
    args.ops = parse_list(args.ops, OPS, "op")
    return run_cpu(args) if args.cpu else run_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
