"""test_torch_property.py - property-based tests of moex.torch on the CPU (issue #30 item 7).

Random cases (hypothesis when it imports, derandomized so CI runs the same cases every time;
else a seeded random driver drawing the same kinds of cases), each checked against plain
PyTorch in float64:
- grouped_linear / gmm / GroupedLinear: shapes, dtypes (f32, bf16, f16), splits with empty
  groups and rows past their sum (T = 0 included), given as a list, an int64 or an int32 tensor,
  optional bias (the activation dtype or f32) and probs, N-D inputs, non-contiguous weights and
  biases; forward and every gradient, the rows past sum(splits) of y, dx and dprobs exactly 0;
- grouped_mlp (both GLUs, both layouts, optional biases, probs, scaled b2) and scaled_glu (h on
  the clamp's bounds included), forward and backward;
- bad inputs (wrong dtypes, negative or oversized splits, a mismatched G, wrong shapes,
  non-contiguous and overlapping tensors to the raw operators, bad routing arguments) raise
  ValueError or moex.MoexError: never another exception, a crash, a hang or a result.
Tolerances: f32 1e-4 relative; bf16 / f16 a few roundings of the largest magnitude.
"""
import random

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import moex  # noqa: E402
import moex.torch as mt  # noqa: E402

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:   # the seeded driver below runs the same cases
    given = None

ERRORS = (ValueError, moex.MoexError)
SPLIT_SIZES = [0, 0, 1, 2, 3, 5, 8]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class _RandomDraw:
    """The draws of a case from a seeded random.Random (without hypothesis)."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def int(self, lo, hi):
        return self.rng.randint(lo, hi)

    def pick(self, seq):
        return seq[self.rng.randrange(len(seq))]


class _HypothesisDraw:
    """The same draws through hypothesis's data strategy (so failures shrink)."""

    def __init__(self, data):
        self.data = data

    def int(self, lo, hi):
        return self.data.draw(st.integers(lo, hi))

    def pick(self, seq):
        return self.data.draw(st.sampled_from(seq))


