#!/usr/bin/env python3
"""ep_torch.py - the torch.distributed baseline of bench/ep_bench.c: expert-parallel dispatch and
combine as Megatron-LM's all-to-all token dispatcher does them (MoEAlltoAllTokenDispatcher,
unfused permute), on the same problem and the same routing as ep_bench.c.

Problem (every rank): E = 256 experts over the N ranks (El = E / N local experts), k = 8,
H = 7168, bf16, T = 4096 tokens per rank. Routing: per token k distinct experts uniform at
random and k probs uniform in [0, 1), drawn from splitmix64 seeded SEED_BASE + rank in exactly
ep_bench.c's order, so both programs route identically; x is random bf16 in [-0.25, 0.25).

  dispatch  permute: the routing map [T, E] (the router's output, built once, untimed) selects
            the token rows by expert, then token (index_select into [T k, H]: by destination
            rank, then expert); the per-expert counts go to every rank (all_to_all_single of
            [E] counts) and to the host (one synchronisation, as Megatron's); the rows move with
            all_to_all_single and the split sizes; the received [source rank][local expert]
            chunks are regrouped by local expert (Megatron's sort_chunks_by_idxs: split + cat;
            --no-regroup leaves them by source rank).
  combine   the reverse: chunks back to [source rank][local expert], all_to_all_single with the
            split sizes swapped, then the k rows of each token summed into y (index_add_,
            Megatron's scatter-add unpermute, no prob scaling: moex's combine sums too).
Timing: CUDA events around one op; before each of --warmup + --iters repetitions the device is
synchronised and the ranks meet at a host barrier (gloo); each rank takes the median, the
reported time is the largest median over the ranks. The combine is timed on the last
dispatch's state with yr = xr.

Bytes, counted as ep_bench.c counts them (DeepEP): the distinct (token, destination rank) pairs
of a rank's routing, own rank included, times H * 2; the combine the same. GBps = mean bytes
over the ranks / time; link_GBps counts the pairs to other ranks only. torch moves T k rows per
rank (a row per slot, not per destination rank): moved_MB (and to other ranks, remote_MB).
Check: y = combine(dispatch(x)) = k x within a relative error of 5e-2 (PASS / FAIL; exit 1).

Usage (GPU machine; NCCL_NVLS_ENABLE=0 set by the caller):
    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node N bench/ep_torch.py [--tokens T] [--iters 20]
        [--warmup 5] [--no-regroup]
Prints a table on rank 0 and one line per op:
    EPBENCH impl=torch op=dispatch|combine|dispatch+combine N= T= H= k= E= us= GBps= link_GBps= ...
"""
import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

E, K, H = 256, 8, 7168
SEED_BASE = 0x5EED0000
TOL = 5e-2
M64 = (1 << 64) - 1


def routing(rank, T):
    """ids [T, k] (int64) and probs [T, k] (f32) of `rank`: ep_bench.c's make_routing."""
    s = SEED_BASE + rank
    ids, probs = [], []

    def draw():
        nonlocal s
        s = (s + 0x9E3779B97F4A7C15) & M64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    for _ in range(T):
        row = []
        while len(row) < K:
            e = (draw() >> 32) % E
            if e not in row:
                row.append(e)
        ids.append(row)
        probs.append([(draw() >> 40) / 16777216.0 for _ in range(K)])
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(probs, dtype=torch.float32)


class Dispatcher:
    """Megatron's all-to-all token dispatcher over `N` ranks for one routing map [T, E] (bool);
    dispatch(x) -> xr [rows received, H] by local expert; combine(yr) -> y [T, H]."""

    def __init__(self, routing_map, N, regroup):
        self.T, self.N, self.El = routing_map.shape[0], N, E // N
        self.regroup = regroup and self.El > 1
        self.routing_map = routing_map
        # the received chunks [source rank][local expert] in local-expert-major order, and back
        self.by_expert = [s * self.El + e for e in range(self.El) for s in range(N)]
        self.back = [0] * (N * self.El)
        for pos, chunk in enumerate(self.by_expert):
            self.back[chunk] = pos

    def dispatch(self, x):
        T, N, El = self.T, self.N, self.El
        # permute: rows by expert, then token
        rmap = self.routing_map.t().contiguous()
        self.token_of = torch.arange(T, device=x.device).unsqueeze(0).expand(E, -1).masked_select(rmap)
        permuted = x.index_select(0, self.token_of)
        # counts: local per expert -> every rank's per local expert, then the host
        per_expert = self.routing_map.sum(dim=0)
        recv_per_expert = torch.empty_like(per_expert)
        dist.all_to_all_single(recv_per_expert, per_expert)
        host = torch.cat([per_expert.view(N, El).sum(1), recv_per_expert]).tolist()
        self.in_splits = host[:N]
        self.chunk_rows = host[N:]                       # [source rank][local expert]
        self.out_splits = [sum(self.chunk_rows[s * El:(s + 1) * El]) for s in range(N)]
        recv = x.new_empty(sum(self.out_splits), x.shape[1])
        dist.all_to_all_single(recv, permuted, self.out_splits, self.in_splits)
        if not self.regroup:
            return recv
        parts = torch.split(recv, self.chunk_rows)
        return torch.cat([parts[c] for c in self.by_expert])

    def combine(self, yr):
        if self.regroup:
            parts = torch.split(yr, [self.chunk_rows[c] for c in self.by_expert])
            yr = torch.cat([parts[self.back[c]] for c in range(len(self.back))])
        out = yr.new_empty(sum(self.in_splits), yr.shape[1])
        dist.all_to_all_single(out, yr, self.in_splits, self.out_splits)
        y = torch.zeros(self.T, yr.shape[1], dtype=yr.dtype, device=yr.device)
        return y.index_add_(0, self.token_of, out)


