"""test_torch_cuda.py - what only the GPU shows: a whole MoE training step (forward, loss,
backward, SGD update) captured in one CUDA graph and replayed for new inputs, whose routing
changes the split values, against the same step run eagerly on a copy of the model; and
moex's grouped GEMM against torch._grouped_mm. Skipped without CUDA.

Graph against eager: the same moex kernels on the same inputs (moex is deterministic), but
cuBLAS may pick other algorithms for the head under capture, so: the loss to 1e-3 relative
and the bf16 parameters to bf16's default tolerance, over four replays that each update the
weights. Against torch._grouped_mm (bf16, f32 accumulation both): 1e-2 of the largest
magnitude.
"""
import copy
import os

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import moex.torch as mt  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
E, H, FF, T, K = 8, 64, 64, 96, 2


class PartsMoE(torch.nn.Module):
    """An MoE layer from moex.torch's parts: router GEMM, router, permute, GroupedMLP on the
    device splits that permute returns, unpermute."""

    def __init__(self):
        super().__init__()
        self.router_w = torch.nn.Parameter(0.3 * torch.randn(E, H, device="cuda", dtype=torch.bfloat16))
        self.experts = mt.GroupedMLP(E, H, FF, bias2=True, scale_b2=True, params_dtype=torch.bfloat16, device="cuda",
                                     init_method=lambda t: torch.nn.init.normal_(t, std=0.1))

    def forward(self, x):
        probs, ids = mt.router(F.linear(x.float(), self.router_w.float()), K)
        xp, probs_p, splits, row_map = mt.permute(x, ids, probs, E)
        return mt.unpermute(self.experts(xp, splits, probs_p), row_map, K)


def make_model(kind):
    torch.manual_seed(11)
    if kind == "moe_layer":
        moe = mt.MoELayer(E, H, FF, topk=K, bias1=True, bias2=True, params_dtype=torch.bfloat16, device="cuda",
                          init_method=lambda t: torch.nn.init.normal_(t, std=0.1))
    else:
        moe = PartsMoE()
    head = torch.nn.Linear(H, 16, device="cuda", dtype=torch.bfloat16)
    return torch.nn.Sequential(moe, head)


def train_step(model, x, target, lr=0.05):
    """Forward, loss, backward, and an SGD update in place; returns the loss."""
    loss = F.cross_entropy(model(x).float(), target)
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(loss, params)
    with torch.no_grad():
        torch._foreach_add_(params, grads, alpha=-lr)
    return loss.detach()


@pytest.mark.parametrize("kind", ["moe_layer", "parts"])
def test_cuda_graph_training_step_replays_with_new_routing(kind):
    model = make_model(kind)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, 16, (T,), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # warm-up outside the graph (contexts, allocator, autograd)
        for _ in range(2):
            train_step(model, x, target)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss_g = train_step(model, x, target)
    eager = copy.deepcopy(model)   # the state the graph starts from
    splits_seen = set()
    for seed in range(4):
        g = torch.Generator(device="cuda").manual_seed(100 + seed)
        x_new = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g) * (1 + seed)
        t_new = torch.randint(0, 16, (T,), device="cuda", generator=g)
        x.copy_(x_new)
        target.copy_(t_new)
        graph.replay()
        loss_e = train_step(eager, x_new, t_new)
        torch.testing.assert_close(loss_g, loss_e, rtol=1e-3, atol=1e-5)
        for (name, a), b in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(a, b, msg=lambda m, n=name: f"{n} after replay {seed}: {m}")
        router_w = model[0].router_w
        _, ids = mt.router(F.linear(x_new.float(), router_w.float()), K)
        splits_seen.add(tuple(torch.bincount(ids.flatten().long(), minlength=E).tolist()))
    assert len(splits_seen) == 4, "the replays did not change the routing"