def property_test(n):
    """The test running case(draw) on n examples: hypothesis's, or seeds 0..n-1."""

    def deco(case):
        if given is not None:
            @settings(max_examples=n, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(st.data())
            def test(data):
                case(_HypothesisDraw(data))
        else:
            def test():
                for seed in range(n):
                    case(_RandomDraw(seed))
        test.__name__, test.__doc__ = case.__name__, case.__doc__
        return test

    return deco


def randn(draw, *shape, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(draw.int(0, 2 ** 31))
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def lead_shape(draw, T):
    """The leading dimensions of an input of T rows: [T], [a, T/a] or [1, T, 1]."""
    divisors = [a for a in (2, 3) if T % a == 0 and T > 0]
    kind = draw.pick(["flat", "two", "three"])
    if kind == "two" and divisors:
        a = draw.pick(divisors)
        return (a, T // a)
    return (1, T, 1) if kind == "three" else (T,)


def splits_arg(draw, splits):
    return draw.pick([lambda: list(splits), lambda: torch.tensor(splits, dtype=torch.int64),
                      lambda: torch.tensor(splits, dtype=torch.int32)])()


def strided(draw, t):
    """t, or the same values in a non-contiguous layout (its last two dimensions swapped in memory)."""
    if t.dim() < 2 or draw.pick([False, True]) is False:
        return t
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def assert_close(got, want, dtype, what, scale=1.0):
    """got within a few roundings of dtype of want's largest magnitude (f32: 1e-4 relative)."""
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 4e-3}[dtype] * scale
    m = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    err = (got.double() - want).abs().max().item() if want.numel() else 0.0
    assert err <= tol * m, f"{what}: max error {err:.3g} > {tol * m:.3g}"


def linear_ref(x, w, splits, b=None, p=None):
    """f64 y[r] = x[r] W_g^T (+ b_g | + p_r b_g) on x's rows [T, K]; rows past the groups 0."""
    y = x.new_zeros(x.shape[0], w.shape[1])
    r = 0
    for g, s in enumerate(splits):
        y[r:r + s] = x[r:r + s] @ w[g].t()
        if b is not None:
            y[r:r + s] += b[g] if p is None else p[r:r + s, None] * b[g]
        r += s
    return y


def glu_ref(h, kind, layout, p=None, limit=7.0, alpha=1.702, offset=1.0):
    f = h.shape[-1] // 2
    if layout == "contiguous":
        a, b = h[..., :f], h[..., f:]
    else:
        v = h.reshape(*h.shape[:-1], f // 32, 2, 32)
        a, b = v[..., 0, :].reshape(*h.shape[:-1], f), v[..., 1, :].reshape(*h.shape[:-1], f)
    if kind == "swiglu":
        z = F.silu(a) * b
    else:
        # clamps with gradient 0 at the bound itself, as moex (docs/ops.md 3.2; torch.clamp gives
        # 1 there in torch 2.11)
        a = torch.where(a < limit, a, a.detach().clamp(max=limit))
        b = torch.where((b > -limit) & (b < limit), b, b.detach().clamp(-limit, limit))
        z = a * torch.sigmoid(alpha * a) * (b + offset)
    return z if p is None else z * p[..., None]


# ---- valid inputs against the reference ---------------------------------------------------------

@property_test(400)
def test_grouped_linear(draw):
    """grouped_linear (and gmm, GroupedLinear) forward and backward against f64 PyTorch."""
    dtype = draw.pick(DTYPES)
    G, K, N = draw.int(1, 4), draw.int(1, 9), draw.int(1, 9)
    splits = [draw.pick(SPLIT_SIZES) for _ in range(G)]
    S = sum(splits)
    T = S + draw.int(0, 3)
    lead = lead_shape(draw, T)
    x = randn(draw, *lead, K, dtype=dtype).requires_grad_()
    w = randn(draw, G, N, K, dtype=dtype, scale=0.5).requires_grad_()
    bias_kind = draw.pick(["none", "add", "scaled"])
    b = p = None
    if bias_kind != "none":
        b = randn(draw, G, N, dtype=draw.pick([dtype, torch.float32])).requires_grad_()
    if bias_kind == "scaled":
        p = torch.rand(draw.pick([lead, (T,)]), generator=torch.Generator().manual_seed(draw.int(0, 99))).requires_grad_()
    api = draw.pick(["function", "gmm", "module"])
    s_arg = splits_arg(draw, splits)
    if api == "module":
        layer = mt.GroupedLinear(G, K, N, bias=b is not None, params_dtype=dtype, packed=draw.pick([False, True]))
        with torch.no_grad():
            for g in range(G):
                (layer.weight[g] if layer.packed else getattr(layer, f"weight{g}")).copy_(w[g])
                if b is not None:
                    (layer.bias[g] if layer.packed else getattr(layer, f"bias{g}")).copy_(b[g].to(dtype))
        b = None if b is None else b.detach().to(dtype).requires_grad_()   # the layer's bias dtype
        y = layer(x, s_arg, probs=p)
        weights = [layer.weight] if layer.packed else [getattr(layer, f"weight{g}") for g in range(G)]
        pairs = [("x", x), ("p", p)]
    elif api == "gmm":
        b = p = None
        y = mt.gmm(x, strided(draw, w.transpose(1, 2)), s_arg)
        pairs = [("x", x), ("w", w)]
    else:
        y = mt.grouped_linear(x, strided(draw, w), s_arg, None if b is None else strided(draw, b), p)
        pairs = [("x", x), ("w", w), ("b", b), ("p", p)]
    pairs = [(n, t) for n, t in pairs if t is not None]
    assert y.shape == (*lead, N) and y.dtype == dtype
    xd = x.detach().double().reshape(T, K).requires_grad_()
    refs = {"x": xd, "w": w.detach().double().requires_grad_()}
    if b is not None:
        refs["b"] = b.detach().double().requires_grad_()
    if p is not None:
        refs["p"] = p.detach().double().reshape(T).requires_grad_()
    y_ref = linear_ref(xd, refs["w"], splits, refs.get("b"), refs.get("p"))
    assert_close(y.reshape(T, N), y_ref, dtype, "y", scale=2)
    assert torch.count_nonzero(y.reshape(T, N)[S:]) == 0, "y: rows past sum(splits)"
    dy = randn(draw, *y.shape, dtype=dtype)
    if api == "module":   # the layer's weights: dW in .grad
        pairs.append(("w", None))
    tensors = [t if t is not None else weights for _, t in pairs]
    flat = [t for ts in tensors for t in (ts if isinstance(ts, list) else [ts])]
    got = list(torch.autograd.grad(y, flat, dy, allow_unused=True))
    want = torch.autograd.grad(y_ref, [refs[n] for n, _ in pairs], dy.double().reshape(T, N))
    for (n, t), ref in zip(pairs, want):
        if t is None:   # the module's weights, one [G, N, K] or G [N, K]
            g = torch.stack([gw if gw is not None else torch.zeros_like(w[0]) for gw in got[:len(weights)]]) \
                if not layer.packed else got[0]
            got = got[len(weights):]
        else:
            g, got = got[0], got[1:]
        assert_close(g.reshape(ref.shape), ref, dtype, f"d{n} ({api})", scale=4)
        if n in ("x", "p"):
            assert torch.count_nonzero(g.reshape(T, ref.numel() // max(T, 1) if T else 1)[S:]) == 0, \
                f"d{n}: rows past sum(splits)"


@property_test(200)
def test_grouped_mlp(draw):
    """grouped_mlp forward and backward against f64 PyTorch (h and z rounded where moex stores them)."""
    dtype = draw.pick([torch.float32, torch.bfloat16])
    G, H = draw.int(1, 3), draw.int(1, 8)
    Fh = draw.pick([1, 3, 32])
    layout = draw.pick(["contiguous", "interleaved_32"]) if Fh % 32 == 0 else "contiguous"
    kind = draw.pick(["swiglu", "clamped_swiglu"])
    splits = [draw.pick(SPLIT_SIZES) for _ in range(G)]
    S = sum(splits)
    T = S + draw.int(0, 2)
    lead = lead_shape(draw, T)
    x = randn(draw, *lead, H, dtype=dtype).requires_grad_()
    w1 = randn(draw, G, 2 * Fh, H, dtype=dtype, scale=0.5).requires_grad_()
    w2 = randn(draw, G, H, Fh, dtype=dtype, scale=0.5).requires_grad_()
    b1 = randn(draw, G, 2 * Fh, dtype=dtype).requires_grad_() if draw.pick([False, True]) else None
    b2 = randn(draw, G, H, dtype=dtype).requires_grad_() if draw.pick([False, True]) else None
    p = torch.rand(T).requires_grad_() if draw.pick([False, True]) else None
    scale_b2 = b2 is not None and p is not None and draw.pick([False, True])
    y = mt.grouped_mlp(x, w1, w2, splits_arg(draw, splits), b1=b1, b2=b2, probs=p, scale_b2=scale_b2, glu=kind,
                       layout=layout, save_z=draw.pick([False, True]))
    assert y.shape == x.shape
    inputs = [t for t in (x, w1, w2, b1, b2, p) if t is not None]
    refs = [t.detach().double().requires_grad_() for t in inputs]
    r = dict(zip([n for n, t in zip("x w1 w2 b1 b2 p".split(), (x, w1, w2, b1, b2, p)) if t is not None], refs))
    rnd = (lambda t: t.to(dtype).double()) if dtype != torch.float32 else (lambda t: t)
    xr = r["x"].reshape(T, H)
    h = rnd(linear_ref(xr, r["w1"], splits, r.get("b1")))
    z = rnd(glu_ref(h, kind, layout, r.get("p")))
    y_ref = linear_ref(z, r["w2"], splits, r.get("b2"), r.get("p") if scale_b2 else None)
    assert_close(y.reshape(T, H), y_ref, dtype, "y", scale=2)
    assert torch.count_nonzero(y.reshape(T, H)[S:]) == 0, "y: rows past sum(splits)"
    dy = randn(draw, *y.shape, dtype=dtype)
    got = torch.autograd.grad(y, inputs, dy)
    want = torch.autograd.grad(y_ref, refs, dy.double().reshape(T, H))
    for n, gt, wt in zip(r, got, want):
        assert_close(gt.reshape(wt.shape), wt, dtype, f"d{n} ({kind}, {layout})", scale=6)
    assert torch.count_nonzero(got[0].reshape(T, H)[S:]) == 0, "dx: rows past sum(splits)"


@property_test(200)
def test_scaled_glu(draw):
    """scaled_glu forward and backward against f64 PyTorch, h on the clamp's bounds included."""
    dtype = draw.pick(DTYPES)
    kind = draw.pick(["swiglu", "clamped_swiglu"])
    Fh = draw.pick([1, 2, 5, 32])
    layout = draw.pick(["contiguous", "interleaved_32"]) if Fh % 32 == 0 else "contiguous"
    T = draw.int(0, 9)
    lead = lead_shape(draw, T)
    h = randn(draw, *lead, 2 * Fh, dtype=torch.float64, scale=4.0)
    on_bounds = torch.tensor([7.0, -7.0, 6.5, 8.0], dtype=torch.float64)
    mask = torch.rand(h.shape, generator=torch.Generator().manual_seed(draw.int(0, 99))) < 0.2
    h = torch.where(mask, on_bounds[torch.arange(h.numel()).reshape(h.shape) % 4], h).to(dtype).requires_grad_()
    p = torch.rand(lead).requires_grad_() if draw.pick([False, True]) else None
    splits = None
    if draw.pick([False, True]) and T > 0:
        splits = [draw.int(0, T)]
        splits.append(draw.int(0, T - splits[0]))
    z = mt.scaled_glu(h, p, None if splits is None else splits_arg(draw, splits), glu=kind, layout=layout)
    S = T if splits is None else sum(splits)
    hd = h.detach().double().requires_grad_()
    pd = None if p is None else p.detach().double().requires_grad_()
    z_ref = glu_ref(hd, kind, layout, pd).reshape(T, Fh) * (torch.arange(T) < S)[:, None]
    assert_close(z.reshape(T, Fh), z_ref, dtype, "z", scale=2)
    dz = randn(draw, *z.shape, dtype=dtype)
    inputs, refs = [h] + ([p] if p is not None else []), [hd] + ([pd] if pd is not None else [])
    got = torch.autograd.grad(z, inputs, dz)
    want = torch.autograd.grad(z_ref, refs, dz.double().reshape(T, Fh))
    for n, gt, wt in zip(["h", "p"], got, want):
        assert_close(gt, wt, dtype, f"d{n} ({kind})", scale=4)


# ---- bad inputs -----------------------------------------------------------------------------

def _bad_linear(draw):
    """A grouped_linear call with one thing wrong."""
    G, K, N, T = draw.int(1, 3), draw.int(1, 5), draw.int(1, 5), draw.int(1, 6)   # T = 0: test_zero_rows
    x, w = randn(draw, T, K), randn(draw, G, N, K)
    b, p = randn(draw, G, N), torch.rand(T)
    splits = [T] + [0] * (G - 1)
    what = draw.pick(["x f64", "w f64", "w int", "w dtype", "bias f64", "probs f64", "probs f16", "splits float",
                      "splits bool", "splits negative", "splits tensor negative", "splits past T",
                      "splits tensor past T", "splits int16", "splits 2-D", "G mismatch", "w K", "bias shape",
                      "probs length", "x 0-D", "raw x strided", "raw w expanded", "raw splits strided",
                      "raw bias mode", "raw probs mode", "probs without bias"])
    call = lambda: mt.grouped_linear(x, w, splits, b, p)   # noqa: E731
    raw = lambda x=x, w=w, s=torch.tensor(splits), b=None, p=None, mode=0: (   # noqa: E731
        torch.ops.moex.grouped_linear_forward(x, w, s, b, p, mode))
    cases = {
        "x f64": lambda: mt.grouped_linear(x.double(), w, splits),
        "w f64": lambda: mt.grouped_linear(x, w.double(), splits),
        "w int": lambda: mt.grouped_linear(x, w.int(), splits),
        "w dtype": lambda: mt.grouped_linear(x, w.bfloat16(), splits),
        "bias f64": lambda: mt.grouped_linear(x, w, splits, b.double()),
        "probs f64": lambda: mt.grouped_linear(x, w, splits, b, p.double()),
        "probs f16": lambda: mt.grouped_linear(x, w, splits, b, p.half()),
        "splits float": lambda: mt.grouped_linear(x, w, [float(s) + 0.5 for s in splits]),
        "splits bool": lambda: mt.grouped_linear(x, w, [True] * G),
        "splits negative": lambda: mt.grouped_linear(x, w, [-1] + [T + 1] + [0] * (G - 2) if G > 1 else [-1]),
        "splits tensor negative": lambda: mt.grouped_linear(x, w, torch.tensor([-1] + [0] * (G - 1))),
        "splits past T": lambda: mt.grouped_linear(x, w, [T + 1] + [0] * (G - 1)),
        "splits tensor past T": lambda: mt.grouped_linear(x, w, torch.tensor([T + 1] + [0] * (G - 1))),
        "splits int16": lambda: mt.grouped_linear(x, w, torch.tensor(splits, dtype=torch.int16)),
        "splits 2-D": lambda: mt.grouped_linear(x, w, torch.tensor([splits])),
        "G mismatch": lambda: mt.grouped_linear(x, w, splits + [0]),
        "w K": lambda: mt.grouped_linear(x, randn(draw, G, N, K + 1), splits),
        "bias shape": lambda: mt.grouped_linear(x, w, splits, randn(draw, G, N + 1)),
        "probs length": lambda: mt.grouped_linear(x, w, splits, b, torch.rand(T + 1)),
        "x 0-D": lambda: mt.grouped_linear(torch.tensor(1.0), w, splits),
        "raw x strided": lambda: raw(x=randn(draw, max(T, 2), K + 1)[:, :K]),   # rows of K + 1 apart
        "raw w expanded": lambda: raw(w=w[:1].expand(G, N, K) if G > 1 else w.expand(2, N, K)),
        "raw splits strided": lambda: raw(s=torch.tensor(splits + splits)[::2] if G > 1 else torch.tensor([T, 0])[::2][:0]),
        "raw bias mode": lambda: raw(b=b, mode=0),
        "raw probs mode": lambda: raw(b=b, p=p, mode=1),
        "probs without bias": lambda: mt.grouped_linear(x, w, splits, None, p),
    }
    return what, cases[what] if what in cases else call


def _bad_other(draw):
    """An MLP, GLU, routing or module call with one thing wrong."""
    T, E, H, k = draw.int(1, 6), draw.int(2, 4), draw.int(1, 4), 2
    x, logits = randn(draw, T, H), randn(draw, T, E)
    probs, ids = mt.router(logits, k)
    xp, pp, sp, row_map = mt.permute(x, ids, probs, E)
    w1, w2 = randn(draw, E, 4, H), randn(draw, E, H, 2)
    what = draw.pick(["mlp w2 shape", "mlp b1 f64", "mlp G", "mlp scale_b2", "glu odd", "glu probs f64",
                      "glu splits past T", "router topk 0", "router topk > E", "router f16", "router f64",
                      "permute ids out of range", "permute E", "permute probs shape", "unpermute k",
                      "unpermute k flat", "moe 0-D", "moe H", "module splits", "module probs no bias",
                      "raw router_backward ids strided", "raw permute_backward k"])
    cases = {
        "mlp w2 shape": lambda: mt.grouped_mlp(x, w1, randn(draw, E, H, 3), [T] + [0] * (E - 1)),
        "mlp b1 f64": lambda: mt.grouped_mlp(x, w1, w2, [T] + [0] * (E - 1), b1=randn(draw, E, 4).double()),
        "mlp G": lambda: mt.grouped_mlp(x, w1, w2, [T]),
        "mlp scale_b2": lambda: mt.grouped_mlp(x, w1, w2, [T] + [0] * (E - 1), b2=randn(draw, E, H), scale_b2=True),
        "glu odd": lambda: mt.scaled_glu(randn(draw, T, 5)),
        "glu probs f64": lambda: mt.scaled_glu(randn(draw, T, 4), torch.rand(T, dtype=torch.float64)),
        "glu splits past T": lambda: mt.scaled_glu(randn(draw, T, 4), None, [T + 1]),
        "router topk 0": lambda: mt.router(logits, 0),
        "router topk > E": lambda: mt.router(logits, E + 1),
        "router f16": lambda: mt.router(logits.half(), 1),
        "router f64": lambda: mt.router(logits.double(), 1),
        "permute ids out of range": lambda: mt.permute(x, ids + E, probs, E),
        "permute E": lambda: mt.permute(x, ids, probs, 0),
        "permute probs shape": lambda: mt.permute(x, ids, probs[:, :1].contiguous(), E),
        "unpermute k": lambda: mt.unpermute(xp, row_map, k + 1),
        "unpermute k flat": lambda: mt.unpermute(xp, row_map.reshape(-1), 0),
        "moe 0-D": lambda: mt.MoELayer(E, H, 2, topk=1)(torch.tensor(2.0)),
        "moe H": lambda: mt.MoELayer(E, H, 2, topk=1)(randn(draw, T, H + 1)),
        "module splits": lambda: mt.GroupedLinear(E, H, 3)(x, [T, -1] + [1] * (E - 2)),
        "module probs no bias": lambda: mt.GroupedLinear(E, H, 3, bias=False)(x, [T] + [0] * (E - 1), torch.rand(T)),
        "raw router_backward ids strided": lambda: torch.ops.moex.router_backward(
            logits, torch.cat([ids, ids], 1)[:, ::2], torch.ones(T, k), k, 0, 1),
        "raw permute_backward k": lambda: torch.ops.moex.permute_backward(row_map.reshape(-1), xp, pp, 0),
    }
    return what, cases[what]


@property_test(600)
def test_bad_inputs_raise(draw):
    """One thing wrong in an otherwise valid call: ValueError or MoexError, nothing else."""
    what, call = draw.pick([_bad_linear, _bad_other])(draw)
    try:
        out = call()
    except ERRORS:
        return
    except Exception as e:   # any other exception is a bug in the argument checks
        raise AssertionError(f"{what}: raised {type(e).__name__}: {e}") from e
    raise AssertionError(f"{what}: no error; returned {type(out).__name__}")


def test_zero_rows():
    """T = 0 everywhere: empty outputs and gradients, no error."""
    x = torch.zeros(0, 4, requires_grad=True)
    w = torch.randn(2, 3, 4, requires_grad=True)
    y = mt.grouped_linear(x, w, [0, 0], torch.randn(2, 3), torch.rand(0))
    assert y.shape == (0, 3)
    y.sum().backward()
    assert x.grad.shape == (0, 4) and torch.count_nonzero(w.grad) == 0
    assert mt.grouped_mlp(x, torch.randn(2, 4, 4), torch.randn(2, 4, 2), [0, 0]).shape == (0, 4)
    assert mt.scaled_glu(torch.zeros(0, 6)).shape == (0, 3)
    probs, ids = mt.router(torch.zeros(0, 3), 2)
    assert probs.shape == (0, 2) and ids.shape == (0, 2)
    assert mt.MoELayer(3, 4, 2, topk=2)(torch.zeros(0, 4)).shape == (0, 4)
    assert mt.GroupedLinear(2, 4, 3)(torch.zeros(5, 0, 4), [0, 0]).shape == (5, 0, 3)