def time_op(fn, warmup, iters, barrier, dev):
    """The largest over the ranks of each rank's median time (us) of fn()."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for i in range(warmup + iters):
        torch.cuda.synchronize()
        barrier()
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= warmup:
            us.append(a.elapsed_time(b) * 1e3)
    t = torch.tensor([statistics.median(us)], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-regroup", action="store_true",
                    help="leave the received rows by source rank (no sort_chunks_by_idxs)")
    args = ap.parse_args()
    T = args.tokens

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=dev)
    rank, N = dist.get_rank(), dist.get_world_size()
    if E % N:
        sys.exit(f"ep_torch: E = {E} is not a multiple of the world size {N}")
    El = E // N
    host_group = dist.new_group(backend="gloo")

    def barrier():
        dist.barrier(group=host_group)

    ids, _probs = routing(rank, T)               # probs: drawn to keep ep_bench.c's sequence
    ids = ids.to(dev)
    routing_map = torch.zeros(T, E, dtype=torch.bool, device=dev)
    routing_map.scatter_(1, ids, True)
    g = torch.Generator(device=dev)
    g.manual_seed(1 + rank)
    x = ((torch.rand(T, H, generator=g, device=dev) - 0.5) * 0.5).to(torch.bfloat16)

    # bytes: DeepEP's (distinct (token, rank) pairs) and torch's (one row per slot)
    dest = ids // El
    dsorted = dest.sort(dim=1).values
    pairs = 1 + (dsorted[:, 1:] != dsorted[:, :-1]).sum(dim=1)
    to_self = (dest == rank).any(dim=1)
    counts = torch.stack([pairs.sum(), pairs.sum() - to_self.sum(), (dest != rank).sum()]).to(torch.float64)
    dist.all_reduce(counts)
    counts /= N
    row_bytes = H * 2
    deep_bytes, link_bytes = counts[0].item() * row_bytes, counts[1].item() * row_bytes
    moved_bytes, remote_bytes = T * K * row_bytes, counts[2].item() * row_bytes

    d = Dispatcher(routing_map, N, not args.no_regroup)
    state = {}

    def dispatch():
        state["xr"] = d.dispatch(x)

    def combine():
        state["y"] = d.combine(state["xr"])

    def both():
        dispatch()
        combine()

    res = {
        "dispatch": time_op(dispatch, args.warmup, args.iters, barrier, dev),
        "combine": time_op(combine, args.warmup, args.iters, barrier, dev),
        "dispatch+combine": time_op(both, args.warmup, args.iters, barrier, dev),
    }

    # check: the last dispatch + combine gives k x
    ref = x.float() * K
    y = state["y"].float()
    err = torch.where(ref != 0, (y - ref).abs() / ref.abs(), y.abs()).nan_to_num(nan=float("inf")).max()
    err = err.to(torch.float64).reshape(1)
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    err = err.item()
    ok = err < TOL

    if rank == 0:
        regroup = "regrouped by local expert" if d.regroup else "left by source rank"
        print(f"ep_torch: N={N} ({torch.cuda.get_device_name(dev)}), torch {torch.__version__}, NCCL "
              f"{'.'.join(map(str, torch.cuda.nccl.version()))}; T={T} H={H} k={K} E={E} bf16, received rows "
              f"{regroup}; median of {args.iters} after {args.warmup} warm-ups, max over ranks")
        print(f"  routing: {counts[0].item():.0f} (token, rank) pairs per rank on average "
              f"({counts[1].item():.0f} to other ranks): {deep_bytes / 1e6:.1f} MB DeepEP-style "
              f"({link_bytes / 1e6:.1f} MB over links); torch moves T k = {T * K} rows: {moved_bytes / 1e6:.1f} MB "
              f"({remote_bytes / 1e6:.1f} MB to other ranks)")
        print(f"  {'op':<18} {'median us':>12} {'GB/s':>10} {'link GB/s':>12} {'torch GB/s':>12}")
        for op, us in res.items():
            m = 2 if op == "dispatch+combine" else 1
            print(f"  {op:<18} {us:12.1f} {m * deep_bytes / (us * 1e3):10.1f} {m * link_bytes / (us * 1e3):12.1f} "
                  f"{m * moved_bytes / (us * 1e3):12.1f}")
        print(f"  check: combine(dispatch(x)) = k x: max rel err {err:.3g} {'PASS' if ok else 'FAIL'}")
        for op, us in res.items():
            m = 2 if op == "dispatch+combine" else 1
            print(f"EPBENCH impl=torch op={op} N={N} T={T} H={H} k={K} E={E} us={us:.1f} "
                  f"GBps={m * deep_bytes / (us * 1e3):.1f} link_GBps={m * link_bytes / (us * 1e3):.1f} "
                  f"moved_MB={m * moved_bytes / 1e6:.1f} remote_MB={m * remote_bytes / 1e6:.1f} "
                  f"regroup={int(d.regroup)}")
        sys.stdout.flush()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
