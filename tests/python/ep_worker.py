"""ep_worker.py - one rank of moex.torch's expert-parallel check, run under mpirun (an mpi4py
communicator: moex's EP over MPI, the CPU backend; tests/python/test_torch_ep.py) or under
torchrun (a torch.distributed NCCL process group: moex's EP over NCCL, one GPU a rank;
scripts/gpu_python.sh's ep stage): MoELayer with ep_group against the single-process MoELayer on
the whole batch, on every rank; and ep_dispatch / ep_combine around experts that scale each row
(y, dx, dprobs against the same math on the rank's own tokens), a dispatch past a small
capacity (the rows it drops counted), the arguments they refuse before any exchange; with --compile the layer's step under torch.compile
(fullgraph) bitwise the eager one, and on CUDA with --graph a training step of the EP layer
captured in one CUDA graph, replayed with new routing, bitwise an eager step's. Every rank builds the same global
problem from one seed (weights, the W ranks' tokens, dy), runs its share through the EP layer and
the whole batch through the reference, and checks y and dx of its tokens, its experts' dw1, dw2,
db1, db2, and drouter_w summed over the ranks (f32: relative 1e-5 of each tensor's largest value;
bf16: 3e-2). A rank with no tokens (the last, when --empty-rank) takes part too. Exit status 0 on
every rank, or 1 on a rank whose check failed (the message names it).

Usage: mpirun -np N python3 tests/python/ep_worker.py [--dtype f32|bf16] [--empty-rank] [--tokens T]
           [--transfer auto|capacity|peer] [--graph] [--compile]
       torchrun --nproc_per_node N tests/python/ep_worker.py [the same options]
"""
import argparse
import faulthandler
import os
import sys

import torch

import moex.torch as mt


def close(name, got, want, rtol):
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
    if want.numel() == 0:
        return
    scale = want.double().abs().max().clamp_min(1e-30)
    err = (got.double() - want.double()).abs().max() / scale
    if not err <= rtol:
        raise AssertionError(f"{name}: max error {err:.3e} of its largest value, tolerance {rtol}")


class Group:
    """The launcher's group: (group, W, r, device, allgather of Python objects)."""

    def __init__(self):
        if "LOCAL_RANK" in os.environ:   # torchrun: NCCL over one GPU a rank
            import torch.distributed as dist
            self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(self.device)
            dist.init_process_group("nccl", device_id=self.device)
            self.group, self.W, self.r = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
            self.name = "NCCL"

            def allgather(obj):
                out = [None] * self.W
                dist.all_gather_object(out, obj)
                return out
        else:   # mpirun: MPI, the CPU backend
            from mpi4py import MPI
            self.device, self.group = torch.device("cpu"), MPI.COMM_WORLD
            self.W, self.r, self.name = self.group.Get_size(), self.group.Get_rank(), "MPI"
            allgather = self.group.allgather
        self.allgather = allgather

    def finish(self):
        if self.name == "NCCL":
            torch.distributed.destroy_process_group()


def refusals(g, ep, ctx, x, ids, probs, handle, T, dims):
    """What the EP layer, EPContext, ep_dispatch and ep_combine refuse on this rank before any
    exchange (ValueError naming it): the other device for the group, more tokens than the
    capacity, ids of another shape, a handle of another size, and on CUDA CPU tensors. None when
    each is refused, else the first that was not."""
    E, H, k = dims
    other = "cuda" if g.device.type == "cpu" else "cpu"
    device_rule = "an MPI communicator runs moex's EP on the CPU backend" if other == "cuda" else \
        "an NCCL process group runs moex's EP on CUDA"
    extra = x.new_zeros(T + 1, H)
    cases = [("EPContext on " + other, lambda: mt.EPContext(g.group, E, k, H, x.dtype, max_tokens=T, device=other),
              device_rule),
             ("the layer past ep_max_tokens", lambda: ep(extra), "more than the layer's ep_max_tokens"),
             ("ep_dispatch past max_tokens", lambda: mt.ep_dispatch(ctx, extra, ids, probs),
              "more than the EPContext's max_tokens"),
             ("ep_dispatch, ids of another shape", lambda: mt.ep_dispatch(ctx, x, ids[:, :1], probs), "ids must be"),
             ("ep_combine, a short handle", lambda: mt.ep_combine(ctx, x.new_zeros(ctx.max_recv_rows, H), handle[1:],
                                                                  x.shape[0]), "handle must be")]
    if g.device.type == "cuda":
        cases += [("the layer on CPU tokens", lambda: ep(x.cpu()), "x is on cpu"),
                  ("ep_dispatch of CPU tokens", lambda: mt.ep_dispatch(ctx, x.cpu(), ids, probs), "x is on cpu"),
                  ("ep_dispatch, CPU ids", lambda: mt.ep_dispatch(ctx, x, ids.cpu(), probs), "ids must be")]
    for what, call, needle in cases:
        try:
            call()
            return f"{what}: not refused"
        except ValueError as e:
            if needle not in str(e):
                return f"{what}: {e}"
    return None


