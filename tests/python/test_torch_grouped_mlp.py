"""test_torch_grouped_mlp.py - moex.torch.grouped_mlp and GroupedMLP against plain PyTorch (a
loop of F.linear per group, the GLU written out, autograd), on the CPU and, where there is a
GPU, on CUDA.

The reference rounds h and z to the activation dtype where moex stores them, so bf16 results
differ only by the order of f32 sums and one rounding of each output: 2e-2 of the largest
magnitude (f32: 1e-4).
"""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import moex.torch as mt  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SPLITS = [7, 0, 12, 5]
H, FF = 48, 32   # FF a multiple of 32: both GLU layouts


def glu_ref(h, kind, layout, probs, limit=7.0, alpha=1.702, offset=1.0):
    T, F2 = h.shape
    f = F2 // 2
    if layout == "contiguous":
        a, b = h[:, :f], h[:, f:]
    else:
        v = h.reshape(T, f // 32, 2, 32)
        a, b = v[:, :, 0, :].reshape(T, f), v[:, :, 1, :].reshape(T, f)
    if kind == "swiglu":
        z = a * torch.sigmoid(a) * b
    else:
        # clamps with gradient 0 at the bound itself, as moex (docs/ops.md 3.2; torch.clamp gives
        # 1 there in torch 2.11)
        a = torch.where(a < limit, a, a.detach().clamp(max=limit))
        b = torch.where((b > -limit) & (b < limit), b, b.detach().clamp(-limit, limit))
        z = a * torch.sigmoid(alpha * a) * (b + offset)
    return z if probs is None else z * probs[:, None]


def mlp_ref(x, w1, w2, splits, b1, b2, probs, scale_b2, kind, layout):
    dt = x.dtype
    ys, r = [], 0
    for g, s in enumerate(splits):
        rows = slice(r, r + s)
        h = F.linear(x[rows].float(), w1[g].float(), None if b1 is None else b1[g].float()).to(dt).float()
        p = None if probs is None else probs[rows]
        z = glu_ref(h, kind, layout, p).to(dt).float()
        y = F.linear(z, w2[g].float())
        if b2 is not None:
            y = y + (p[:, None] * b2[g].float() if scale_b2 else b2[g].float())
        ys.append(y)
        r += s
    return torch.cat(ys)


def tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["swiglu", "clamped_swiglu"])
@pytest.mark.parametrize("layout", ["contiguous", "interleaved_32"])
@pytest.mark.parametrize("b2_kind", ["none", "add", "scaled"])
def test_forward_and_backward(device, dtype, kind, layout, b2_kind):
    g = torch.Generator().manual_seed(1)
    T, G = sum(SPLITS), len(SPLITS)
    x = torch.randn(T, H, generator=g).to(device, dtype)
    w1 = (0.3 * torch.randn(G, 2 * FF, H, generator=g)).to(device, dtype)
    w2 = (0.3 * torch.randn(G, H, FF, generator=g)).to(device, dtype)
    b1 = torch.randn(G, 2 * FF, generator=g).to(device, dtype)
    b2 = torch.randn(G, H, generator=g).to(device, dtype) if b2_kind != "none" else None
    probs = torch.rand(T, generator=g).to(device)
    leaves = [t for t in (x, w1, w2, b1, b2, probs) if t is not None]
    for t in leaves:
        t.requires_grad_(True)
    scale = b2_kind == "scaled"
    y = mt.grouped_mlp(x, w1, w2, SPLITS, b1, b2, probs, scale, glu=kind, layout=layout,
                       save_z=b2_kind != "add")   # one variant recomputes z in the backward
    want = mlp_ref(x, w1, w2, SPLITS, b1, b2, probs, scale, kind, layout)
    m = want.abs().max()
    torch.testing.assert_close(y.float() / m, want / m, **tol(dtype))

    dy = torch.randn(T, H, generator=g).to(device, dtype)
    got = torch.autograd.grad(y, leaves, dy)
    ref = torch.autograd.grad(want, leaves, dy.float())
    for name, a, e in zip(["x", "w1", "w2", "b1", "b2", "probs"] if b2 is not None else ["x", "w1", "w2", "b1", "probs"],
                          got, ref):
        s = e.abs().max().clamp_min(1.0)
        torch.testing.assert_close(a.float() / s, e.float() / s, **tol(dtype), msg=lambda msg, n=name: f"d{n}: {msg}")


