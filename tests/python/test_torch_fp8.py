"""test_torch_fp8.py - FP8 training through moex.torch (experimental; docs/ops.md 9.11): the
modules GroupedLinear, GroupedMLP and MoELayer and the functions grouped_linear and grouped_mlp
with fp8_recipe="block" | "current" | "mxfp8" (and fp8_format="hybrid"), on the CPU and, where
there is a GPU, on CUDA.

Each check runs a module with a recipe and the same module (same weights, inputs and output
gradient) without one, and compares the forward output and every gradient:

  - the tolerance model: every GEMM operand is rounded to FP8, E4M3 with a relative step of
    2^-4 (E5M2, the gradients of "hybrid": 2^-3), so a product of two quantized operands has a
    normwise relative error of a few 2^-4 / sqrt(3), and the MLP's input gradient, two products
    in a row (dz = dy W2, then dx = dh W1), about sqrt(2) times that. Measured on these shapes
    (CPU, f32 and bf16): 0.027-0.076 for E4M3 (the largest: MXFP8's dx of the MLP, whose power-
    of-2 block scales use less of the format's range), 0.034-0.099 with "hybrid". The bounds:
    normwise relative error < 0.1 (E4M3) and < 0.15 (hybrid); and > 5e-3, far above the f32 or
    bf16 differences of two plain runs (0 here: the same calls), which proves that the recipe
    took effect in that product. The sums that are not GEMMs (the bias gradients of a linear
    layer or of FC2, the scaled bias's dprobs) are the plain path's own: < 1e-5.
  - the lower level: the module's output and gradients are bitwise those of the moex::
    operators (torch.ops.moex.*) called with the recipe's integer arguments, and (the MLP's and
    the MoE layer's backward, whose saved h already differs) of the C call with the recipe in
    its fp8 field, so the module passes the recipe to every call of its forward and backward
    (moex is deterministic).

Also: the weight-gradient options (fuse_wgrad_accumulation, delay_wgrad_compute: the backward
as separate operators) with a recipe give the fused backward's gradients (1e-4 of the largest
magnitude, as in test_torch_grouped_mlp.py: sums in other orders, and the FP8 copies of the
same values); torch.compile(fullgraph=True) gives the eager gradients; a CUDA graph of an FP8
step replays for new splits; bad recipe names raise ValueError naming the allowed ones.
"""
import re

import pytest

torch = pytest.importorskip("torch")

import moex  # noqa: E402
import moex.torch as mt  # noqa: E402
from moex import _capi  # noqa: E402
from moex.torch import _fp8, _moe, _operators  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
RECIPES = ["block", "current", "mxfp8"]
CODES = {"block": 1, "current": 2, "mxfp8": 3}
SPLITS = [40, 0, 72, 33]   # an empty group; groups of other sizes than the blocks
T = sum(SPLITS)
H, FF = 96, 64             # K of 96: a partial 128-block; F of 64
BOUND = {"e4m3": 0.1, "hybrid": 0.15}
MIN_EFFECT = 5e-3
PLAIN_SUM = 1e-5


def rel(a, b):
    """The normwise relative error of a against b, in f64."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def compare(names, got, want, fmt, plain_sums=()):
    """got (FP8) against want (the same module without FP8), name by name: the names in
    plain_sums are the plain path's sums, the others FP8 products (see the module docstring)."""
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        err = rel(a, b)
        if name in plain_sums:
            assert err < PLAIN_SUM, f"{name}: {err:.3g} from the plain path's sum"
        else:
            assert err < BOUND[fmt], f"{name}: normwise relative error {err:.4f} >= {BOUND[fmt]}"
            assert err > MIN_EFFECT, f"{name}: {err:.3g} from the plain result: the recipe did not take effect"


def fp8_args(recipe, fmt="e4m3"):
    """The operators' fp8 arguments (mode, dtypes, pow2_scales, amax_epsilon)."""
    return CODES[recipe], int(fmt == "hybrid"), False, 0.0


def c_call(stem, args, device, recipe, fmt):
    """moex_<stem> itself on `args` (a _capi struct; for the MoE layer's backward, `args.fwd`
    carries the recipe) with the recipe in its fp8 field: the backward through the C API, apart
    from the operators (the forward's saved h is FP8's either way, so only this shows that the
    backward got the recipe)."""
    recipe_struct = _capi.Fp8Recipe(CODES[recipe], int(fmt == "hybrid"), 0, 0.0)
    if stem == "moe_layer_backward":
        args.fwd.fp8 = recipe_struct
    else:
        args.fp8 = recipe_struct
    _operators._run(stem, args, torch.device(device))