@pytest.mark.parametrize("splits", [[128, 64, 0, 320], [0, 0, 512, 0], [100, 1, 255, 156]])
def test_against_torch_grouped_mm(splits):
    g = torch.Generator(device="cuda").manual_seed(12)
    G, Kd, N = len(splits), 256, 192
    Tn = sum(splits)
    x = torch.randn(Tn, Kd, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    w = (0.05 * torch.randn(G, N, Kd, device="cuda", generator=g)).bfloat16().requires_grad_(True)
    dy = torch.randn(Tn, N, device="cuda", dtype=torch.bfloat16, generator=g)
    offs = torch.cumsum(torch.tensor(splits, device="cuda"), 0).to(torch.int32)
    y = mt.gmm(x, w, torch.tensor(splits, device="cuda"), trans_b=True)
    got = torch.autograd.grad(y, [x, w], dy)
    want_y = torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
    want = torch.autograd.grad(want_y, [x, w], dy)
    for name, a, e in [("y", y, want_y), ("dx", got[0], want[0]), ("dw", got[1], want[1])]:
        m = e.float().abs().max().clamp_min(1.0)
        torch.testing.assert_close(a.float() / m, e.float() / m, rtol=1e-2, atol=1e-2, msg=lambda s, n=name: f"{n}: {s}")


def test_cuda_graph_separate_weights_int32_splits_zero_tails():
    """GroupedLinear's separate weights (the pointer array, built by the eager warm-up) with
    int32 device splits, forward and backward captured once and replayed for new split values
    (sums below T): the eager results, and the rows past the groups of y and dx zero."""
    torch.manual_seed(13)
    G, Kd, N, Tn = 4, 64, 32, 96
    layer = mt.GroupedLinear(G, Kd, N, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(Tn, Kd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    splits = torch.tensor([20, 0, 30, 10], device="cuda", dtype=torch.int32)
    dy = torch.randn(Tn, N, device="cuda", dtype=torch.bfloat16)

    def step():
        y = layer(x, splits)
        return (y,) + torch.autograd.grad(y, [x] + [getattr(layer, f"weight{g}") for g in range(G)], dy)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for new in ([5, 40, 0, 33], [0, 0, 0, 96], [1, 2, 3, 4]):
        splits.copy_(torch.tensor(new, dtype=torch.int32))
        x.data.copy_(torch.randn(Tn, Kd, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        want = step()
        S = sum(new)
        for name, a, e in zip(["y", "dx"] + [f"dw{g}" for g in range(G)], outs, want):
            torch.testing.assert_close(a, e, msg=lambda m, n=name: f"{n} for splits {new}: {m}")
        assert torch.count_nonzero(outs[0][S:]) == 0 and torch.count_nonzero(outs[1][S:]) == 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_cuda_compile_delay_wgrad(backend):
    """torch.compile(fullgraph=True) of GroupedMLP and GroupedLinear with delay_wgrad_compute on
    the GPU: after backward_dw() the weight gradients of the eager module (inductor may reuse the
    backward's buffers: the delayed step keeps copies)."""
    torch.manual_seed(14)
    for make, names in [(lambda: mt.GroupedMLP(4, 64, 32, delay_wgrad_compute=True, device="cuda"), ["w1", "w2"]),
                        (lambda: mt.GroupedLinear(4, 64, 32, delay_wgrad_compute=True, device="cuda"),
                         [f"weight{g}" for g in range(4)])]:
        eager, comp = make(), make()
        comp.load_state_dict(eager.state_dict())
        x = torch.randn(96, 64, device="cuda")
        splits = torch.tensor([30, 0, 40, 20], device="cuda")
        run = lambda m, x: (m(x, splits) ** 2).sum()   # noqa: E731
        compiled = torch.compile(run, fullgraph=True, backend=backend)
        for m, f in ((eager, run), (comp, compiled)):
            for _ in range(2):
                f(m, x).backward()
                torch.randn(1 << 20, device="cuda").sum()   # other work between backward and backward_dw
            m.backward_dw()
            m.backward_dw()
        for n in names:
            torch.testing.assert_close(getattr(comp, n).grad, getattr(eager, n).grad, rtol=1e-4, atol=1e-4)


def test_separate_weights_not_16_byte_aligned_are_stacked():
    """GroupedLinear's separate weights as views into one buffer, one bf16 element past 16-byte
    alignment: the Hopper kernels read separate weights by TMA, which needs 16 bytes, so the
    operator stacks them instead (read through the pointers, they would come out shifted by an
    element: y and dx would differ), and a layer with aligned weights does not (aten::stack, which
    the operator calls in C++, seen by the profiler). y and dx are the aligned layer's, and the
    rows past the groups are zero."""
    torch.manual_seed(15)
    G, Kd, N, Tn = 3, 64, 32, 100
    ref = mt.GroupedLinear(G, Kd, N, params_dtype=torch.bfloat16, device="cuda")
    layer = mt.GroupedLinear(G, Kd, N, params_dtype=torch.bfloat16, device="cuda")
    layer.load_state_dict(ref.state_dict())
    buf = torch.empty(G * N * Kd + 1, dtype=torch.bfloat16, device="cuda")
    for g in range(G):
        view = buf[1 + g * N * Kd:1 + (g + 1) * N * Kd].view(N, Kd)
        view.copy_(getattr(ref, f"weight{g}").detach())
        getattr(layer, f"weight{g}").data = view
    assert getattr(layer, "weight0").data_ptr() % 16 == 2
    x = torch.randn(Tn, Kd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(Tn, N, device="cuda", dtype=torch.bfloat16)
    splits = [30, 0, 50]

    def stacks(m):   # aten::stack calls of a forward: one for the layer's G biases, one more for weights
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with torch.no_grad():
                m(x, splits)
        return sum(e.name == "aten::stack" for e in prof.events())

    assert stacks(ref) == 1, "aligned separate weights were stacked"
    assert stacks(layer) == 2, "misaligned separate weights were passed as pointers"
    y_ref = ref(x, splits)
    y = layer(x, splits)
    torch.testing.assert_close(y, y_ref)
    dx_ref, = torch.autograd.grad(y_ref, x, dy)
    dx, = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(dx, dx_ref)
    assert torch.count_nonzero(y[80:]) == 0 and torch.count_nonzero(dx[80:]) == 0


def test_separate_weights_pointer_cache_follows_storage_and_refuses_capture():
    """GroupedLinear's pointer arrays (host and device) follow a weight that changes storage (the
    next forward and backward give the new weight's results, bitwise the packed layer's: on Hopper
    through the maps kept beside the array, written again); a change seen while a CUDA graph is
    captured is a ValueError (the device copy cannot be captured), and the same call outside
    capture runs."""
    torch.manual_seed(16)
    G, Kd, N, Tn = 3, 64, 32, 96
    layer = mt.GroupedLinear(G, Kd, N, bias=False, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(Tn, Kd, device="cuda", dtype=torch.bfloat16)
    splits = torch.tensor([40, 16, 40], device="cuda")
    ws = lambda: [getattr(layer, f"weight{g}") for g in range(G)]   # noqa: E731
    want = lambda: mt.grouped_linear(x, torch.stack(ws()).detach(), splits)   # noqa: E731
    arrays = lambda: layer._pointers.arrays(ws())   # noqa: E731
    maps = torch.ops.moex.weight_maps_size(layer.weight0, G)
    hopper = torch.cuda.get_device_capability() == (9, 0) and os.environ.get("MOEX_CUDA_GEMM") != "portable"
    assert maps == (G * 3 * 128 if hopper else 0)
    dy = torch.randn(Tn, N, device="cuda", dtype=torch.bfloat16)
    for step in range(2):
        xg = x.clone().requires_grad_()
        y = layer(xg, splits)
        dx, = torch.autograd.grad(y, xg, dy)
        xr = x.clone().requires_grad_()
        y_ref = mt.grouped_linear(xr, torch.stack(ws()).detach(), splits)
        dx_ref, = torch.autograd.grad(y_ref, xr, dy)
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref), step
        dev, host = arrays()
        assert host.tolist() == [w.data_ptr() for w in ws()] + [1, N, Kd, maps]
        assert dev[:G].tolist() == host[:G].tolist() and dev.numel() == (G + (128 + maps) // 8 if maps else G)
        layer.weight1.data = torch.randn(N, Kd, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, splits), want(), rtol=0, atol=0)
        layer.weight2.data = torch.randn(N, Kd, device="cuda", dtype=torch.bfloat16)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(ValueError, match="changed during CUDA graph capture"):
            with torch.cuda.graph(graph, stream=s):
                layer(x, splits)
        torch.testing.assert_close(layer(x, splits), want(), rtol=0, atol=0)


def test_separate_weights_without_room_for_the_maps_still_run():
    """The operator given a device array with no room for the kept maps (only the G addresses, as
    for a layer that ran in f32 before it was cast) writes no maps (ptrs_host's last entry 0) and
    the calls write them per call: y bitwise the packed forward's."""
    torch.manual_seed(17)
    G, Kd, N, Tn = 3, 64, 32, 96
    ws = [torch.randn(N, Kd, device="cuda", dtype=torch.bfloat16) for _ in range(G)]
    x = torch.randn(Tn, Kd, device="cuda", dtype=torch.bfloat16)
    splits = torch.tensor([40, 16, 40], device="cuda")
    ptrs, host = torch.zeros(G, dtype=torch.int64, device="cuda"), torch.zeros(G + 4, dtype=torch.int64)
    y = torch.ops.moex.grouped_linear_discrete_forward(x, ws, ptrs, host, splits, None, None, 0)
    assert torch.equal(y, mt.grouped_linear(x, torch.stack(ws), splits))
    assert host.tolist() == [w.data_ptr() for w in ws] + [1, N, Kd, 0]
    assert ptrs.tolist() == host[:G].tolist()
