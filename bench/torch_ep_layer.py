#!/usr/bin/env python3
"""torch_ep_layer.py - the expert-parallel MoE layer's training step through moex.torch against a
plain torch.distributed all-to-all EP layer of the same model, in one torchrun call (issue #35
item 5).

Model (every rank): E experts over the W ranks (El = E / W local experts), hidden H, FFN F, top-k
of a softmax router with the chosen probs renormalised, SwiGLU (z = p * silu(a) * b, h = [a | b]),
no biases, bf16 (the router GEMM in f32), T tokens a rank.
  moex   moex.torch.MoELayer(E, H, F, k, ep_group=WORLD, ep_max_tokens=T): moex's EP MoE layer over
         NCCL (one call forward, one backward; the counts stay on the device).
  torch  examples/moe_lm/train_ep.py's TorchEPMoE, the all-to-all layer as Megatron-LM's token
         dispatcher runs it: the router in f32, the token copies sorted by expert, the per-expert
         counts exchanged (all_to_all_single) and read on the host, the rows and probs moved by
         torch.distributed.nn.functional.all_to_all_single (autograd), regrouped by local expert,
         FC1 and FC2 by torch._grouped_mm, SwiGLU and the prob scale in f32, back by the reverse
         all-to-all, and each token's k rows summed (index_add_). Its backward is autograd's.
The two layers hold the same weights; the check compares their y on every rank (relative to
y's largest value; bf16: PASS under 3e-2).
Timing: a step is forward + backward (y.backward(dy), the parameters' .grad set to None before);
CUDA events around it, after a device sync and a barrier, --warmup then --iters repetitions;
each rank takes its median, the table the largest median over the ranks. TFLOP/s: 18 T k H F a
rank (the expert GEMMs of forward and backward) / time.

Usage (GPU machine): torchrun --standalone --nproc_per_node W bench/torch_ep_layer.py
    [--experts 128] [--hidden 2048] [--ffn 768] [--topk 8] [--tokens 4096] [--iters 20] [--warmup 5]
Prints one table on rank 0.
"""
import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

import moex.torch as mt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "moe_lm"))
from train_ep import TorchEPMoE  # noqa: E402  (the all-to-all EP layer, written once: the example's)


def step_time(fn, params, warmup, iters, dev):
    times = []
    for i in range(warmup + iters):
        for p in params:
            p.grad = None
        torch.cuda.synchronize(dev)
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    W, rank = dist.get_world_size(), dist.get_rank()
    E, H, Fd, k, T, dt = args.experts, args.hidden, args.ffn, args.topk, args.tokens, torch.bfloat16
    torch.manual_seed(11)
    moex_layer = mt.MoELayer(E, H, Fd, k, ep_group=dist.group.WORLD, ep_max_tokens=T, params_dtype=dt, device=dev)
    torch_layer = TorchEPMoE(E, H, Fd, k, rank, W, grouped=True).to(device=dev, dtype=dt)
    with torch.no_grad():
        for p in moex_layer.parameters():
            p.normal_(std=0.02)
        for name in ("router_w", "w1", "w2"):
            getattr(torch_layer, name).copy_(getattr(moex_layer, name))
    torch.manual_seed(100 + rank)
    x = torch.randn(T, H, device=dev, dtype=dt).requires_grad_(True)
    dy = torch.randn(T, H, device=dev, dtype=dt)

    with torch.no_grad():
        y_moex, y_torch = moex_layer(x), torch_layer(x)
        err = ((y_moex.double() - y_torch.double()).abs().max() / y_torch.double().abs().max()).item()
    rows = {}
    for name, layer in (("moex.torch MoELayer(ep_group)", moex_layer), ("torch all-to-all EP", torch_layer)):
        params = [x] + list(layer.parameters())
        rows[name] = step_time(lambda: layer(x).backward(dy), params, args.warmup, args.iters, dev)
    medians = [None] * W
    dist.all_gather_object(medians, (rows, err))
    if rank == 0:
        worst = {name: max(m[0][name] for m in medians) for name in rows}
        err = max(m[1] for m in medians)
        flops = 18 * T * k * H * Fd
        print(f"EP MoE layer step, W={W} E={E} H={H} F={Fd} k={k} T={T} a rank, bf16, "
              f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
        print(f"{'layer':<34}{'us':>10}{'TFLOP/s':>10}")
        for name, us in worst.items():
            print(f"{name:<34}{us:>10.1f}{flops / us / 1e6:>10.1f}")
        base = worst["torch all-to-all EP"]
        print(f"moex / torch speedup {base / worst['moex.torch MoELayer(ep_group)']:.2f}x (target >= 1.5); "
              f"check y: max error {err:.2e} of its largest value {'PASS' if err < 3e-2 else 'FAIL'}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