def linear_case(device, dtype, recipe, fmt, **options):
    """A packed GroupedLinear with a scaled bias: the module, x, probs and dy (the modules of
    the three cases have the same weights with and without a recipe)."""
    torch.manual_seed(0)
    m = mt.GroupedLinear(4, H, FF, packed=True, params_dtype=dtype, device=device, fp8_recipe=recipe,
                         fp8_format=fmt, **options)
    with torch.no_grad():
        m.bias.normal_()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, H, generator=g).to(device, dtype).requires_grad_(True)
    probs = torch.rand(T, generator=g).to(device).requires_grad_(True)
    dy = torch.randn(T, FF, generator=g).to(device, dtype)
    return m, x, probs, dy


def mlp_case(device, dtype, recipe, fmt, **options):
    torch.manual_seed(0)
    m = mt.GroupedMLP(4, H, FF, bias1=True, bias2=True, scale_b2=True, params_dtype=dtype, device=device,
                      init_method=lambda t: torch.nn.init.normal_(t, std=0.1), fp8_recipe=recipe, fp8_format=fmt,
                      **options)
    with torch.no_grad():
        m.b1.normal_()
        m.b2.normal_()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, H, generator=g).to(device, dtype).requires_grad_(True)
    probs = torch.rand(T, generator=g).to(device).requires_grad_(True)
    dy = torch.randn(T, H, generator=g).to(device, dtype)
    return m, x, probs, dy


def moe_case(device, dtype, recipe, fmt, **options):
    torch.manual_seed(0)
    m = mt.MoELayer(6, 64, 64, topk=2, bias1=True, bias2=True, params_dtype=dtype, device=device,
                    init_method=lambda t: torch.nn.init.normal_(t, std=0.1), fp8_recipe=recipe, fp8_format=fmt,
                    **options)
    with torch.no_grad():
        m.b1.normal_()
        m.b2.normal_()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(96, 64, generator=g).to(device, dtype).requires_grad_(True)
    dy = torch.randn(96, 64, generator=g).to(device, dtype)
    return m, x, dy


def run_linear(device, dtype, recipe, fmt):
    m, x, probs, dy = linear_case(device, dtype, recipe, fmt)
    y = m(x, SPLITS, probs)
    return m, x, probs, dy, [y, *torch.autograd.grad(y, [x, m.weight, m.bias, probs], dy)]


def run_mlp(device, dtype, recipe, fmt):
    m, x, probs, dy = mlp_case(device, dtype, recipe, fmt)
    y = m(x, SPLITS, probs)
    return m, x, probs, dy, [y, *torch.autograd.grad(y, [x, m.w1, m.w2, m.b1, m.b2, probs], dy)]


def run_moe(device, dtype, recipe, fmt):
    m, x, dy = moe_case(device, dtype, recipe, fmt)
    y = m(x)
    return m, x, dy, [y, *torch.autograd.grad(y, [x, m.router_w, m.w1, m.w2, m.b1, m.b2], dy)]


