"""examples/moe_lm/train_ep.py - train.py's language model with expert parallelism over W ranks, one
of two expert layers (--moe):

  moex   moex.torch.MoELayer(..., ep_group=group): moex's EP MoE layer (router, dispatch to the
         ranks that hold the experts, grouped SwiGLU MLP, combine; one call forward, one back)
  torch  the same layer as a plain torch.distributed all-to-all EP layer (TorchEPMoE: Megatron's
         token dispatcher: the token copies sorted by expert, the counts exchanged and read on
         the host, all_to_all_single of the rows, the experts as in train.py, the reverse
         all-to-all, each token's k rows summed)

Every rank holds E / W of every MoE layer's experts (rank r: [r E/W, (r+1) E/W)) and a copy of
everything else (data parallelism): each step's --batch sequences (the same as train.py's, drawn
under --seed) are split over the ranks, rank r taking its batch / W; the gradients of the
replicated parameters (router_w included: each rank's EP layer gives its tokens' share) are
averaged over the ranks, the experts' (which every rank's tokens reach) divided by W, so that
the update is train.py's on the whole batch (the load-balancing loss from the whole batch's
expert fractions): with the same --seed the loss curve is train.py's (in f32 to rounding;
tests/python/test_example_moe_lm.py checks it on the CPU). train.py's loop runs it
(train(args, dp=Ranks): the model, the gradients' reduction and the losses' mean are this
file's); the reported loss is the mean over the ranks; the validation loss is computed on every
rank alike (the EP layers are collective); --out (rank 0) gets train.py's JSON.

    torchrun --nproc_per_node 2 examples/moe_lm/train_ep.py --moe moex --out ep_moex.json
    torchrun --nproc_per_node 2 examples/moe_lm/train_ep.py --moe torch --out ep_torch.json
    mpirun -np 2 python3 examples/moe_lm/train_ep.py --device cpu ...   (the CPU: moex's EP over
        MPI through mpi4py, the replicated gradients over gloo on 127.0.0.1:$MOEX_EP_PORT)

torchrun runs NCCL on one GPU a rank; the same command with --nnodes and a rendezvous runs
across nodes (docs/ops.md 10.5). Options: train.py's (--batch a multiple of the ranks).
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.nn.functional import all_to_all_single

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train as lm  # noqa: E402  (the text, the model, the plain layer's math, the schedule)

VARIANTS = ("moex", "torch")


class Ranks:
    """The launcher's ranks: torchrun (NCCL on cuda:LOCAL_RANK, one group for both) or mpirun
    (the CPU: an mpi4py communicator for moex's EP, a gloo group for the rest)."""

    def __init__(self):
        if "LOCAL_RANK" in os.environ:
            self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(self.device)
            dist.init_process_group("nccl", device_id=self.device)
            self.ep_group = dist.group.WORLD
        else:
            from mpi4py import MPI
            self.device = torch.device("cpu")
            comm = MPI.COMM_WORLD
            port = os.environ.get("MOEX_EP_PORT", "29533")
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(),
                                    world_size=comm.Get_size())
            self.ep_group = comm
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.name = None   # (train.py's record and log: "ep_<variant>", set by main)

    def model(self, args, dtype):
        """train.py's model with this rank's EP layers (build_ep_model)."""
        return build_ep_model(args, self, dtype)

    def reduce_grads(self, model):
        """The whole batch's gradients: the replicated parameters' averaged over the ranks (one
        all-reduce), the experts' (every rank's tokens reach them) divided by the ranks."""
        experts = [p for b in model.blocks for p in (b.moe.w1, b.moe.w2)]
        ids = {id(p) for p in experts}
        replicated = [p for p in model.parameters() if id(p) not in ids]
        flat = torch.cat([p.grad.reshape(-1) for p in replicated])
        dist.all_reduce(flat)
        flat /= self.world
        for p, g in zip(replicated, flat.split([p.numel() for p in replicated])):
            p.grad.copy_(g.view_as(p))
        for p in experts:
            p.grad /= self.world

    def mean(self, t):
        """t's mean over the ranks (no gradient)."""
        return mean_over_ranks(t)


