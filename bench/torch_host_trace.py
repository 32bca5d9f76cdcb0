#!/usr/bin/env python3
"""torch_host_trace.py - where the host time of one moex.torch call goes: torch.profiler's host
events (operators, allocations, CUDA runtime and driver calls such as kernel launches) of many
calls of one row of bench/torch_host_time.py, per call: how many of each event and their host
microseconds, self time (the profiler's own overhead inflates every event alike; the counts are
exact). The torch._grouped_mm forward is traced beside it as the floor.

Usage: python3 bench/torch_host_trace.py [--calls 200] [--shape G,T,K,N] [--top 14]
"""
import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import moex._torch_ext as ext
import moex.torch as mt


def trace(fn, calls):
    """{event name: (count per call, self host us per call)} of `calls` calls of fn."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    count, self_us = defaultdict(int), defaultdict(float)
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CPU and e.count >= calls:
            count[e.key] += e.count
            self_us[e.key] += e.self_cpu_time_total
    return {k: (count[k] / calls, self_us[k] / calls) for k in count}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--shape", default="8,256,128,256", help="G,T,K,N (default 8,256,128,256)")
    ap.add_argument("--top", type=int, default=14, help="events printed per row (by self time)")
    args = ap.parse_args()
    G, T, K, N = map(int, args.shape.split(","))
    dt, dev = torch.bfloat16, "cuda"
    splits = torch.full((G,), T // G, device=dev, dtype=torch.int64)
    splits[-1] += T - (T // G) * G
    offs = torch.cumsum(splits, 0).to(torch.int32)
    x = torch.randn(T, K, device=dev, dtype=dt)
    packed = mt.GroupedLinear(G, K, N, bias=False, params_dtype=dt, device=dev, packed=True)
    sep = mt.GroupedLinear(G, K, N, bias=False, params_dtype=dt, device=dev)
    w = packed.weight.detach().clone()
    rows = {"torch._grouped_mm fwd": lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs),
            "moex.torch.grouped_linear fwd": lambda: mt.grouped_linear(x, w, splits),
            "GroupedLinear fwd, packed": lambda: packed(x, splits),
            "GroupedLinear fwd, separate weights": lambda: sep(x, splits)}
    path = f"C++ extension ({ext.PATH})" if ext.PATH else f"ctypes binding ({ext.LOAD_ERROR})"
    print(f"host events per call, G={G} T={T} K={K} N={N} bf16, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}; moex.torch operators: {path}")
    with torch.no_grad():
        for name, fn in rows.items():
            events = trace(fn, args.calls)
            total = sum(us for _, us in events.values())
            print(f"\n{name}: {total:.1f} us of self host time per call (under the profiler)")
            print(f"  {'event':60s} {'count':>6s} {'us':>7s}")
            for key, (n, us) in sorted(events.items(), key=lambda kv: -kv[1][1])[:args.top]:
                print(f"  {key[:60]:60s} {n:6.2f} {us:7.2f}")


if __name__ == "__main__":
    main()