CASES = [(r, "e4m3") for r in RECIPES] + [("block", "hybrid")]
SHORT = [("block", "e4m3"), ("mxfp8", "hybrid")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe,fmt", CASES)
def test_grouped_linear(device, dtype, recipe, fmt):
    m, x, probs, dy, got = run_linear(device, dtype, recipe, fmt)
    *_, want = run_linear(device, dtype, None, fmt)
    compare(["y", "dx", "dw", "dbias", "dprobs"], got, want, fmt, plain_sums=("dbias", "dprobs"))

    # the moex:: operators with the recipe's arguments, bitwise
    fp8 = fp8_args(recipe, fmt)
    w, b, splits = m.weight.detach(), m.bias.detach(), torch.tensor(SPLITS, device=device)
    xd, pd = x.detach(), probs.detach()
    y = torch.ops.moex.grouped_linear_forward(xd, w, splits, b, pd, 2, *fp8)
    dx, dbias, dprobs = torch.ops.moex.grouped_linear_backward_data(dy, w, splits, b, pd, 2, True, True, True, *fp8)
    dw = torch.ops.moex.grouped_linear_backward_weight(xd, dy, splits, 0 if dtype == torch.float32 else 1, *fp8)
    for name, a, e in zip(["y", "dx", "dw", "dbias", "dprobs"], got, [y, dx, dw, dbias, dprobs]):
        assert torch.equal(a, e), f"{name}: the module differs from the moex:: operator with the recipe"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe,fmt", CASES + [("mxfp8", "hybrid")])
def test_grouped_mlp(device, dtype, recipe, fmt):
    m, x, probs, dy, got = run_mlp(device, dtype, recipe, fmt)
    *_, want = run_mlp(device, dtype, None, fmt)
    compare(["y", "dx", "dw1", "dw2", "db1", "db2", "dprobs"], got, want, fmt, plain_sums=("db2",))

    fp8 = fp8_args(recipe, fmt)
    p = [t.detach() for t in (x, m.w1, m.b1, m.w2, m.b2, probs)]
    splits, glu = torch.tensor(SPLITS, device=device), (0, 0, 7.0, 1.702, 1.0)
    y, h, z = torch.ops.moex.grouped_mlp_forward(*p, splits, 2, *glu, False, *fp8)
    outs = torch.ops.moex.grouped_mlp_backward(*p, splits, h.clone(), z, dy, 2, *glu, [True] * 6, *fp8)
    for name, a, e in zip(["y", "dx", "dw1", "dw2", "db1", "db2", "dprobs"], got, [y, *outs]):
        assert torch.equal(a, e), f"{name}: the module differs from the moex:: operators with the recipe"
    grads = [torch.empty_like(t) for t in outs[:5]] + [torch.zeros_like(outs[5])]
    x_, w1, b1, w2, b2, pr = p
    c_call("grouped_mlp_backward", _operators._args(
        _capi.GroupedMlpGradArgs, x=x_, w1=w1, w2=w2, b2_mode=2, b2=b2, probs=pr, glu=_capi.GluParams(*glu),
        splits=splits, h=h, dy=dy, dx=grads[0], dw1=grads[1], dw2=grads[2], db1=grads[3], db2=grads[4],
        dprobs=grads[5]), device, recipe, fmt)
    for name, a, e in zip(["dx", "dw1", "dw2", "db1", "db2", "dprobs"], got[1:], grads):
        assert torch.equal(a, e), f"{name}: the module differs from moex_grouped_mlp_backward with the recipe"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe,fmt", CASES)
def test_moe_layer(device, recipe, fmt):
    m, x, dy, got = run_moe(device, torch.float32, recipe, fmt)
    *_, want = run_moe(device, torch.float32, None, fmt)
    # drouter_w: the router GEMM is not FP8, but its gradient comes through the experts' dprobs
    compare(["y", "dx", "drouter_w", "dw1", "dw2", "db1", "db2"], got, want, fmt, plain_sums=("db2",))

    fp8 = fp8_args(recipe, fmt)
    p = [t.detach() for t in (x, m.router_w, m.w1, m.b1, m.w2, m.b2)]
    y, saved = torch.ops.moex.moe_layer_forward(*p, *m.options, *fp8)
    outs = torch.ops.moex.moe_layer_backward(*p, saved, dy, *m.options, [True] * 6, *fp8)
    for name, a, e in zip(["y", "dx", "drouter_w", "dw1", "dw2", "db1", "db2"], got, [y, *outs]):
        assert torch.equal(a, e), f"{name}: the module differs from the moex:: operators with the recipe"
    grads = [torch.empty_like(t) for t in outs]
    fwd = _moe._moe_args(*p, *m.options[:4], m.options[4:], saved, None, _fp8._FP8_OFF)
    c_call("moe_layer_backward", _operators._args(
        _capi.MoeLayerGradArgs, fwd=fwd, dy=dy, dx=grads[0], drouter_w=grads[1], dw1=grads[2], dw2=grads[3],
        db1=grads[4], db2=grads[5]), device, recipe, fmt)
    for name, a, e in zip(["dx", "drouter_w", "dw1", "dw2", "db1", "db2"], got[1:], grads):
        assert torch.equal(a, e), f"{name}: the module differs from moex_moe_layer_backward with the recipe"


@pytest.mark.parametrize("recipe,fmt", SHORT)
def test_functions(recipe, fmt):
    """grouped_linear and grouped_mlp take the recipe as the modules do (the same bits)."""
    m, x, probs, dy, got = run_linear("cpu", torch.float32, recipe, fmt)
    y = mt.grouped_linear(x, m.weight, SPLITS, m.bias, probs, fp8_recipe=recipe, fp8_format=fmt)
    assert torch.equal(y, got[0])
    assert torch.equal(torch.autograd.grad(y, [m.weight], dy)[0], got[2])

    m, x, probs, dy, got = run_mlp("cpu", torch.float32, recipe, fmt)
    y = mt.grouped_mlp(x, m.w1, m.w2, SPLITS, m.b1, m.b2, probs, scale_b2=True, fp8_recipe=recipe, fp8_format=fmt)
    assert torch.equal(y, got[0])
    assert torch.equal(torch.autograd.grad(y, [x], dy)[0], got[1])


def test_recipe_attributes():
    """The recipe is the module's: assigning it checks it and changes the next forward; None
    gives the plain path back, bitwise."""
    m, x, probs, _ = linear_case("cpu", torch.float32, None, "e4m3")
    with torch.no_grad():
        plain = m(x, SPLITS, probs)
        m.fp8_recipe = "current"
        assert (m.fp8_recipe, m.fp8_format) == ("current", "e4m3")
        assert "fp8_recipe='current'" in repr(m)
        current = m(x, SPLITS, probs)
        m.fp8_pow2_scales = True
        pow2 = m(x, SPLITS, probs)
        m.fp8_recipe = None
        again = m(x, SPLITS, probs)
    assert MIN_EFFECT < rel(current, plain) < BOUND["e4m3"]
    assert not torch.equal(pow2, current) and rel(pow2, plain) < BOUND["e4m3"]
    assert torch.equal(again, plain)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["linear", "mlp", "moe"])
