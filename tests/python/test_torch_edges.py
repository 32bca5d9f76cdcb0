"""test_torch_edges.py - moex.torch at the edges (issue #30 items 3 and 8), on the CPU: inputs
that used to be misread or refused unclearly, each against plain PyTorch or the error it must
raise.

- Non-contiguous tensors: the functions read them as torch does (they make them contiguous);
  the raw operators (torch.ops.moex.*) refuse them with a ValueError naming the argument.
- Bad arguments raise ValueError (or moex.MoexError) naming the argument: float64 probs, biases
  and logits; unpermute with the wrong k; k = 0; negative topk / num_experts; permute without
  probs; a 0-D input to MoELayer; list splits of floats or bools; the raw grouped_linear_forward
  with a bias under bias mode NONE or probs under ADD.
- Rows past sum(splits) of every output and gradient (y, dx, dh, dprobs) are zero, so that a
  layer before them gets exact gradients.
- N-D inputs ([..., K] -> [..., N], as Transformer Engine) and int32 splits.
- Double backward (create_graph=True) through moex raises instead of a silently wrong result.
- torch.compile(fullgraph=True) of the modules with delay_wgrad_compute and of a packed
  GroupedLinear with fuse_wgrad_accumulation gives the eager gradients.
- GroupedLinear's separate weights reach moex as a pointer array built once (no stacked copy
  per call), rebuilt when a weight's storage changes.
- The clamped GLU's gradient at exactly a = limit, |b| = limit is torch.clamp's (0).
"""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import moex  # noqa: E402
import moex.torch as mt  # noqa: E402

ERRORS = (ValueError, moex.MoexError)


def linear_ref(x, w, splits, bias=None, probs=None):
    """f64 y[r] = x[r] W_g^T (+ b_g | + p_r b_g); rows past the groups 0."""
    y = x.new_zeros(x.shape[0], w.shape[1], dtype=torch.float64)
    r = 0
    for g, s in enumerate(splits):
        y[r:r + s] = x[r:r + s].double() @ w[g].double().t()
        if bias is not None:
            b = bias[g].double()
            y[r:r + s] += b if probs is None else probs[r:r + s, None].double() * b
        r += s
    return y


def glu_ref(h, probs=None, limit=None, alpha=1.702, offset=1.0):
    f = h.shape[-1] // 2
    a, b = h[..., :f], h[..., f:]
    if limit is None:
        z = F.silu(a) * b
    else:
        # clamps whose gradient is 0 at the bound itself (docs/ops.md 3.2; torch.clamp's own
        # gradient there is 1 in torch 2.11, 0 in 2.15)
        a = torch.where(a < limit, a, a.detach().clamp(max=limit))
        b = torch.where((b > -limit) & (b < limit), b, b.detach().clamp(-limit, limit))
        z = a * torch.sigmoid(alpha * a) * (b + offset)
    return z if probs is None else z * probs[..., None]


# ---- non-contiguous inputs -------------------------------------------------------------------

def test_scaled_glu_strided_probs_and_splits():
    h = torch.randn(4, 6, dtype=torch.float64).float()
    probs = torch.arange(1.0, 9.0)[::2]                   # [1, 3, 5, 7]
    splits = torch.tensor([2, 0, 2, 0])[::2]              # [2, 2]
    z = mt.scaled_glu(h, probs, splits)
    torch.testing.assert_close(z, glu_ref(h, probs.contiguous()))


def test_grouped_mlp_transposed_biases():
    torch.manual_seed(1)
    G, T, H, Fh = 3, 10, 8, 4
    x = torch.randn(T, H)
    w1, w2 = 0.3 * torch.randn(G, 2 * Fh, H), 0.3 * torch.randn(G, H, Fh)
    b1, b2 = torch.randn(2 * Fh, G).t(), torch.randn(H, G).t()   # [G, 2F], [G, H], transposed
    assert not b1.is_contiguous() and not b2.is_contiguous()
    splits = [3, 0, 7]
    y = mt.grouped_mlp(x, w1, w2, splits, b1=b1, b2=b2)
    h = linear_ref(x, w1, splits, b1)
    want = linear_ref(glu_ref(h).float(), w2, splits, b2)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)