class TorchEPMoE(nn.Module):
    """moex.torch.MoELayer(E, H, F, k, ep_group) in plain PyTorch: this rank's experts
    [rank El, (rank + 1) El) of the layer of train.py's TorchMoE (router_w whole), the tokens
    moved to and from them by all-to-all (Megatron's dispatcher); the experts as a loop of
    F.linear, or torch._grouped_mm when grouped (CUDA)."""

    def __init__(self, num_experts, hidden, ffn, topk, rank, world, grouped):
        super().__init__()
        self.topk, self.rank, self.world, self.grouped = topk, rank, world, grouped
        self.El = num_experts // world
        self.router_w = nn.Parameter(torch.empty(num_experts, hidden))
        self.w1 = nn.Parameter(torch.empty(self.El, 2 * ffn, hidden))
        self.w2 = nn.Parameter(torch.empty(self.El, hidden, ffn))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        k, W, El = self.topk, self.world, self.El
        probs, ids = lm.route(x, self.router_w, k)
        order = ids.flatten().argsort(stable=True)       # the (token, choice) pairs by expert, so by rank
        xs, ps = x[order // k], probs.flatten()[order]
        counts = torch.bincount(ids.flatten(), minlength=W * El)
        recv = torch.empty_like(counts)
        dist.all_to_all_single(recv, counts)              # [source rank][local expert]
        send_rows = counts.view(W, El).sum(1).tolist()
        chunk = recv.view(W, El).tolist()                 # (the host reads the counts)
        recv_rows = [sum(c) for c in chunk]
        xr = all_to_all_single(xs.new_empty(sum(recv_rows), shape[-1]), xs, recv_rows, send_rows)
        pr = all_to_all_single(ps.new_empty(sum(recv_rows)), ps, recv_rows, send_rows)
        # [source][expert] chunks regrouped by expert, the experts, and back
        by_expert = [q * El + e for e in range(El) for q in range(W)]
        sizes = [chunk[q][e] for q in range(W) for e in range(El)]
        xc, pc = xr.split(sizes), pr.split(sizes)
        xe, pe = torch.cat([xc[i] for i in by_expert]), torch.cat([pc[i] for i in by_expert])
        per_expert = [sum(chunk[q][e] for q in range(W)) for e in range(El)]
        if self.grouped:
            offs = torch.tensor(per_expert, device=x.device).cumsum(0).to(torch.int32)
            z = lm.scaled_swiglu(torch._grouped_mm(xe, self.w1.transpose(-2, -1), offs=offs), pe)
            ye = torch._grouped_mm(z, self.w2.transpose(-2, -1), offs=offs)
        else:
            ye = torch.cat([F.linear(lm.scaled_swiglu(F.linear(xx, w1), pp), w2) for xx, pp, w1, w2 in
                            zip(xe.split(per_expert), pe.split(per_expert), self.w1.unbind(0), self.w2.unbind(0))])
        yc = ye.split([sizes[i] for i in by_expert])
        place = {c: j for j, c in enumerate(by_expert)}
        yr = torch.cat([yc[place[c]] for c in range(W * El)])
        ys = all_to_all_single(xs.new_empty(xs.shape), yr, send_rows, recv_rows)
        return torch.zeros_like(x).index_add_(0, order // k, ys).reshape(shape)


def build_ep_model(args, ranks, dtype):
    """train.py's model (the plain layer's weights under args.seed, f32 on the CPU) with every MoE
    layer replaced by this rank's EP layer holding its experts; on ranks.device in dtype."""
    start = lm.build_model(argparse.Namespace(**{**vars(args), "moe": "torch"}))
    E, H, Fd, k, r, W = args.experts, args.hidden, args.ffn, args.topk, ranks.rank, ranks.world
    El = E // W
    for block in start.blocks:
        full = block.moe
        if args.moe == "moex":
            import moex.torch as mt
            ep = mt.MoELayer(E, H, Fd, k, score="softmax", renorm=True, ep_group=ranks.ep_group,
                             ep_max_tokens=args.batch // W * args.seq, params_dtype=torch.float32,
                             device=ranks.device)
        else:
            ep = TorchEPMoE(E, H, Fd, k, r, W, grouped=ranks.device.type == "cuda").to(ranks.device)
        with torch.no_grad():
            ep.router_w.copy_(full.router_w)
            ep.w1.copy_(full.w1[r * El:(r + 1) * El])
            ep.w2.copy_(full.w2[r * El:(r + 1) * El])
        block.moe = ep
        block.mean_fraction = mean_over_ranks
    return start.to(device=ranks.device, dtype=dtype)


def mean_over_ranks(t):
    """t averaged over the ranks (no gradient: the load-balancing loss's expert fractions)."""
    t = t.detach().clone()
    dist.all_reduce(t)
    return t / dist.get_world_size()


def main():
    argv = sys.argv[1:]
    moe = "moex"
    if "--moe" in argv:   # train.py's parser knows its own variants; this one's are VARIANTS
        i = argv.index("--moe")
        moe = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if moe not in VARIANTS:
        raise SystemExit(f"train_ep.py: --moe must be one of {VARIANTS}, got {moe}")
    args = lm.parse_args(argv)
    args.moe = moe
    ranks = Ranks()
    ranks.name = f"ep_{moe}"
    if args.batch % ranks.world or args.experts % ranks.world:
        raise SystemExit(f"train_ep.py: --batch ({args.batch}) and --experts ({args.experts}) must be multiples "
                         f"of the {ranks.world} ranks")
    record = lm.train(args, dp=ranks)
    if ranks.rank == 0:
        print(f"{record['variant']}: final train {record['train_loss'][-1]:.4f}  val {record['val_loss'][-1][1]:.4f}  "
              f"{record['ms_per_step']} ms/step  {record['tokens_per_s']} tokens/s")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
