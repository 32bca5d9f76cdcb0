"""test_torch_grouped_linear.py - moex.torch's grouped linear operators, gmm and GroupedLinear
against plain PyTorch (a loop of F.linear per group, autograd), on the CPU and, where there is
a GPU, on CUDA.

Tolerances: f32 results agree to 1e-5 relative (both sides sum in f32, in other orders); bf16
results to 2e-2 of the reference's largest magnitude (one bf16 rounding of each output, inputs
the same). Rows past sum(splits) are zero (test_torch_edges.py checks them).
"""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import moex  # noqa: E402
import moex.torch as mt  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SPLITS = {"even": [5, 5, 5, 5], "empty_groups": [0, 9, 0, 11], "one_group": [20], "short": [3, 0, 7, 2]}


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def reference(x, w, splits, bias=None, probs=None):
    """y[r] = x[r] W_g^T (+ b_g | + p_r b_g) by a loop of F.linear in f32; rows past the sum are 0."""
    y = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float32, device=x.device)
    r = 0
    for g, s in enumerate(splits):
        rows = slice(r, r + s)
        y[rows] = F.linear(x[rows].float(), w[g].float())
        if bias is not None:
            b = bias[g].float()
            y[rows] += b if probs is None else probs[rows, None] * b
        r += s
    return y