@pytest.mark.parametrize("fuse,delay", [(True, False), (False, True)])
def test_weight_gradient_options(device, kind, fuse, delay, te_weight_grads):
    """fuse_wgrad_accumulation and delay_wgrad_compute with a recipe (the weight gradients
    from separate FP8 calls; the MLP's backward as the grouped linear's FP8 operators) against
    the same module with moex's fused FP8 backward."""
    te = dict(fuse_wgrad_accumulation=fuse, delay_wgrad_compute=delay)
    case = {"linear": linear_case, "mlp": mlp_case, "moe": moe_case}[kind]
    plain, *inputs = case(device, torch.float32, "block", "e4m3")
    mod, *_ = case(device, torch.float32, "block", "e4m3", **te)
    x0, dy = inputs[0], inputs[-1]
    xs = {m: x0.detach().clone().requires_grad_(True) for m in (plain, mod)}
    others = {"x": (xs[plain], xs[mod])}
    if kind == "linear":
        weights = ["weight"]
        others["bias"] = (plain.bias, mod.bias)
    else:
        weights = ["w1", "w2"]
        others.update({"b1": (plain.b1, mod.b1), "b2": (plain.b2, mod.b2)})
        if kind == "moe":
            others["router_w"] = (plain.router_w, mod.router_w)
    if kind != "moe":
        ps = {m: inputs[1].detach().clone().requires_grad_(True) for m in (plain, mod)}
        others["probs"] = (ps[plain], ps[mod])

    def run(m, first):
        y = m(xs[m], is_first_microbatch=first) if kind == "moe" else m(xs[m], SPLITS, ps[m], is_first_microbatch=first)
        y.backward(dy)

    te_weight_grads(plain, mod, run, weights, others, tol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["linear", "mlp", "moe"])
def test_compile_fullgraph(device, kind):
    """torch.compile(fullgraph=True) of a step of the FP8 module gives the eager gradients,
    which are FP8's (not the plain module's)."""
    if kind == "linear":
        m, x, probs, _ = linear_case(device, torch.float32, "block", "e4m3")
        params = [x, probs, m.weight]
        step = lambda x, probs: (m(x, torch.tensor(SPLITS, device=device), probs) ** 2).sum()  # noqa: E731
    elif kind == "mlp":
        m, x, probs, _ = mlp_case(device, torch.float32, "current", "hybrid")
        params = [x, probs, m.w1, m.w2]
        step = lambda x, probs: (m(x, torch.tensor(SPLITS, device=device), probs) ** 2).sum()  # noqa: E731
    else:
        m, x, _ = moe_case(device, torch.float32, "mxfp8", "e4m3")
        probs = None
        params = [x, m.router_w, m.w1, m.w2]
        step = lambda x, probs: (m(x) ** 2).sum()  # noqa: E731
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(x, probs), params)
    want = torch.autograd.grad(step(x, probs), params)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    m.fp8_recipe = None
    plain = torch.autograd.grad(step(x, probs), params)
    assert all(rel(a, e) > MIN_EFFECT for a, e in zip(got[2:], plain[2:])), "the compiled step was not FP8"