def test_grouped_linear_strided_bias_probs_splits():
    torch.manual_seed(2)
    x, w = torch.randn(9, 5), torch.randn(2, 3, 5)
    bias = torch.randn(3, 2).t()
    probs = torch.rand(18)[::2]
    splits = torch.tensor([4, 9, 5, 9])[::2]             # [4, 5]
    y = mt.grouped_linear(x, w, splits, bias, probs)
    torch.testing.assert_close(y.double(), linear_ref(x, w, [4, 5], bias, probs), rtol=1e-5, atol=1e-5)


def test_raw_operators_refuse_non_contiguous():
    logits = torch.randn(6, 4)
    probs, ids = mt.router(logits, 2)
    with pytest.raises(ValueError, match="ids"):
        torch.ops.moex.router_backward(logits, ids.t().contiguous().t(), torch.ones(6, 2), 2, 0, 1)
    with pytest.raises(ValueError, match="logits"):
        torch.ops.moex.router_backward(torch.randn(4, 6).t(), ids, torch.ones(6, 2), 2, 0, 1)
    E, H, Fh = 3, 8, 4
    x, rw = torch.randn(5, H), torch.randn(E, H)
    w1, w2 = torch.randn(E, 2 * Fh, H), torch.randn(E, H, Fh)
    b1 = torch.randn(2 * Fh, E).t()
    with pytest.raises(ValueError, match="b1"):
        torch.ops.moex.moe_layer_forward(x, rw, w1, b1, w2, None, 2, 0, 1, 0, 0, 0, 7.0, 1.702, 1.0)
    h = torch.randn(4, 6)
    with pytest.raises(ValueError, match="probs"):
        torch.ops.moex.scaled_glu_forward(h, torch.arange(1.0, 9.0)[::2], None, 0, 0, 7.0, 1.702, 1.0)
    with pytest.raises(ValueError, match="splits"):
        torch.ops.moex.scaled_glu_forward(h, None, torch.tensor([2, 0, 2, 0])[::2], 0, 0, 7.0, 1.702, 1.0)


# ---- unclear or missing errors ---------------------------------------------------------------