def compiled_step(ep, x0, dy):
    """The layer's step (y, dx and every parameter's gradient) under torch.compile(fullgraph=True,
    aot_eager: traced through the operators' fake kernels and autograd, no code generated) must
    equal the eager step bitwise. None when it does, else what differed."""
    results = []
    for layer in (ep, torch.compile(ep, backend="aot_eager", fullgraph=True)):
        ep.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        y = layer(x)
        y.backward(dy)   # (the compiled backward: AOT autograd's graph of the operators' autograd)
        results.append([y.detach(), x.grad] + [p.grad for p in ep.parameters()])
    names = ["y", "dx"] + [n for n, _ in ep.named_parameters()]
    for name, a, b in zip(names, *results):
        if not torch.equal(a, b):
            return f"torch.compile: {name} differs from the eager step's"
    return None


def graph_replays(ep, dims, g, x0, dy, args, opts):
    """A training step of the EP layer (forward and backward, the gradients of x and of every
    parameter) captured in one CUDA graph, then replayed with new tokens (new routing) three
    times: each replay's y and gradients must equal, bitwise, an eager step of a second layer with
    the same weights on the same tokens. None when they do, else what differed."""
    E, H, F, k = dims

    def copy_of_ep():
        layer = mt.MoELayer(E, H, F, k, ep_group=g.group, ep_max_tokens=ep._ep.max_tokens, device=x0.device,
                            ep_transfer=args.transfer, **opts)
        layer.load_state_dict(ep.state_dict())
        return layer

    # the captured layer is a fresh copy: ep's parameters still have gradient nodes made on the
    # default stream alive (the double-backward check's graph), and a captured backward that
    # accumulates into them would make the default stream wait on the capture (PyTorch's
    # whole-network capture has the same rule: nothing of an earlier step's graph kept alive)
    cap, twin = copy_of_ep(), copy_of_ep()
    static_x = x0.clone().requires_grad_(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # (warm-up off the default stream, as torch.cuda.graph wants)
        for _ in range(2):
            cap.zero_grad(set_to_none=True)
            static_x.grad = None
            cap(static_x).backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    cap.zero_grad(set_to_none=True)
    static_x.grad = None
    cuda_graph = torch.cuda.CUDAGraph()
    # thread_local: the NCCL process group's watchdog thread queries its events meanwhile, which a
    # global capture counts against it (the suspected cause of run 57's invalidated capture)
    with torch.cuda.graph(cuda_graph, capture_error_mode="thread_local"):
        static_y = cap(static_x)
        static_y.backward(dy)
    for trial in range(3):
        xn = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1000 + 7 * trial + g.r)).to(x0)
        with torch.no_grad():
            static_x.copy_(xn)
        cuda_graph.replay()
        twin.zero_grad(set_to_none=True)
        xt = xn.clone().requires_grad_(True)
        yt = twin(xt)
        yt.backward(dy)
        got = [static_y, static_x.grad] + [p.grad for p in cap.parameters()]
        want = [yt, xt.grad] + [p.grad for p in twin.parameters()]
        names = ["y", "dx"] + [n for n, _ in cap.named_parameters()]
        differs = [name for name, a, b in zip(names, got, want) if not torch.equal(a, b)]
        if differs:
            break
    # a captured context keeps its NCCL communicator when collected (NCCL's destroy would wait for
    # the graph): the documented order, the graph freed and then close()
    del cuda_graph
    cap.close()
    return f"graph replay {trial}: {', '.join(differs)} differ from the eager step's" if differs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--empty-rank", action="store_true")
    ap.add_argument("--tokens", type=int, default=6, help="tokens of a rank (odd ranks one fewer)")
    ap.add_argument("--transfer", default="auto", choices=["auto", "capacity", "peer"])
    ap.add_argument("--graph", action="store_true", help="CUDA: also a step captured in a CUDA graph, replayed")
    ap.add_argument("--compile", action="store_true", help="also the layer's step under torch.compile(fullgraph)")
    ap.add_argument("--fp8", action="store_true", help="both layers with fp8_recipe='block' (the EP layer's tokens "
                    "travel as FP8 rows; its dW1 reads the dequantized rows' columnwise copy: a looser dW1)")
    ap.add_argument("--hang-s", type=float, default=0, help="after this many seconds, print every thread's "
                    "Python stack and exit (a hang's place; 0: never)")
    args = ap.parse_args()
    if args.hang_s > 0:
        faulthandler.dump_traceback_later(args.hang_s, exit=True)
    g = Group()
    W, r, dev = g.W, g.r, g.device
    dt, rtol = (torch.float32, 1e-5) if args.dtype == "f32" else (torch.bfloat16, 3e-2)
    torch.manual_seed(7)
    E, H, F, k, T = 2 * W, 16, 8, 2, args.tokens
    tokens = [0 if args.empty_rank and q == W - 1 else T - q % 2 for q in range(W)]   # uneven; maybe one empty
    first = sum(tokens[:r])
    opts = dict(bias1=True, bias2=True, params_dtype=dt, fp8_recipe="block" if args.fp8 else None)
    ref = mt.MoELayer(E, H, F, k, **opts)   # (made on the CPU from the seed, then moved: alike on every rank)
    with torch.no_grad():   # nonzero biases: their gradients and the layer's use of them are checked
        ref.b1.normal_(std=0.1), ref.b2.normal_(std=0.1)
    ref.to(dev)
    ep = mt.MoELayer(E, H, F, k, ep_group=g.group, ep_max_tokens=T, device=dev, ep_transfer=args.transfer, **opts)
    El = E // W
    with torch.no_grad():
        ep.router_w.copy_(ref.router_w)
        for name in ("w1", "w2", "b1", "b2"):
            getattr(ep, name).copy_(getattr(ref, name)[r * El:(r + 1) * El])
    xg = torch.randn(sum(tokens), H).to(dt).to(dev).requires_grad_(True)
    dyg = torch.randn(sum(tokens), H).to(dt).to(dev)
    x = xg.detach()[first:first + tokens[r]].clone().requires_grad_(True)

    y = ep(x)
    y.backward(dyg[first:first + tokens[r]])
    yg = ref(xg)
    yg.backward(dyg)

    # the functional dispatch and combine around experts that scale each row by its prob and
    # by c(e) = e + 1 (e: the global expert): y[t] = x[t] sum_j probs[t, j] (ids[t, j] + 1)
    ids_g = torch.argsort(torch.rand(sum(tokens), E), dim=1)[:, :k].to(dev)   # k distinct experts a token
    probs_g = torch.rand(sum(tokens), k).to(dev)
    ctx = mt.EPContext(g.group, E, k, H, dt, max_tokens=T, device=dev, transfer=args.transfer)
    xf = x.detach().clone().requires_grad_(True)
    probs = probs_g[first:first + tokens[r]].clone().requires_grad_(True)
    ids = ids_g[first:first + tokens[r]]
    xr, probs_r, splits, handle, dropped = mt.ep_dispatch(ctx, xf, ids, probs)
    c = torch.repeat_interleave(torch.arange(r * El, (r + 1) * El, device=dev) + 1.0, splits)
    c = torch.cat([c, c.new_zeros(ctx.max_recv_rows - c.numel())])
    yf = mt.ep_combine(ctx, xr * (probs_r * c)[:, None].to(dt), handle, tokens[r])
    dyf = torch.randn(yf.shape).to(dt).to(dev)
    yf.backward(dyf)
    xw = xf.detach().clone().requires_grad_(True)
    pw = probs.detach().clone().requires_grad_(True)
    yw = (xw.float() * (pw * (ids + 1)).sum(1, keepdim=True)).to(dt)
    yw.backward(dyf)

    # capacity overflow: a context that keeps 3 expert rows a rank reports the others as dropped
    small = mt.EPContext(g.group, E, k, H, dt, max_tokens=T, max_recv_rows=3, device=dev, transfer=args.transfer)
    mine = int(((ids_g >= r * El) & (ids_g < (r + 1) * El)).sum())   # the slots routed to this rank's experts
    _, _, splits3, _, dropped3 = mt.ep_dispatch(small, x.detach(), ids, probs.detach())
    overflow = (int(dropped3), int(splits3.sum())), (max(mine - 3, 0), min(mine, 3))
    # the layer past its capacity: a zero router sends every token to experts 0 and 1 (ties go to
    # the lower index), both rank 0's, which keeps 3 rows and drops the rest
    full = mt.MoELayer(E, H, F, k, ep_group=g.group, ep_max_tokens=T, ep_max_recv_rows=3, device=dev,
                       ep_transfer=args.transfer, **opts)
    with torch.no_grad():
        full.router_w.zero_()
    full(x.detach())
    layer_dropped = (int(full.ep_dropped), max(k * sum(tokens) - 3, 0) if r == 0 else 0)
    full.close(), full.close()   # (every rank: not collective, a second close does nothing, a later call is refused)
    try:
        full(x.detach())
        closed_layer = "MoELayer ran on a closed EPContext"
    except ValueError as e:
        closed_layer = None if "closed" in str(e) else f"MoELayer on a closed EPContext raised {e}"
    small.close(), small.close()   # (a second close does nothing)
    try:
        mt.ep_dispatch(small, x.detach(), ids, probs.detach())
        closed = "ep_dispatch ran on a closed EPContext"
    except ValueError as e:
        closed = None if "closed" in str(e) else f"ep_dispatch on a closed EPContext raised {e}"

    # double backward is refused (as everywhere in moex.torch), not silently wrong
    gx, = torch.autograd.grad(ep(x).sum(), x, create_graph=True)
    try:
        gx.sum().backward()
        double = "differentiating the EP layer's gradient twice did not raise"
    except RuntimeError as e:
        double = None if "differentiate twice" in str(e) else f"double backward raised {e}"

    # a layer made in f32 and converted (.to(dtype), as a model is): its EP context follows
    conv = mt.MoELayer(E, H, F, k, ep_group=g.group, ep_max_tokens=T, device=dev, ep_transfer=args.transfer,
                       **{**opts, "params_dtype": torch.float32})
    with torch.no_grad():
        for (name, a), b in zip(conv.named_parameters(), ep.parameters()):
            a.copy_(b)
    conv.to(dt)
    with torch.no_grad():
        converted = None if torch.equal(conv(x.detach()), ep(x.detach())) else \
            f"a layer converted to {args.dtype} after its construction differs from one made in it"
    del conv

    # FP8: the local experts' kept weight copies (is_first_microbatch) give the per-call forward
    kept = None
    if args.fp8:
        with torch.no_grad():
            y0 = ep(x.detach())
            y1, y2 = ep(x.detach(), is_first_microbatch=True), ep(x.detach(), is_first_microbatch=False)
        if not (torch.equal(y1, y0) and torch.equal(y2, y0)):
            kept = "the EP layer with its experts' kept FP8 weight copies differs from the per-call quantization"

    drw = sum(g.allgather(ep.router_w.grad.double().cpu())).to(dev)   # (pickled tensors: no numpy needed)
    refused = refusals(g, ep, ctx, x.detach(), ids, probs.detach(), handle, T, (E, H, k))
    compiled = compiled_step(ep, x.detach(), dyg[first:first + tokens[r]]) if args.compile else None
    graph = None
    if args.graph and dev.type == "cuda":
        graph = graph_replays(ep, (E, H, F, k), g, x.detach(), dyg[first:first + tokens[r]], args, opts)
    failed = None
    try:
        rows = slice(first, first + tokens[r])
        close("y", y, yg.detach()[rows], rtol)
        close("dx", x.grad, xg.grad[rows], rtol)
        for name in ("w1", "w2", "b1", "b2"):
            close(f"d{name}", getattr(ep, name).grad, getattr(ref, name).grad[r * El:(r + 1) * El],
                  0.2 if args.fp8 and name == "w1" else rtol)
        close("drouter_w (summed over the ranks)", drw, ref.router_w.grad, rtol)
        close("ep_dispatch + ep_combine: y", yf, yw, rtol)
        close("ep_dispatch + ep_combine: dx", xf.grad, xw.grad, rtol)
        close("ep_dispatch + ep_combine: dprobs", probs.grad, pw.grad, rtol)
        if double:
            raise AssertionError(double)
        if converted:
            raise AssertionError(converted)
        if kept:
            raise AssertionError(kept)
        if closed or closed_layer:
            raise AssertionError(closed or closed_layer)
        if layer_dropped[0] != layer_dropped[1]:
            raise AssertionError(f"MoELayer's ep_dropped {layer_dropped[0]}, want {layer_dropped[1]}")
        if graph:
            raise AssertionError(graph)
        if compiled:
            raise AssertionError(compiled)
        if refused:
            raise AssertionError(refused)
        if overflow[0] != overflow[1] or int(dropped):
            raise AssertionError(f"ep_dispatch's dropped and kept rows {overflow[0]}, want {overflow[1]}; "
                                 f"{int(dropped)} dropped at full capacity")
        rows = int(splits.sum())
        if xr[rows:].count_nonzero() or probs_r[rows:].count_nonzero():
            raise AssertionError(f"ep_dispatch: rows of xr or probs_r past the {rows} received are not 0")
    except Exception as e:   # (every rank reaches the verdicts' allgather)
        failed = f"rank {r} of {W} ({g.name}, {args.dtype}{', an empty rank' if args.empty_rank else ''}): {e}"
    verdicts = g.allgather(failed)
    if r == 0:
        print("\n".join(v for v in verdicts if v) or
              f"ok: {W} ranks over {g.name} ({ctx.transfer}), {args.dtype}, tokens {tokens}")
    del ep, ctx, small   # (the EP contexts before the group)
    g.finish()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