def test_opcheck():
    """torch.library's checks of the operators with the fp8 arguments in their schema."""
    _, x, probs, dy = linear_case("cpu", torch.float32, None, "e4m3")
    w = 0.2 * torch.randn(4, FF, H)
    splits = torch.tensor(SPLITS)
    torch.library.opcheck(torch.ops.moex.grouped_linear_forward.default,
                          (x.detach(), w, splits, None, None, 0, 1, 1, True, 1e-6))
    torch.library.opcheck(torch.ops.moex.grouped_linear_backward_weight.default, (x.detach(), dy, splits, 0, 2, 0))
    for name in ("grouped_linear_forward", "grouped_linear_backward_data", "grouped_linear_backward_weight",
                 "grouped_linear_backward_weight_accumulate", "grouped_mlp_forward", "grouped_mlp_backward",
                 "moe_layer_forward", "moe_layer_backward"):
        schema = str(getattr(torch.ops.moex, name).default._schema)   # int arguments print as SymInt
        assert re.search(r"\w+ fp8_mode=0, \w+ fp8_dtypes=0, bool fp8_pow2_scales=False, float fp8_amax_epsilon=0\.",
                         schema), schema


def test_errors():
    allowed = r"fp8_recipe must be None or one of \['block', 'current', 'mxfp8'\], got 'delayed'"
    with pytest.raises(ValueError, match=allowed):
        mt.GroupedLinear(2, 8, 8, fp8_recipe="delayed")
    with pytest.raises(ValueError, match=r"moex.torch.GroupedMLP: fp8_recipe must be .* got 'BLOCK'"):
        mt.GroupedMLP(2, 8, 8, fp8_recipe="BLOCK")
    with pytest.raises(ValueError, match=r"moex.torch.MoELayer: fp8_format must be one of \['e4m3', 'hybrid'\]"):
        mt.MoELayer(4, 8, 8, topk=2, fp8_recipe="block", fp8_format="e5m2")
    with pytest.raises(ValueError, match="fp8_pow2_scales and fp8_amax_epsilon apply to 'block' and 'current'"):
        mt.GroupedLinear(2, 8, 8, fp8_recipe="mxfp8", fp8_pow2_scales=True)
    with pytest.raises(ValueError, match="fp8_amax_epsilon must be finite and >= 0"):
        mt.GroupedLinear(2, 8, 8, fp8_recipe="block", fp8_amax_epsilon=-1.0)
    layer = mt.GroupedLinear(2, 8, 8)
    with pytest.raises(ValueError, match="fp8_recipe must be None or one of"):
        layer.fp8_recipe = "fp4"
    assert layer.fp8_recipe is None   # unchanged
    x, w = torch.randn(4, 8), torch.randn(2, 8, 8)
    with pytest.raises(ValueError, match=r"moex.grouped_linear: fp8_recipe must be .* got 'tensor'"):
        mt.grouped_linear(x, w, [2, 2], fp8_recipe="tensor")
    with pytest.raises(ValueError, match="moex.grouped_mlp: fp8_format must be one of"):
        mt.grouped_mlp(x, torch.randn(2, 16, 8), torch.randn(2, 8, 8), [2, 2], fp8_recipe="block", fp8_format="")
    with pytest.raises(moex.MoexError, match="MOEX_ERR_INVALID_ARG"):   # the operator's integers: C checks them
        torch.ops.moex.grouped_linear_forward(x, w, torch.tensor([2, 2]), None, None, 0, 7)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("recipe", ["block", "current"])
def test_cuda_graph_replays_with_new_splits(recipe):
    """A captured FP8 forward + backward of GroupedMLP replays correctly after the device
    splits change (the quantizes read the splits on the device)."""
    layer = mt.GroupedMLP(4, 128, 128, bias2=True, params_dtype=torch.bfloat16, device="cuda", fp8_recipe=recipe)
    x = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    splits = torch.tensor([64, 64, 64, 64], device="cuda")
    dy = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)

    def step():
        y = layer(x, splits)
        gx, gw1 = torch.autograd.grad(y, [x, layer.w1], dy)
        return y, gx, gw1

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # warm-up outside the graph (contexts, allocator)
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = step()
    for new in ([256, 0, 0, 0], [1, 2, 3, 250], [0, 100, 0, 156]):
        splits.copy_(torch.tensor(new))
        graph.replay()
        out_e = step()
        for a, e in zip(out_g, out_e):
            torch.testing.assert_close(a, e)