def inputs(device, dtype, splits, T=None, K=24, N=16, bias=False, probs=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = T or sum(splits)
    x = torch.randn(T, K, generator=g).to(device, dtype)
    w = (0.2 * torch.randn(len(splits), N, K, generator=g)).to(device, dtype)
    b = torch.randn(len(splits), N, generator=g).to(device, dtype) if bias else None
    p = torch.rand(T, generator=g).to(device) if probs else None
    return x, w, b, p


def assert_rows_close(got, want, n, dtype):
    torch.testing.assert_close(got[:n].float(), want[:n].float(), **tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", sorted(SPLITS))
@pytest.mark.parametrize("bias_kind", ["none", "add", "scaled"])
def test_forward_and_backward(device, dtype, kind, bias_kind):
    splits = SPLITS[kind]
    n = sum(splits)
    T = n + (4 if kind == "short" else 0)   # rows past sum(splits)
    x, w, b, p = inputs(device, dtype, splits, T=T, bias=bias_kind != "none", probs=bias_kind == "scaled")
    leaves = [t for t in (x, w, b, p) if t is not None]
    for t in leaves:
        t.requires_grad_(True)
    y = mt.grouped_linear(x, w, torch.tensor(splits, device=device), b, p)
    assert y.shape == (T, w.shape[1]) and y.dtype == dtype
    want = reference(x, w, splits, b, p)
    assert_rows_close(y, want, n, dtype)

    dy = torch.randn(T, w.shape[1], device=device).to(dtype)
    dy[n:] = 0   # the tail: y's rows there are constant 0 (test_torch_edges.py gives them a gradient)
    got = torch.autograd.grad(y, leaves, dy)
    ref = torch.autograd.grad(want, leaves, dy.float())
    for name, a, e in zip(["x", "w", "bias", "probs"][:len(leaves)], got, ref):
        rows = n if name == "x" or name == "probs" else None
        scale = e.float().abs().max().clamp_min(1.0)
        torch.testing.assert_close(a[:rows].float() / scale, e[:rows].float() / scale, **tol(dtype),
                                   msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_list_and_tensor_splits_agree(device):
    x, w, _, _ = inputs(device, torch.float32, SPLITS["empty_groups"])
    a = mt.grouped_linear(x, w, SPLITS["empty_groups"])
    b = mt.grouped_linear(x, w, torch.tensor(SPLITS["empty_groups"], device=device))
    assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic(device):
    x, w, b, _ = inputs(device, torch.bfloat16, SPLITS["even"], bias=True)
    ys = [mt.grouped_linear(x, w, SPLITS["even"], b) for _ in range(3)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("trans_b", [False, True])
def test_gmm(device, trans_b):
    """grouped_gemm's gmm: b [G, K, N] (or [G, N, K] with trans_b), batch_sizes on the host."""
    splits = SPLITS["empty_groups"]
    a, w, _, _ = inputs(device, torch.float32, splits)
    b = (w if trans_b else w.transpose(1, 2).contiguous()).requires_grad_(True)
    a.requires_grad_(True)
    y = mt.gmm(a, b, torch.tensor(splits), trans_b=trans_b)
    want = reference(a, b if trans_b else b.transpose(1, 2), splits)
    torch.testing.assert_close(y, want, **tol(torch.float32))
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [a, b], dy)
    ref = torch.autograd.grad(want, [a, b], dy)
    for g, e in zip(got, ref):
        torch.testing.assert_close(g, e, **tol(torch.float32))


@pytest.mark.filterwarnings("ignore:Input #")
def test_gradcheck():
    """Finite differences of the f32 operator (eps 1e-2 on O(1) inputs: f32's rounding stays
    well under the 2e-2 tolerance)."""
    splits = [2, 0, 3]
    x, w, b, p = inputs("cpu", torch.float32, splits, K=4, N=3, bias=True, probs=True)
    args = [t.requires_grad_(True) for t in (x, w, b, p)]
    fn = lambda x, w, b, p: mt.grouped_linear(x, w, splits, b, p)  # noqa: E731
    assert torch.autograd.gradcheck(fn, args, eps=1e-2, atol=2e-2, rtol=2e-2)


def test_opcheck():
    """torch.library's own checks of the operators: schema, fake kernels, autograd registration."""
    splits = torch.tensor([3, 0, 5])
    x, w, b, p = inputs("cpu", torch.float32, [3, 0, 5], bias=True, probs=True)
    x.requires_grad_(True)
    w.requires_grad_(True)
    torch.library.opcheck(torch.ops.moex.grouped_linear_forward.default, (x, w, splits, b, p, 2))
    dy = torch.randn(8, w.shape[1])
    torch.library.opcheck(torch.ops.moex.grouped_linear_backward_data.default,
                          (dy, w.detach(), splits, b, p, 2, True, True, True))
    torch.library.opcheck(torch.ops.moex.grouped_linear_backward_weight.default, (x.detach(), dy, splits, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    splits = torch.tensor(SPLITS["empty_groups"], device=device)
    layer = mt.GroupedLinear(4, 24, 16, device=device)
    x = torch.randn(20, 24, device=device, requires_grad=True)

    def step(x):
        y = layer(x, splits)
        return (y * y).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss_c = compiled(x)
    (gx_c,) = torch.autograd.grad(loss_c, [x])
    loss_e = step(x)
    (gx_e,) = torch.autograd.grad(loss_e, [x])
    torch.testing.assert_close(loss_c, loss_e)
    torch.testing.assert_close(gx_c, gx_e)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", [False, True])
def test_module(device, packed):
    layer = mt.GroupedLinear(3, 8, 5, bias=True, device=device, packed=packed)
    names = {n for n, _ in layer.named_parameters()}
    assert names == ({"weight", "bias"} if packed else {f"{k}{g}" for k in ("weight", "bias") for g in range(3)})
    splits = [4, 0, 6]
    x = torch.randn(10, 8, device=device, requires_grad=True)
    y = layer(x, splits)
    w = torch.stack([getattr(layer, f"weight{g}") for g in range(3)]) if not packed else layer.weight
    b = torch.stack([getattr(layer, f"bias{g}") for g in range(3)]) if not packed else layer.bias
    torch.testing.assert_close(y, reference(x, w, splits, b), **tol(torch.float32))
    y.sum().backward()
    grads = [p.grad for p in layer.parameters()]
    assert all(g is not None for g in grads)


def reference_dw(layer, x, dy, splits):
    """dW_g = dy_g^T x_g in f64, per group, as [G, N, K]."""
    out, r = [], 0
    for s in splits:
        out.append(dy[r:r + s].double().t() @ x[r:r + s].double())
        r += s
    return torch.stack(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("fuse,delay", [(True, False), (False, True), (True, True)])
def test_module_te_weight_gradients(device, packed, fuse, delay):
    """fuse_wgrad_accumulation (main_grad +=, = on the first microbatch, the DDP dummy grad) and
    delay_wgrad_compute (backward_dw), as Transformer Engine defines them."""
    splits = [4, 0, 6]
    layer = mt.GroupedLinear(3, 8, 5, device=device, packed=packed, fuse_wgrad_accumulation=fuse,
                             delay_wgrad_compute=delay)
    params = [layer.weight] if packed else [getattr(layer, f"weight{g}") for g in range(3)]
    start = [torch.randn(p.shape, device=device) for p in params]
    for p, m in zip(params, start):
        p.main_grad = m.clone()
        p.grad_added_to_main_grad = False
    x = torch.randn(10, 8, device=device, requires_grad=True)
    dy = torch.randn(10, 5, device=device)
    for micro in range(2):
        y = layer(x, splits, is_first_microbatch=micro == 0)
        y.backward(dy)
        if delay:   # nothing reached the weights before backward_dw
            before = [None if p.grad is None else p.grad.clone() for p in params]
            mains = [p.main_grad.clone() for p in params]
            layer.backward_dw()
            if micro == 0 and not fuse:
                assert all(b is None for b in before)
            if micro == 0 and fuse:
                assert not any(torch.equal(m, p.main_grad) for m, p in zip(mains, params))
    want = reference_dw(layer, x.detach(), dy, splits)
    if not packed:
        want = list(want)
    else:
        want = [want]
    for p, m, w in zip(params, start, want):
        if fuse:   # the first microbatch overwrote main_grad, the second added to it
            torch.testing.assert_close(p.main_grad.double(), 2 * w, rtol=1e-5, atol=1e-5)
            assert p.grad_added_to_main_grad and torch.count_nonzero(p.grad) == 0
        else:      # two backwards accumulate into .grad
            torch.testing.assert_close(p.grad.double(), 2 * w, rtol=1e-5, atol=1e-5)
    assert layer.bias0.grad is not None if not packed else layer.bias.grad is not None


def test_errors_before_anything_runs():
    x, w, _, _ = inputs("cpu", torch.float32, [2, 2])
    with pytest.raises(ValueError, match="contiguous"):
        torch.ops.moex.grouped_linear_forward(x.t().contiguous().t(), w, torch.tensor([2, 2]), None, None, 0)
    with pytest.raises(ValueError, match="w is torch.bfloat16"):
        mt.grouped_linear(x, w.bfloat16(), [2, 2])
    with pytest.raises(ValueError, match="int64 or int32"):
        mt.grouped_linear(x, w, torch.tensor([2, 2], dtype=torch.int16))
    with pytest.raises(ValueError, match="groups"):
        mt.grouped_linear(x, w, [4])
    with pytest.raises(ValueError, match="unknown bias_mode 7"):
        torch.ops.moex.grouped_linear_forward(x, w, torch.tensor([2, 2]), None, None, 7)


def test_moex_failure_raises_with_last_error():
    x, w, _, _ = inputs("cpu", torch.float32, [2, 2])
    with pytest.raises(moex.MoexError, match="MOEX_ERR_BAD_SPLITS: .*splits sum past T"):
        mt.grouped_linear(x, w, torch.tensor([3, 2]))   # values on the "device": moex checks them
    with pytest.raises(ValueError, match="sum to 5, more than the 4 rows"):
        mt.grouped_linear(x, w, [3, 2])                 # a list: checked on the host first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_graph_replays_with_new_splits():
    """A captured forward + backward replays correctly after the device splits change."""
    layer = mt.GroupedLinear(4, 64, 32, device="cuda")
    x = torch.randn(40, 64, device="cuda", requires_grad=True)
    splits = torch.tensor([10, 10, 10, 10], device="cuda")
    dy = torch.randn(40, 32, device="cuda")

    def step():
        y = layer(x, splits)
        (gx,) = torch.autograd.grad(y, [x], dy)
        return y, gx

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # warm-up outside the graph (contexts, allocator)
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_g, gx_g = step()
    for new in ([40, 0, 0, 0], [1, 2, 3, 34], [0, 17, 0, 23]):
        splits.copy_(torch.tensor(new))
        graph.replay()
        y_e, gx_e = step()
        torch.testing.assert_close(y_g, y_e)
        torch.testing.assert_close(gx_g, gx_e)
