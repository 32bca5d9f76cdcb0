#!/usr/bin/env python3
"""torch_host_time.py - host time per call of moex.torch in eager mode, against
torch._grouped_mm and a loop of F.linear per group, on small shapes (where the GPU finishes
first and the host's time is what a step costs).

Host time = wall time of N calls in a row divided by N, with the GPU kept busy beforehand by
torch.cuda._sleep so that no call waits for the device, then a synchronize outside the timed
window. N = 20, so that the launches stay under the launch queue's depth (past it the host
waits for the GPU, and the time is no longer the host's). 15 repetitions, the functions of a
table interleaved within each (so that a slower spell of the host costs every row alike); us
per call, the minimum (the call's own cost: other work on the host only adds to it) and the
median.
A call that copies host data to the device (list splits) waits for the GPU by nature.

Rows: GroupedLinear forward (list splits, and device-tensor splits), torch._grouped_mm
forward, the F.linear loop (all under no_grad, then with autograd recording); where moex's
forward spends its host time (the C call alone with its arguments built once, the workspace
query, torch's stream query and allocation, the operator's Python implementation, and the
registered operator through torch's dispatcher, the path torch.compile traces); GroupedMLP
forward + backward against the same math in eager PyTorch with torch._grouped_mm.

Usage (GPU machine): PYTHONPATH=python MOEX_LIBRARY=build/libmoex.so python3 bench/torch_host_time.py
"""
import ctypes
import statistics
import time

import torch
import torch.nn.functional as F

import moex.torch as mt
from moex import _capi

G, T, K, N, F_ = 8, 256, 128, 256, 128
REPS, CALLS = 15, 20   # 20 calls of at most ~20 launches stay under the GPU's launch queue depth


def host_us(fns):
    """{name: (min, median) us per call} of the functions `fns` {name: fn}, interleaved."""
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    for _ in range(REPS):
        for name, fn in fns.items():
            torch.cuda._sleep(int(2e8))   # the GPU stays busy: every call below returns at host speed
            t0 = time.perf_counter()
            for _ in range(CALLS):
                fn()
            times[name].append((time.perf_counter() - t0) / CALLS * 1e6)
            torch.cuda.synchronize()
    return {name: (min(t), statistics.median(t)) for name, t in times.items()}


def breakdown(x, w, splits):
    """Parts of the forward's host time: the C call with its arguments built once, the
    workspace query, torch's queries, the Python implementation, the dispatcher's path."""
    y = x.new_empty(x.shape[0], w.shape[1])
    args = _capi.GroupedLinearArgs(x=mt._view(x), w=_capi.Weight(mt._view(w), None), splits=mt._view(splits),
                                   y=mt._view(y))
    ctx = _capi.context(_capi.BACKEND_CUDA, x.device.index or 0)
    nbytes = ctypes.c_size_t()
    _capi.check(ctx, _capi.LIB.moex_grouped_linear_forward_workspace_size(ctx, ctypes.byref(args),
                                                                           ctypes.byref(nbytes)))
    ws = torch.empty(max(nbytes.value, 1), dtype=torch.uint8, device=x.device)
    stream = torch.cuda.current_stream().cuda_stream
    run = _capi.LIB.moex_grouped_linear_forward
    query = _capi.LIB.moex_grouped_linear_forward_workspace_size
    impl, op = mt._forward.impl, mt._forward.op
    return {f"  C call alone (workspace {nbytes.value} B)":
            lambda: run(ctx, ctypes.byref(args), ws.data_ptr(), nbytes.value, stream),
            "  C workspace query": lambda: query(ctx, ctypes.byref(args), ctypes.byref(nbytes)),
            "  torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
            "  torch.empty (workspace)": lambda: torch.empty(nbytes.value, dtype=torch.uint8, device=x.device),
            "  Python implementation (the eager path)": lambda: impl(x, w, splits, None, None, 0),
            "  moex::grouped_linear_forward via the dispatcher": lambda: op(x, w, splits, None, None, 0)}


def main():
    dev = "cuda"
    dt = torch.bfloat16
    splits_list = [T // G] * G
    splits = torch.tensor(splits_list, device=dev)
    offs = torch.cumsum(splits, 0).to(torch.int32)
    x = torch.randn(T, K, device=dev, dtype=dt)
    layer = mt.GroupedLinear(G, K, N, bias=False, params_dtype=dt, device=dev, packed=True)
    w = layer.weight.detach()
    rows = {}
    with torch.no_grad():
        rows.update(host_us({
            "GroupedLinear fwd, tensor splits": lambda: layer(x, splits),
            "torch._grouped_mm fwd": lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs),
            "F.linear loop fwd": lambda: [F.linear(a, w[g]) for g, a in enumerate(torch.split(x, splits_list))],
            **breakdown(x, w, splits)}))
        rows.update(host_us({"GroupedLinear fwd, list splits": lambda: layer(x, splits_list)}))
    wg = layer.weight
    rows.update(host_us({"GroupedLinear fwd, autograd on": lambda: layer(x, splits),
                         "torch._grouped_mm fwd, autograd on": lambda: torch._grouped_mm(x, wg.transpose(1, 2),
                                                                                         offs=offs)}))

    mlp = mt.GroupedMLP(G, K, F_, params_dtype=dt, device=dev)
    xg = x.clone().requires_grad_(True)
    probs = torch.rand(T, device=dev)
    gy = torch.randn(T, K, device=dev, dtype=dt)
    w1 = mlp.w1.detach().clone().requires_grad_(True)
    w2 = mlp.w2.detach().clone().requires_grad_(True)

    def torch_step():
        h = torch._grouped_mm(xg, w1.transpose(1, 2), offs=offs)
        a, b = h.float().chunk(2, dim=1)
        z = (F.silu(a) * b * probs[:, None]).to(dt)
        torch._grouped_mm(z, w2.transpose(1, 2), offs=offs).backward(gy)

    rows.update(host_us({"GroupedMLP fwd+bwd": lambda: mlp(xg, splits, probs).backward(gy),
                         "eager torch._grouped_mm MLP fwd+bwd": torch_step}))
    print(f"host us per call, G={G} T={T} K={K} N={N} F={F_} bf16, {torch.cuda.get_device_name()}")
    print(f"  {'':50s} {'min':>8s} {'median':>8s}")
    for name, (low, mid) in rows.items():
        print(f"  {name:50s} {low:8.1f} {mid:8.1f}")


if __name__ == "__main__":
    main()
