"""test_torch_moe_layer.py - moex.torch.MoELayer against a plain PyTorch MoE layer (router
logits in f32, softmax or sigmoid, top-k, renormalised or not, a loop over experts with
F.linear and the GLU written out, index_add back to the tokens), forward and the gradients of
every parameter, on the CPU and, where there is a GPU, on CUDA.

f32: 1e-4 of the largest magnitude (sums in other orders). bf16 (forward): the reference
rounds h, z and each expert's output where moex stores them; 2e-2.
"""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import moex.torch as mt  # noqa: E402
from test_torch_grouped_mlp import glu_ref  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
E, H, FF, T = 6, 40, 32, 50


def moe_ref(layer, x, score, renorm, b2_mode, kind="swiglu", layout="contiguous"):
    dt = x.dtype
    k = layer.options[0]
    logits = x.float() @ layer.router_w.float().t()
    s = torch.softmax(logits, dim=1) if score == "softmax" else torch.sigmoid(logits)
    q, ids = s.topk(k, dim=1)
    p = q / q.sum(1, keepdim=True) if renorm else q
    y = torch.zeros(x.shape[0], x.shape[1], device=x.device)
    for j in range(k):
        for e in range(E):
            rows = (ids[:, j] == e).nonzero().flatten()
            if rows.numel() == 0:
                continue
            pe = p[rows, j]
            b1 = None if layer.b1 is None else layer.b1[e].float()
            h = F.linear(x[rows].float(), layer.w1[e].float(), b1).to(dt).float()
            z = glu_ref(h, kind, layout, pe).to(dt).float()
            o = F.linear(z, layer.w2[e].float())
            if b2_mode == "add":
                o = o + layer.b2[e].float()
            elif b2_mode == "scaled":
                o = o + pe[:, None] * layer.b2[e].float()
            y = y.index_add(0, rows, o.to(dt).float())
    return y


def make(device, dtype, score, renorm, b2_mode, seed=3):
    torch.manual_seed(seed)
    layer = mt.MoELayer(E, H, FF, topk=2, score=score, renorm=renorm, bias1=True, bias2=b2_mode != "none",
                        scale_b2=b2_mode == "scaled", params_dtype=dtype, device=device,
                        init_method=lambda t: torch.nn.init.normal_(t, std=0.3))
    with torch.no_grad():
        if layer.b1 is not None:
            layer.b1.normal_()
        if layer.b2 is not None:
            layer.b2.normal_()
    x = torch.randn(T, H, device=device, dtype=dtype, requires_grad=True)
    return layer, x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("score,renorm", [("softmax", True), ("softmax", False), ("sigmoid", True)])
@pytest.mark.parametrize("b2_mode", ["none", "add", "scaled"])
def test_forward_and_gradients_f32(device, score, renorm, b2_mode):
    layer, x = make(device, torch.float32, score, renorm, b2_mode)
    y = layer(x)
    want = moe_ref(layer, x, score, renorm, b2_mode)
    m = want.abs().max()
    torch.testing.assert_close(y / m, want / m, rtol=1e-4, atol=1e-4)
    params = [x] + [p for p in (layer.router_w, layer.w1, layer.w2, layer.b1, layer.b2) if p is not None]
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, params, dy)
    ref = torch.autograd.grad(want, params, dy)
    for i, (a, e) in enumerate(zip(got, ref)):
        s = e.abs().max().clamp_min(1.0)
        torch.testing.assert_close(a / s, e / s, rtol=1e-4, atol=1e-4, msg=lambda msg, i=i: f"param {i}: {msg}")


@pytest.mark.parametrize("device", DEVICES)
def test_forward_bf16(device):
    layer, x = make(device, torch.bfloat16, "softmax", True, "scaled")
    with torch.no_grad():
        y = layer(x)
        want = moe_ref(layer, x, "softmax", True, "scaled")
    m = want.abs().max()
    torch.testing.assert_close(y.float() / m, want / m, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    layer, x = make(device, torch.float32, "softmax", True, "scaled")

    def step(x):
        return (layer(x) ** 2).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(x), [x, layer.router_w, layer.w1])
    want = torch.autograd.grad(step(x), [x, layer.router_w, layer.w1])
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


def test_errors():
    with pytest.raises(ValueError, match="topk"):
        mt.MoELayer(4, 8, 8, topk=5)
    with pytest.raises(ValueError, match="score must be"):
        mt.MoELayer(4, 8, 8, topk=2, score="relu")
    layer = mt.MoELayer(4, 8, 8, topk=2)
    with pytest.raises(ValueError, match="router_w is torch.float32"):
        layer(torch.randn(3, 8).bfloat16())


def test_close_without_ep_does_nothing():
    layer = mt.MoELayer(4, 8, 8, topk=2)
    x = torch.randn(5, 8)
    y = layer(x)
    layer.close(), layer.close()
    torch.testing.assert_close(layer(x), y, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fuse,delay", [(True, False), (False, True), (True, True)])
def test_module_te_weight_gradients(device, fuse, delay, te_weight_grads):
    """MoELayer's fuse_wgrad_accumulation and delay_wgrad_compute for the experts' weights (the
    layer as its parts) against the same layer in one moex call each way."""
    def make(**te):
        torch.manual_seed(6)
        m = mt.MoELayer(E, H, FF, topk=2, bias1=True, bias2=True, device=device,
                        init_method=lambda t: torch.nn.init.normal_(t, std=0.3), **te)
        with torch.no_grad():
            m.b1.normal_()
            m.b2.normal_()
        return m

    plain, te = make(), make(fuse_wgrad_accumulation=fuse, delay_wgrad_compute=delay)
    g = torch.Generator().manual_seed(7)
    x = {m: torch.randn(T, H, generator=g).to(device).requires_grad_(True) for m in ("plain", "te")}
    x["te"].data.copy_(x["plain"].data)
    dy = torch.randn(T, H, generator=g).to(device)

    def run(m, first):
        m(x["te" if m is te else "plain"], is_first_microbatch=first).backward(dy)

    others = {"x": (x["plain"], x["te"]), "router_w": (plain.router_w, te.router_w), "b1": (plain.b1, te.b1),
              "b2": (plain.b2, te.b2)}
    te_weight_grads(plain, te, run, ["w1", "w2"], others, tol=1e-4)


def test_backward_makes_no_zero_gradient_of_saved():
    """The forward's `saved` buffer is an output for the backward only: autograd must not fill
    a zero gradient of it (the size of the layer's activations) before every backward."""
    from torch.profiler import ProfilerActivity, profile

    layer, x = make("cpu", torch.float32, "softmax", True, "none")
    y = layer(x)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.autograd.grad(y, [x, layer.w1], torch.randn_like(y))
    big = T * layer.options[0] * H   # x's permuted rows alone are this many elements
    fills = [(e.name, e.input_shapes) for e in prof.events()
             if e.name in ("aten::zeros_like", "aten::zero_", "aten::fill_")
             and any(len(s) == 1 and s[0] >= big for s in e.input_shapes)]
    assert not fills, f"the backward zero-filled the saved buffer: {fills}"