# ---- weights quantized once (is_first_microbatch; docs/ops.md 9.11) ------------------------------

def step(m, x, dy, leaves, *args, **kwargs):
    """One forward and backward of m: y and the gradients of `leaves`."""
    y = m(x, *args, **kwargs)
    return [y, *torch.autograd.grad(y, leaves, dy)]


def same(got, want, what):
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"{what}: output {i} differs"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["linear", "mlp", "moe"])
@pytest.mark.parametrize("recipe", ["block", "current", "mxfp8"])
def test_kept_weight_copies(device, kind, recipe):
    """is_first_microbatch True / False: the module quantizes its weights once and keeps the
    copies; every step is bitwise the step that quantizes them in the call (None). The copies are
    read: kept copies of stale weights give the stale weights' result until a weight's version
    moves (an optimizer's in-place step), which makes them anew; first_microbatch=True always
    does. The operators check the buffer."""
    dtype = torch.bfloat16
    if kind == "linear":
        m, x, probs, dy = linear_case(device, dtype, recipe, "e4m3")
        leaves, args, weights = [x, m.weight, m.bias, probs], (SPLITS, probs), ("weight",)
    elif kind == "mlp":
        m, x, probs, dy = mlp_case(device, dtype, recipe, "e4m3")
        leaves, args, weights = [x, m.w1, m.w2, m.b1, m.b2, probs], (SPLITS, probs), ("w1", "w2")
    else:
        m, x, dy = moe_case(device, dtype, recipe, "e4m3")
        leaves, args, weights = [x, m.router_w, m.w1, m.w2, m.b1, m.b2], (), ("w1", "w2")
    want = step(m, x, dy, leaves, *args)
    first = step(m, x, dy, leaves, *args, is_first_microbatch=True)
    buffer = m._fp8_kept_buffer
    later = step(m, x, dy, leaves, *args, is_first_microbatch=False)
    same(first, want, "first microbatch")
    same(later, want, "a later microbatch")
    assert m._fp8_kept_buffer is buffer, "the copies were made again for unchanged weights"

    # stale copies are read: change the weights without a version bump (through .data)
    old = [getattr(m, n).detach().clone() for n in weights]
    for n in weights:
        getattr(m, n).data.mul_(1.5)
    stale = step(m, x, dy, leaves, *args, is_first_microbatch=False)
    assert torch.equal(stale[0], want[0]), "the forward did not read the kept copies"
    fresh = step(m, x, dy, leaves, *args, is_first_microbatch=True)
    plain = step(m, x, dy, leaves, *args)
    same(fresh, plain, "after first_microbatch=True")
    assert not torch.equal(fresh[0], want[0])
    # an optimizer-like in-place update moves the version: made anew without being asked
    with torch.no_grad():
        for n, o in zip(weights, old):
            getattr(m, n).copy_(o)
    same(step(m, x, dy, leaves, *args, is_first_microbatch=False), want, "after an in-place update")


def test_kept_copies_buffer_checked():
    _, x, probs, dy = linear_case("cpu", torch.float32, None, "e4m3")
    w = 0.2 * torch.randn(4, FF, H)
    splits = torch.tensor(SPLITS)
    buf = _fp8._kept_quantize(fp8_args("block"), [w])
    y = torch.ops.moex.grouped_linear_forward(x.detach(), w, splits, None, None, 0, *fp8_args("block"), buf)
    torch.testing.assert_close(y, torch.ops.moex.grouped_linear_forward(x.detach(), w, splits, None, None, 0,
                                                                        *fp8_args("block")), rtol=0, atol=0)
    with pytest.raises(ValueError, match="too few"):
        torch.ops.moex.grouped_linear_forward(x.detach(), w, splits, None, None, 0, *fp8_args("block"), buf[:64])
    with pytest.raises(ValueError, match="uint8"):
        torch.ops.moex.grouped_linear_forward(x.detach(), w, splits, None, None, 0, *fp8_args("block"), buf.float())
    # off: not read
    torch.ops.moex.grouped_linear_forward(x.detach(), w, splits, None, None, 0, 0, 0, False, 0.0, buf[:1])
