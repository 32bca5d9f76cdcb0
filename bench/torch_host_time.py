#!/usr/bin/env python3
"""torch_host_time.py - host time per call of moex.torch in eager mode, against
torch._grouped_mm and a loop of F.linear per group, on small shapes (where the GPU finishes
first and the host's time is what a step costs).

Host time = wall time of N calls in a row divided by N, with the GPU kept busy beforehand by
torch.cuda._sleep so that no call waits for the device, then a synchronize outside the timed
window. N = 20, so that the launches stay under the launch queue's depth (past it the host
waits for the GPU, and the time is no longer the host's). Median of 7 repetitions; us per call.
A call that copies host data to the device (list splits) waits for the GPU by nature.

Rows: GroupedLinear forward (list splits, and device-tensor splits), torch._grouped_mm
forward, the F.linear loop (all under no_grad, then with autograd recording); where moex's
forward spends its host time (the C call alone with its arguments built once, the workspace
query, torch's stream query and allocation, the operator's Python implementation, and the
registered operator through torch's dispatcher, the path torch.compile traces); GroupedMLP forward + backward against the same math in eager PyTorch with
torch._grouped_mm.

Usage (GPU machine): PYTHONPATH=python MOEX_LIBRARY=build/libmoex.so python3 bench/torch_host_time.py
"""
import statistics
import time

import torch
import torch.nn.functional as F

import ctypes

import moex.torch as mt
from moex import _capi

G, T, K, N, F_ = 8, 256, 128, 256, 128
REPS, CALLS = 7, 20   # 20 calls of at most ~20 launches stay under the GPU's launch queue depth


def host_us(fn):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        torch.cuda._sleep(int(2e8))   # the GPU stays busy: every call below returns at host speed
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        times.append((time.perf_counter() - t0) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def breakdown(x, w, splits):
    """Parts of the forward's host time: the C call with its arguments built once, the
    workspace query, the Python implementation (no dispatcher), torch's queries."""
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
    rows = [(f"  C call alone (workspace {nbytes.value} B)",
             host_us(lambda: run(ctx, ctypes.byref(args), ws.data_ptr(), nbytes.value, stream))),
            ("  C workspace query", host_us(lambda: query(ctx, ctypes.byref(args), ctypes.byref(nbytes)))),
            ("  torch.cuda.current_stream().cuda_stream", host_us(lambda: torch.cuda.current_stream().cuda_stream)),
            ("  torch.empty (workspace)", host_us(lambda: torch.empty(nbytes.value, dtype=torch.uint8,
                                                                      device=x.device)))]
    rows.append(("  Python implementation (the eager path)", host_us(lambda: impl(x, w, splits, None, None, 0))))
    rows.append(("  moex::grouped_linear_forward via the dispatcher", host_us(lambda: op(x, w, splits, None, None, 0))))
    return rows


def main():
    dev = "cuda"
    dt = torch.bfloat16
    splits_list = [T // G] * G
    splits = torch.tensor(splits_list, device=dev)
    offs = torch.cumsum(splits, 0).to(torch.int32)
    x = torch.randn(T, K, device=dev, dtype=dt)
    layer = mt.GroupedLinear(G, K, N, bias=False, params_dtype=dt, device=dev, packed=True)
    w = layer.weight.detach()
    wt = w.transpose(1, 2)
    rows = []
    with torch.no_grad():
        rows.append(("GroupedLinear fwd, tensor splits", host_us(lambda: layer(x, splits))))
        rows.append(("GroupedLinear fwd, list splits", host_us(lambda: layer(x, splits_list))))
        rows.append(("torch._grouped_mm fwd", host_us(lambda: torch._grouped_mm(x, wt, offs=offs))))
        rows.append(("F.linear loop fwd", host_us(lambda: [F.linear(a, w[g]) for g, a in
                                                           enumerate(torch.split(x, splits_list))])))
        rows += breakdown(x, w, splits)
    wg = layer.weight
    wgt = wg.transpose(1, 2)
    rows.append(("GroupedLinear fwd, autograd on", host_us(lambda: layer(x, splits))))
    rows.append(("torch._grouped_mm fwd, autograd on", host_us(lambda: torch._grouped_mm(x, wgt, offs=offs))))

    mlp = mt.GroupedMLP(G, K, F_, params_dtype=dt, device=dev)
    xg = x.clone().requires_grad_(True)
    probs = torch.rand(T, device=dev)

    gy = torch.randn(T, K, device=dev, dtype=dt)

    def moex_step():
        mlp(xg, splits, probs).backward(gy)

    w1 = mlp.w1.detach().clone().requires_grad_(True)
    w2 = mlp.w2.detach().clone().requires_grad_(True)

    def torch_step():
        h = torch._grouped_mm(xg, w1.transpose(1, 2), offs=offs)
        a, b = h.float().chunk(2, dim=1)
        z = (F.silu(a) * b * probs[:, None]).to(dt)
        torch._grouped_mm(z, w2.transpose(1, 2), offs=offs).backward(gy)

    rows.append(("GroupedMLP fwd+bwd", host_us(moex_step)))
    rows.append(("eager torch._grouped_mm MLP fwd+bwd", host_us(torch_step)))
    print(f"host us per call, G={G} T={T} K={K} N={N} F={F_} bf16, {torch.cuda.get_device_name()}")
    for name, us in rows:
        print(f"  {name:40s} {us:8.1f}")


if __name__ == "__main__":
    main()