@pytest.mark.parametrize("device", DEVICES)
def test_module_and_compile(device):
    layer = mt.GroupedMLP(4, H, FF, bias1=True, bias2=True, scale_b2=True, device=device)
    splits = torch.tensor(SPLITS, device=device)
    x = torch.randn(sum(SPLITS), H, device=device, requires_grad=True)
    probs = torch.rand(sum(SPLITS), device=device, requires_grad=True)

    def step(x, probs):
        return (layer(x, splits, probs) ** 2).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(x, probs), [x, probs, layer.w1])
    want = torch.autograd.grad(step(x, probs), [x, probs, layer.w1])
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_consumes_h(device):
    """The backward writes dh over the saved h: a second backward through the same graph
    fails in autograd's version check instead of reading dh as h."""
    layer = mt.GroupedMLP(4, H, FF, device=device)
    x = torch.randn(sum(SPLITS), H, device=device, requires_grad=True)
    loss = layer(x, torch.tensor(SPLITS, device=device)).square().sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_opcheck():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(24, H, generator=g)
    w1 = 0.3 * torch.randn(4, 2 * FF, H, generator=g)
    w2 = 0.3 * torch.randn(4, H, FF, generator=g)
    probs = torch.rand(24, generator=g)
    args = (x, w1, None, w2, None, probs, torch.tensor(SPLITS), 0, 0, 0, 7.0, 1.702, 1.0, True)
    torch.library.opcheck(torch.ops.moex.grouped_mlp_forward.default, args)


def test_errors():
    with pytest.raises(ValueError, match="glu must be"):
        mt.GroupedMLP(2, 8, 8, glu="gelu")
    layer = mt.GroupedMLP(2, 8, 8)
    with pytest.raises(ValueError, match="w1 is torch.float32, must be one of torch.bfloat16"):
        layer(torch.randn(4, 8).bfloat16(), [2, 2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fuse,delay", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("b2_kind", ["add", "scaled"])
def test_module_te_weight_gradients(device, fuse, delay, b2_kind, te_weight_grads):
    """GroupedMLP's fuse_wgrad_accumulation and delay_wgrad_compute (the backward as separate
    operators) against the same module with moex's fused backward."""
    def make(**te):
        torch.manual_seed(4)
        m = mt.GroupedMLP(4, H, FF, bias1=True, bias2=True, scale_b2=b2_kind == "scaled", device=device,
                          init_method=lambda t: torch.nn.init.normal_(t, std=0.3), **te)
        with torch.no_grad():
            m.b1.normal_()
            m.b2.normal_()
        return m

    plain, te = make(), make(fuse_wgrad_accumulation=fuse, delay_wgrad_compute=delay)
    g = torch.Generator().manual_seed(5)
    T = sum(SPLITS) + 3   # rows past sum(splits) are not touched
    x = {m: torch.randn(T, H, generator=g).to(device).requires_grad_(True) for m in ("plain", "te")}
    x["te"].data.copy_(x["plain"].data)
    probs = {m: torch.rand(T, generator=g).to(device).requires_grad_(True) for m in ("plain", "te")}
    probs["te"].data.copy_(probs["plain"].data)
    dy = torch.randn(T, H, generator=g).to(device)
    splits = torch.tensor(SPLITS, device=device)

    def run(m, first):
        key = "te" if m is te else "plain"
        y = m(x[key], splits, probs[key], is_first_microbatch=first)
        y[:sum(SPLITS)].backward(dy[:sum(SPLITS)])

    n = sum(SPLITS)   # rows compared: the groups' (those past them are zero, test_torch_edges.py)
    others = {"x": (x["plain"], x["te"], n), "probs": (probs["plain"], probs["te"], n), "b1": (plain.b1, te.b1),
              "b2": (plain.b2, te.b2)}
    te_weight_grads(plain, te, run, ["w1", "w2"], others, tol=1e-4)