def test_float64_arguments():
    x, w = torch.randn(4, 3), torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match="bias"):
        mt.grouped_linear(x, w, [2, 2], bias=torch.randn(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="probs"):
        mt.grouped_linear(x, w, [2, 2], bias=torch.randn(2, 5), probs=torch.rand(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="logits"):
        mt.router(torch.randn(4, 3, dtype=torch.float64), 2)
    with pytest.raises(ValueError, match="probs"):
        mt.scaled_glu(torch.randn(4, 6), torch.rand(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="b1"):
        mt.grouped_mlp(x, torch.randn(2, 4, 3), torch.randn(2, 3, 2), [2, 2], b1=torch.randn(2, 4, dtype=torch.float64))


def test_routing_argument_errors():
    x = torch.randn(4, 3)
    logits = torch.randn(4, 5)
    probs, ids = mt.router(logits, 2)
    xp, probs_p, splits, row_map = mt.permute(x, ids, probs, 5)
    with pytest.raises(ValueError, match="k"):
        mt.unpermute(xp, row_map, 8)          # divides the 8 rows: used to sum them all
    with pytest.raises(ValueError, match="k"):
        mt.unpermute(xp, row_map, 3)
    with pytest.raises(ValueError, match="k"):
        mt.unpermute(xp, row_map, 0)          # used to raise ZeroDivisionError
    with pytest.raises(ValueError, match="topk"):
        mt.router(logits, -1)
    with pytest.raises(ValueError, match="topk"):
        mt.router(logits, 0)
    with pytest.raises(ValueError, match="topk"):
        mt.router(logits, 6)
    with pytest.raises(ValueError, match="num_experts"):
        mt.permute(x, ids, probs, -2)
    with pytest.raises(ValueError, match="probs"):
        mt.permute(x, ids, None, 5)
    with pytest.raises(ValueError, match="k"):
        torch.ops.moex.permute_backward(row_map.reshape(-1), xp, probs_p, 0)
    y = mt.unpermute(xp, row_map, 2)          # the right k still works
    torch.testing.assert_close(y, 2 * x)


def test_raw_splits_to_offsets_dtype_code():
    with pytest.raises(ValueError, match="dtype_code"):
        torch.ops.moex.splits_to_offsets(torch.tensor([1, 2]), 1, True, 99)   # used to raise KeyError


def test_copied_module_gets_its_own_weight_gradients():
    import copy
    a = mt.GroupedLinear(2, 4, 3, delay_wgrad_compute=True)
    b = copy.deepcopy(a)
    b(torch.randn(5, 4), [2, 3]).sum().backward()
    b.backward_dw()
    assert b.weight0.grad is not None and a.weight0.grad is None and not a._wgrad_queue


def test_module_sizes():
    for make in (lambda: mt.MoELayer(-2, 8, 4, topk=1), lambda: mt.MoELayer(4, 8, 0, topk=1),
                 lambda: mt.MoELayer(4, 8, 4, topk=-1), lambda: mt.GroupedMLP(-1, 8, 4),
                 lambda: mt.GroupedMLP(2, 8.5, 4), lambda: mt.GroupedLinear(0, 4, 4)):
        with pytest.raises(ValueError):   # torch's RuntimeError from torch.empty before
            make()
    with pytest.raises(ValueError, match="b must be"):
        mt.gmm(torch.randn(3, 4), [[1.0]], [3])


def test_moe_layer_0d_input():
    layer = mt.MoELayer(4, 8, 4, topk=2)
    with pytest.raises(ValueError, match="x"):
        layer(torch.tensor(1.0))
    with pytest.raises(ValueError, match="x"):
        layer(torch.randn(3, 7))


@pytest.mark.parametrize("splits", [[2.7, 3.2], [True, True], [3, -1], ["2", 2]])
def test_bad_list_splits(splits):
    with pytest.raises(ValueError, match="splits"):
        mt.grouped_linear(torch.randn(5, 3), torch.randn(2, 4, 3), splits)


def test_list_splits_past_the_rows():
    with pytest.raises(ValueError, match="splits"):
        mt.grouped_linear(torch.randn(5, 3), torch.randn(2, 4, 3), [3, 3])


def test_raw_forward_refuses_unused_bias_and_probs():
    x, w, b = torch.randn(4, 3), torch.randn(2, 5, 3), torch.randn(2, 5)
    s = torch.tensor([2, 2])
    with pytest.raises(ValueError, match="bias"):
        torch.ops.moex.grouped_linear_forward(x, w, s, b, None, mt.BIAS_NONE)
    with pytest.raises(ValueError, match="probs"):
        torch.ops.moex.grouped_linear_forward(x, w, s, b, torch.rand(4), mt.BIAS_ADD)


# ---- rows past sum(splits) are zero ----------------------------------------------------------

def test_tail_rows_zero_in_outputs_and_gradients():
    torch.manual_seed(3)
    T, K, N, G = 12, 6, 5, 2
    splits = [3, 4]                                        # 5 tail rows
    x = torch.full((T, K), float("nan")).requires_grad_()  # an allocator's garbage in the tail
    with torch.no_grad():
        x[:7] = torch.randn(7, K)
    w, b = torch.randn(G, N, K, requires_grad=True), torch.randn(G, N, requires_grad=True)
    p = torch.rand(T, requires_grad=True)
    y = mt.grouped_linear(x, w, splits, b, p)
    assert torch.count_nonzero(y[7:]) == 0
    y.backward(torch.randn(T, N))
    assert torch.count_nonzero(x.grad[7:]) == 0 and torch.count_nonzero(p.grad[7:]) == 0

    # a layer before moex gets exact gradients: the tail's dx does not reach it
    lin = torch.nn.Linear(K, K)
    inp = torch.randn(T, K)
    out = mt.grouped_linear(lin(inp), w.detach(), splits)
    out[:7].sum().backward()
    assert torch.isfinite(lin.weight.grad).all()
    ref_in = inp[:7].clone()
    lin2 = torch.nn.Linear(K, K)
    lin2.load_state_dict(lin.state_dict())
    linear_ref(lin2(ref_in), w.detach(), splits).sum().backward()
    torch.testing.assert_close(lin.weight.grad, lin2.weight.grad, rtol=1e-4, atol=1e-4)


def test_tail_rows_zero_mlp_and_glu():
    torch.manual_seed(4)
    T, H, Fh, G = 10, 6, 4, 2
    splits = [2, 3]
    x = torch.randn(T, H, requires_grad=True)
    probs = torch.rand(T, requires_grad=True)
    w1, w2 = torch.randn(G, 2 * Fh, H), torch.randn(G, H, Fh)
    y = mt.grouped_mlp(x, w1, w2, splits, probs=probs)
    assert torch.count_nonzero(y[5:]) == 0
    y.backward(torch.randn(T, H))
    assert torch.count_nonzero(x.grad[5:]) == 0 and torch.count_nonzero(probs.grad[5:]) == 0
    h = torch.randn(T, 2 * Fh, requires_grad=True)
    z = mt.scaled_glu(h, probs.detach(), splits)
    assert torch.count_nonzero(z[5:]) == 0
    z.backward(torch.randn(T, Fh))
    assert torch.count_nonzero(h.grad[5:]) == 0


def test_tail_rows_zero_module_paths():
    torch.manual_seed(5)
    x = torch.randn(9, 4, requires_grad=True)
    for kw in [dict(), dict(packed=True), dict(delay_wgrad_compute=True)]:
        layer = mt.GroupedLinear(2, 4, 3, **kw)
        y = layer(x, [2, 3])
        assert torch.count_nonzero(y[5:]) == 0, kw
        x.grad = None
        y.backward(torch.randn(9, 3))
        assert torch.count_nonzero(x.grad[5:]) == 0, kw
        layer.backward_dw()


# ---- N-D inputs and int32 splits -------------------------------------------------------------

def test_nd_inputs():
    torch.manual_seed(6)
    x = torch.randn(3, 4, 6, requires_grad=True)           # [seq, batch, hidden], 12 rows
    w, b = torch.randn(2, 5, 6), torch.randn(2, 5)
    p = torch.rand(3, 4)
    y = mt.grouped_linear(x, w, [5, 7], b, p)
    assert y.shape == (3, 4, 5)
    want = linear_ref(x.reshape(12, 6), w, [5, 7], b, p.reshape(12)).reshape(3, 4, 5)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    y.sum().backward()
    assert x.grad.shape == x.shape
    layer = mt.GroupedLinear(2, 6, 5)
    assert layer(x, [5, 7]).shape == (3, 4, 5)
    assert mt.gmm(x, torch.randn(2, 6, 5), [5, 7]).shape == (3, 4, 5)
    mlp = mt.GroupedMLP(2, 6, 4)
    assert mlp(x, [5, 7], probs=p).shape == (3, 4, 6)
    assert mt.grouped_mlp(x, torch.randn(2, 8, 6), torch.randn(2, 6, 4), [5, 7]).shape == (3, 4, 6)
    h = torch.randn(3, 4, 8)
    torch.testing.assert_close(mt.scaled_glu(h, p), glu_ref(h, p))


def test_int32_splits():
    torch.manual_seed(7)
    x, w = torch.randn(9, 4), torch.randn(3, 2, 4)
    s64 = torch.tensor([2, 0, 5])
    y32 = mt.grouped_linear(x, w, s64.to(torch.int32))
    torch.testing.assert_close(y32, mt.grouped_linear(x, w, s64))
    assert torch.equal(mt.gmm(x, w.transpose(1, 2), s64.int()), y32)
    layer = mt.GroupedLinear(3, 4, 2)
    torch.testing.assert_close(layer(x, s64.int()), layer(x, s64))
    mlp = mt.GroupedMLP(3, 4, 2)
    torch.testing.assert_close(mlp(x, s64.int()), mlp(x, s64))
    with pytest.raises(ValueError, match="splits"):
        mt.grouped_linear(x, w, s64.to(torch.int16))


# ---- double backward ---------------------------------------------------------------------------

def test_double_backward_raises():
    torch.manual_seed(8)
    x = torch.randn(6, 4, requires_grad=True)
    w = torch.randn(2, 3, 4, requires_grad=True)
    y = mt.grouped_linear(x, w, [2, 4])
    (dx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="twice|double"):
        dx.pow(2).sum().backward()
    h = torch.randn(6, 8, requires_grad=True)
    (dh,) = torch.autograd.grad(mt.scaled_glu(h).sum(), h, create_graph=True)
    with pytest.raises(RuntimeError, match="twice|double"):
        dh.sum().backward()
    layer = mt.GroupedLinear(2, 4, 3, delay_wgrad_compute=True)
    (dx,) = torch.autograd.grad(layer(x, [2, 4]).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="twice|double"):
        dx.sum().backward()


# ---- torch.compile with the weight-gradient options ----------------------------------------------

def _compile_case(make, run, weights):
    """The compiled step's gradients (into .grad, main_grad or via backward_dw) equal eager's."""
    torch.manual_seed(9)
    eager, compiled_mod = make(), make()
    compiled_mod.load_state_dict(eager.state_dict())
    for m in (eager, compiled_mod):
        for n in weights:
            p = getattr(m, n)
            p.main_grad = torch.zeros(p.shape)
    x = torch.randn(10, 6)
    step = torch.compile(lambda m, x: run(m, x).square().sum(), fullgraph=True, backend="aot_eager")
    for m, f in ((eager, lambda m, x: run(m, x).square().sum()), (compiled_mod, step)):
        for _ in range(2):
            f(m, x).backward()
            if m.delay_wgrad_compute:
                m.backward_dw()
    for n in weights:
        a, b = getattr(eager, n), getattr(compiled_mod, n)
        got, want = (b.main_grad, a.main_grad) if eager.fuse_wgrad_accumulation else (b.grad, a.grad)
        assert want is not None and torch.count_nonzero(want) > 0, n
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [dict(delay_wgrad_compute=True), dict(packed=True, delay_wgrad_compute=True),
                                dict(packed=True, fuse_wgrad_accumulation=True),
                                dict(fuse_wgrad_accumulation=True, delay_wgrad_compute=True)])
def test_compile_grouped_linear_wgrad_options(kw):
    names = ["weight"] if kw.get("packed") else ["weight0", "weight1"]
    _compile_case(lambda: mt.GroupedLinear(2, 6, 5, **kw), lambda m, x: m(x, [4, 6]), names)


def test_compile_grouped_mlp_and_moe_delay():
    _compile_case(lambda: mt.GroupedMLP(2, 6, 4, delay_wgrad_compute=True), lambda m, x: m(x, [4, 6]), ["w1", "w2"])
    _compile_case(lambda: mt.MoELayer(3, 6, 4, topk=2, delay_wgrad_compute=True), lambda m, x: m(x), ["w1", "w2"])


# ---- GroupedLinear's separate weights -------------------------------------------------------------

def test_separate_weights_without_stacking(monkeypatch):
    torch.manual_seed(10)
    layer = mt.GroupedLinear(3, 4, 5)
    packed = torch.stack([getattr(layer, f"weight{g}").detach() for g in range(3)])
    bias = torch.stack([getattr(layer, f"bias{g}").detach() for g in range(3)])
    x = torch.randn(8, 4, requires_grad=True)
    stacked = []
    real_stack = torch.stack

    def counting_stack(ts, *a, **k):
        if any(t is getattr(layer, f"weight{g}") for t in ts for g in range(3)):
            stacked.append(1)
        return real_stack(ts, *a, **k)

    monkeypatch.setattr(torch, "stack", counting_stack)
    y = layer(x, [3, 0, 5])
    monkeypatch.setattr(torch, "stack", real_stack)
    assert not stacked, "the weights were stacked into a copy"
    torch.testing.assert_close(y.double(), linear_ref(x, packed, [3, 0, 5], bias), rtol=1e-5, atol=1e-5)
    y.backward(torch.ones_like(y))
    want_w0 = torch.ones(3, 5).t() @ x[:3].detach()
    torch.testing.assert_close(layer.weight0.grad, want_w0, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(layer.weight1.grad) == 0
    # a weight's storage replaced: the next call reads the new one
    with torch.no_grad():
        layer.weight0.data = torch.zeros(5, 4)
    y2 = layer(x, [3, 0, 5])
    torch.testing.assert_close(y2[:3], bias[0].expand(3, 5))


# ---- the clamped GLU at the clamp's bounds -------------------------------------------------------

def test_clamped_glu_gradient_at_the_bounds():
    h = torch.tensor([[7.0, 7.0, 6.5, 8.0, 7.0, -7.0, 7.0, 0.0]], requires_grad=True)
    (got,) = torch.autograd.grad(mt.scaled_glu(h, glu="clamped_swiglu").sum(), h)
    h2 = h.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(glu_ref(h2, limit=7.0).sum(), h2)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_sigmoid_renorm_tiny_logits():
    probs, ids = mt.router(torch.tensor([[-100.0]]), 1, "sigmoid", True)
    assert probs.item() == 1.0
    logits = torch.tensor([[-95.0, -97.0, -120.0]], requires_grad=True)
    probs, _ = mt.router(logits, 2, "sigmoid", True)
    assert torch.isfinite(probs).all()
    torch.testing.assert_close(probs, torch.sigmoid(torch.tensor([[2.0, -2.0]])))
    (g,) = torch.autograd.grad(probs[:, 0].sum(), logits)
    assert torch.isfinite(g).all()
