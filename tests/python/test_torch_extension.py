"""test_torch_extension.py - the compiled PyTorch extension (python/csrc, moex._torch_ext): that it
is what runs the moex:: operators it defines, and that it computes what the Python operators
over ctypes compute (bitwise: the same C library underneath), raises the same errors (ValueError
naming the argument, moex.MoexError with moex_last_error), gives the same gradients, only those
autograd asks for, refuses to be differentiated twice, and serves several threads at once.

The extension must be loaded when this is an installed package (`pip install ./python` with
torch present builds it; its absence there is a build failure); run from the source tree
(PYTHONPATH=python) without it, or with MOEX_TORCH_EXTENSION=0, these tests are skipped.
"""
import os
import shutil
import subprocess
import threading

import pytest

torch = pytest.importorskip("torch")

import moex  # noqa: E402
import moex._torch_ext as ext  # noqa: E402
import moex.torch as mt  # noqa: E402
from moex.torch import _glu, _linear, _linear_layer, _mlp, _moe, _operators, _routing, _splits  # noqa: E402

# The operators each migration step moved to C++ (python/csrc).
GROUPED_LINEAR_OPS = ["grouped_linear_forward", "grouped_linear_backward_data", "grouped_linear_backward_weight",
                      "grouped_linear_backward_weight_accumulate"]
GROUPED_MLP_OPS = ["grouped_mlp_forward", "grouped_mlp_backward"]
MOE_OPS = ["moe_layer_forward", "moe_layer_backward"]
DISCRETE_OPS = ["grouped_linear_discrete_forward", "grouped_linear_discrete_backward_data"]   # C++ only
REST_OPS = ["scaled_glu_forward", "scaled_glu_backward", "splits_to_offsets", "router_forward", "router_backward",
            "permute_forward", "permute_backward", "unpermute_forward", "unpermute_backward"]
CPP_OPS = GROUPED_LINEAR_OPS + GROUPED_MLP_OPS + MOE_OPS + REST_OPS
# moex.torch's operator object of each
OPERATORS = {"grouped_linear_forward": _linear._forward, "grouped_linear_backward_data": _linear._backward_data,
             "grouped_linear_backward_weight": _linear._backward_weight,
             "grouped_linear_backward_weight_accumulate": _linear._backward_weight_accumulate,
             "grouped_mlp_forward": _mlp._mlp_forward, "grouped_mlp_backward": _mlp._mlp_backward,
             "moe_layer_forward": _moe._moe_forward, "moe_layer_backward": _moe._moe_backward,
             "scaled_glu_forward": _glu._glu_forward, "scaled_glu_backward": _glu._glu_backward,
             "splits_to_offsets": _splits._splits_to_offsets, "router_forward": _routing._router_forward,
             "router_backward": _routing._router_backward, "permute_forward": _routing._permute_forward,
             "permute_backward": _routing._permute_backward, "unpermute_forward": _routing._unpermute_forward,
             "unpermute_backward": _routing._unpermute_backward}

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])   # bitwise tests on both backends

_INSTALLED = os.path.isdir(os.path.join(os.path.dirname(moex.__file__), "lib"))
if ext.PATH is None and (not _INSTALLED or os.environ.get("MOEX_TORCH_EXTENSION") == "0"):
    pytest.skip(f"the PyTorch extension is not loaded ({ext.LOAD_ERROR})", allow_module_level=True)


def test_extension_is_loaded_and_defines_the_operators():
    assert ext.PATH is not None, f"the installed package has no working PyTorch extension: {ext.LOAD_ERROR}"
    assert set(CPP_OPS) <= ext.OPS
    for name in CPP_OPS:
        assert isinstance(OPERATORS[name], _operators._CppOperator), name
        # the dispatcher's registrations: schema, CPU and CUDA kernels from python/csrc
        dump = torch._C._dispatch_dump(f"moex::{name}")
        for key, source in (("debug", "schemas.cpp"), ("CPU", "kernels.cpp"), ("CUDA", "kernels.cpp")):
            line = next(ln for ln in dump.splitlines() if ln.startswith(key + ":"))
            assert source in line, f"moex::{name} {key}: {line}"
    for name in ("grouped_linear_forward", "grouped_mlp_forward", "moe_layer_forward", "grouped_linear_discrete_forward",
                 "scaled_glu_forward", "router_forward", "permute_forward", "unpermute_forward"):
        dump = torch._C._dispatch_dump(f"moex::{name}")
        assert "autograd.cpp" in next(ln for ln in dump.splitlines() if ln.startswith("Autograd")), name


def test_extension_shares_the_cpp_runtime():
    """libmoex_torch.so needs the shared libstdc++, the one torch runs on: a private static copy
    (a toolchain that links the standard library statically by default) crashed in iostreams on
    the first ValueError message on the GPU machine (python/CMakeLists.txt)."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf")
    needed = subprocess.run([readelf, "-d", ext.PATH], capture_output=True, text=True, check=True).stdout
    assert "[libstdc++.so." in needed, needed
    # and no part of a static libstdc++ inside (the crash's frame: std::ostream::_M_insert<long>)
    symbols = subprocess.run([readelf, "-sW", ext.PATH], capture_output=True, text=True, check=True).stdout
    private = [ln for ln in symbols.splitlines() if "_ZNSo9_M_insert" in ln and " UND " not in ln]
    assert not private, private[:3]


def inputs(T=13, K=24, N=16, splits=(3, 0, 7, 2), dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(device, dtype)
    w = (0.2 * torch.randn(len(splits), N, K, generator=g)).to(device, dtype)
    b = torch.randn(len(splits), N, generator=g).to(device, dtype)
    p = torch.rand(T, generator=g).to(device)
    return x, w, torch.tensor(splits, device=device), b, p


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_operators_match_the_python_implementation_bitwise(device, dtype, mode):
    """Each C++ kernel against its Python implementation over ctypes (_CppOperator.impl)."""
    x, w, splits, b, p = inputs(dtype=dtype, device=device)
    n = int(splits.sum())
    bias, probs = (b if mode else None), (p if mode == 2 else None)
    args = (x, w, splits, bias, probs, mode)
    y = _linear._forward(*args)
    assert torch.equal(y, _linear._forward.impl(*args)) and torch.count_nonzero(y[n:]) == 0   # zero tail

    dy = torch.randn_like(y)
    args = (dy, w, splits, bias, probs, mode, True, mode != 0, mode == 2)
    for got, want in zip(_linear._backward_data(*args), _linear._backward_data.impl(*args)):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got, want)

    code = 0 if dtype == torch.float32 else 1
    assert torch.equal(_linear._backward_weight(x, dy, splits, code), _linear._backward_weight.impl(x, dy, splits, code))
    main, main_py = torch.ones(4, 16, 24, device=device), torch.ones(4, 16, 24, device=device)
    _linear._backward_weight_accumulate(x, dy, splits, main)
    _linear._backward_weight_accumulate.impl(x, dy, splits, main_py)
    assert torch.equal(main, main_py) and not torch.equal(main, torch.ones_like(main))


def test_errors_are_value_errors_and_moex_errors():
    x, w, splits, b, p = inputs()
    with pytest.raises(ValueError, match=r"moex.grouped_linear_forward: w is torch.bfloat16, must be one of torch.float32$"):
        torch.ops.moex.grouped_linear_forward(x, w.bfloat16(), splits, None, None, 0)
    with pytest.raises(ValueError, match=r"moex.grouped_linear_forward: x must have 2 dimensions, has shape \(13,\)"):
        torch.ops.moex.grouped_linear_forward(x[:, 0].contiguous(), w, splits, None, None, 0)
    with pytest.raises(ValueError, match=r"moex.grouped_linear_forward: probs is required"):
        torch.ops.moex.grouped_linear_forward(x, w, splits, b, None, 2)
    with pytest.raises(ValueError, match=r"moex.grouped_linear_forward: bias is given but bias_mode is NONE"):
        torch.ops.moex.grouped_linear_forward(x, w, splits, b, None, 0)
    with pytest.raises(ValueError, match=r"moex.grouped_linear_backward_data: probs is given but bias_mode is ADD"):
        torch.ops.moex.grouped_linear_backward_data(torch.randn(13, 16), w, splits, b, p, 1, True, True, False)
    with pytest.raises(ValueError, match=r"moex.grouped_linear_backward_weight: x has 13 rows, dy 12"):
        torch.ops.moex.grouped_linear_backward_weight(x, torch.randn(12, 16), splits, 0)
    with pytest.raises(ValueError, match=r"dw_dtype 9 is not a float dtype code"):
        torch.ops.moex.grouped_linear_backward_weight(x, torch.randn(13, 16), splits, 9)
    with pytest.raises(ValueError, match=r"main_grad is torch.bfloat16"):
        torch.ops.moex.grouped_linear_backward_weight_accumulate(x, torch.randn(13, 16), splits,
                                                                 torch.zeros(4, 16, 24, dtype=torch.bfloat16))
    # a failure inside moex: MoexError (the C++ path's subclass), its status and moex_last_error
    with pytest.raises(moex.MoexError, match=r"^MOEX_ERR_BAD_SPLITS: .*splits sum past T") as info:
        torch.ops.moex.grouped_linear_forward(x, w, torch.tensor([3, 0, 7, 9]), None, None, 0)
    assert type(info.value) is ext.TorchMoexError and info.value.status == "MOEX_ERR_BAD_SPLITS"
    with pytest.raises(moex.MoexError, match="MOEX_ERR_BAD_SPLITS"):   # from the backward operators too
        torch.ops.moex.grouped_linear_backward_data(torch.randn(13, 16), w, torch.tensor([3, 0, 7, 9]), None, None, 0,
                                                    True, False, False)


def test_a_failure_in_backward_is_a_moex_error():
    """A moex failure inside the C++ backward reaches the caller of backward() as MoexError (the
    autograd engine carries the C++ exception; torch's bindings raise its Python type)."""
    x, w, splits, _, _ = inputs()
    x.requires_grad_()
    y = mt.grouped_linear(x, w, splits)
    splits.data[3] = 100   # past T, behind autograd's back (no version bump)
    with pytest.raises(moex.MoexError, match="MOEX_ERR_BAD_SPLITS") as info:
        y.sum().backward()
    assert type(info.value) is ext.TorchMoexError


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_autograd_computes_only_what_is_asked(mode):
    """The C++ autograd's gradients equal the Python operators' composed by hand, for each subset
    of inputs that torch.autograd.grad asks for."""
    x, w, splits, b, p = inputs()
    leaves = {"x": x.clone().requires_grad_(), "w": w.clone().requires_grad_()}
    if mode:
        leaves["bias"] = b.clone().requires_grad_()
    if mode == 2:
        leaves["probs"] = p.clone().requires_grad_()
    dy = torch.randn(13, 16)
    dx, dbias, dprobs = _linear._backward_data.impl(dy, w, splits, b if mode else None, p if mode == 2 else None, mode, True,
                                               mode != 0, mode == 2)
    want = {"x": dx, "w": _linear._backward_weight.impl(x, dy, splits, 0), "bias": dbias, "probs": dprobs}
    for names in [list(leaves)] + [[k] for k in leaves]:
        y = mt.grouped_linear(leaves["x"], leaves["w"], splits, leaves.get("bias"), leaves.get("probs"))
        grads = torch.autograd.grad(y, [leaves[k] for k in names], dy)
        for k, g in zip(names, grads):
            assert torch.equal(g, want[k]), k


def test_double_backward_raises_when_differentiated():
    """Under create_graph=True the gradients are the usual ones, marked so that differentiating
    them raises (as torch's once_differentiable), never silently missing terms."""
    x, w, splits, _, _ = inputs()
    x.requires_grad_()
    w.requires_grad_()
    (gx_plain,) = torch.autograd.grad(mt.grouped_linear(x, w, splits).square().sum(), [x])
    (gx,) = torch.autograd.grad(mt.grouped_linear(x, w, splits).square().sum(), [x], create_graph=True)
    assert torch.equal(gx.detach(), gx_plain) and not gx_plain.requires_grad
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


def test_threads_share_the_context():
    """Several threads calling the C++ operators at once (one moex context per device, locked
    per call) get each its own correct result."""
    cases = [inputs(seed=s) for s in range(4)]
    want = [_linear._forward.impl(x, w, s, None, None, 0) for x, w, s, _, _ in cases]
    got, errors = [[] for _ in cases], []

    def work(i):
        try:
            x, w, s, _, _ = cases[i]
            for _ in range(50):
                got[i].append(_linear._forward(x, w, s, None, None, 0))
        except Exception as e:   # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, ys in enumerate(got):
        assert len(ys) == 50 and all(torch.equal(y, want[i]) for y in ys)


# ---- grouped MLP ---------------------------------------------------------------------------------

def mlp_inputs(T=11, H=16, F=8, splits=(3, 0, 5, 2), dtype=torch.float32, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    G = len(splits)
    x = torch.randn(T, H, generator=g).to(device, dtype)
    w1 = (0.3 * torch.randn(G, 2 * F, H, generator=g)).to(device, dtype)
    w2 = (0.3 * torch.randn(G, H, F, generator=g)).to(device, dtype)
    b1 = torch.randn(G, 2 * F, generator=g).to(device, dtype)
    b2 = torch.randn(G, H, generator=g).to(device, dtype)
    p = torch.rand(T, generator=g).to(device)
    return x, w1, b1, w2, b2, p, torch.tensor(splits, device=device)


GLU = (1, 0, 7.0, 1.702, 1.0)   # clamped SwiGLU, contiguous halves


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b2_mode", [0, 1, 2])
@pytest.mark.parametrize("save_z", [False, True])
def test_mlp_operators_match_the_python_implementation_bitwise(device, dtype, b2_mode, save_z):
    x, w1, b1, w2, b2, p, splits = mlp_inputs(dtype=dtype, device=device)
    args = (x, w1, b1, w2, b2 if b2_mode else None, p, splits, b2_mode, *GLU, save_z)
    n = int(splits.sum())
    outs, want = _mlp._mlp_forward(*args), _mlp._mlp_forward.impl(*args)
    assert torch.equal(outs[0], want[0])   # y, its tail rows zero
    for got, ref in zip(outs[1:], want[1:]):   # h, z: for the backward, rows past the groups unwritten
        assert got.shape == ref.shape and torch.equal(got[:n], ref[:n])
    y, h, z = outs
    dy = torch.randn_like(y)
    for needs in ([True, True, True, True, b2_mode != 0, True], [True, False, True, False, b2_mode != 0, False],
                  [False, True, False, True, False, True]):
        bargs = (x, w1, b1, w2, b2 if b2_mode else None, p, splits)
        h_cpp, h_py = h.clone(), h.clone()
        got = _mlp._mlp_backward(*bargs, h_cpp, z, dy, b2_mode, *GLU, needs)
        ref = _mlp._mlp_backward.impl(*bargs, h_py, z, dy, b2_mode, *GLU, needs)
        for i, (a, b) in enumerate(zip(got, ref)):
            assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), (needs, i)
        assert torch.equal(h_cpp[:n], h_py[:n])   # dh written over h alike
    with pytest.raises(ValueError, match="moex.grouped_mlp_backward: needs has 5 entries, must have 6"):
        _mlp._mlp_backward(x, w1, b1, w2, None, p, splits, h.clone(), z, dy, 0, *GLU, [True] * 5)
    with pytest.raises(ValueError, match="moex.grouped_mlp_forward: b2_mode SCALED needs probs"):
        _mlp._mlp_forward(x, w1, b1, w2, b2, None, splits, 2, *GLU, save_z)
    with pytest.raises(ValueError, match="moex.grouped_mlp_forward: b2 is given but b2_mode is NONE"):
        _mlp._mlp_forward(x, w1, b1, w2, b2, p, splits, 0, *GLU, save_z)
    if device == "cpu":   # (CUDA flags bad split values on the device instead)
        with pytest.raises(moex.MoexError, match="MOEX_ERR_BAD_SPLITS"):
            _mlp._mlp_forward(x, w1, b1, w2, None, p, torch.tensor([3, 0, 5, 9]), 0, *GLU, save_z)


def test_mlp_autograd_computes_only_what_is_asked():
    x, w1, b1, w2, b2, p, splits = mlp_inputs()
    leaves = {k: t.clone().requires_grad_() for k, t in zip(("x", "w1", "b1", "w2", "b2", "probs"),
                                                              (x, w1, b1, w2, b2, p))}
    dy = torch.randn(11, 16)
    y, h, z = _mlp._mlp_forward.impl(x, w1, b1, w2, b2, p, splits, 2, *GLU, False)
    ref = _mlp._mlp_backward.impl(x, w1, b1, w2, b2, p, splits, h, z, dy, 2, *GLU, [True] * 6)
    want = dict(zip(("x", "w1", "w2", "b1", "b2", "probs"), ref))
    for names in [list(leaves), ["x"], ["w1", "b2"], ["probs"]]:
        out = mt.grouped_mlp(leaves["x"], leaves["w1"], leaves["w2"], splits, leaves["b1"], leaves["b2"],
                             leaves["probs"], scale_b2=True, glu="clamped_swiglu")
        grads = torch.autograd.grad(out, [leaves[k] for k in names], dy)
        for k, g in zip(names, grads):
            assert torch.equal(g, want[k]), (names, k)


def test_mlp_backward_consumes_h_and_refuses_double_backward():
    x, w1, _, w2, _, p, splits = mlp_inputs()
    x.requires_grad_()
    y = mt.grouped_mlp(x, w1, w2, splits, probs=p)
    y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):   # h holds dh now
        y.sum().backward()
    (gx,) = torch.autograd.grad(mt.grouped_mlp(x, w1, w2, splits, probs=p).sum(), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


# ---- MoE layer -----------------------------------------------------------------------------------

def moe_inputs(T=10, H=16, F=8, E=4, dtype=torch.float32, seed=2, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(device, dtype)
    rw = torch.randn(E, H, generator=g).to(device, dtype)
    w1 = (0.3 * torch.randn(E, 2 * F, H, generator=g)).to(device, dtype)
    w2 = (0.3 * torch.randn(E, H, F, generator=g)).to(device, dtype)
    b1 = torch.randn(E, 2 * F, generator=g).to(device, dtype)
    b2 = torch.randn(E, H, generator=g).to(device, dtype)
    return x, rw, w1, b1, w2, b2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b2_mode", [0, 1, 2])
def test_moe_operators_match_the_python_implementation_bitwise(device, dtype, b2_mode):
    x, rw, w1, b1, w2, b2 = moe_inputs(dtype=dtype, device=device)
    options = (2, 1, 1, b2_mode, *GLU)   # topk 2, sigmoid scores renormalised
    args = (x, rw, w1, b1, w2, b2 if b2_mode else None, *options)
    (y, saved), (y_py, saved_py) = _moe._moe_forward(*args), _moe._moe_forward.impl(*args)
    assert saved.dtype == torch.uint8 and saved.shape == saved_py.shape
    assert torch.equal(y, y_py)
    dy = torch.randn_like(y)
    for needs in ([True, True, True, True, True, b2_mode != 0], [True, False, False, True, False, False],
                  [False, True, True, False, True, False]):
        got = _moe._moe_backward(x, rw, w1, b1, w2, b2 if b2_mode else None, saved, dy, *options, needs)
        ref = _moe._moe_backward.impl(x, rw, w1, b1, w2, b2 if b2_mode else None, saved_py, dy, *options, needs)
        for i, (a, b) in enumerate(zip(got, ref)):
            assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), (needs, i)
    with pytest.raises(ValueError, match=r"moex.moe_layer_forward: topk = 5, must be 1..4 \(the experts\)"):
        _moe._moe_forward(x, rw, w1, b1, w2, None, 5, 1, 1, 0, *GLU)
    with pytest.raises(ValueError, match="moex.moe_layer_backward: saved is torch.float32"):
        _moe._moe_backward(x, rw, w1, b1, w2, None, saved.float(), dy, 2, 1, 1, 0, *GLU, [True] * 6)
    with pytest.raises(moex.MoexError, match="MOEX_ERR_INVALID_ARG"):   # the C library checks the score code
        _moe._moe_forward(x, rw, w1, b1, w2, None, 2, 7, 1, 0, *GLU)


def test_moe_layer_autograd_computes_only_what_is_asked():
    x, rw, w1, b1, w2, b2 = moe_inputs()
    options = (2, 0, 1, 2, *GLU)
    _, saved = _moe._moe_forward.impl(x, rw, w1, b1, w2, b2, *options)
    dy = torch.randn(10, 16)
    ref = _moe._moe_backward.impl(x, rw, w1, b1, w2, b2, saved, dy, *options, [True] * 6)
    want = dict(zip(("x", "router_w", "w1", "w2", "b1", "b2"), ref))
    leaves = {k: t.clone().requires_grad_() for k, t in zip(("x", "router_w", "w1", "b1", "w2", "b2"),
                                                              (x, rw, w1, b1, w2, b2))}
    for names in [list(leaves), ["x"], ["router_w", "b2"], ["w1", "w2"]]:
        y, saved_out = _moe._moe_forward(*(leaves[k] for k in ("x", "router_w", "w1", "b1", "w2", "b2")), *options)
        assert not saved_out.requires_grad
        grads = torch.autograd.grad(y, [leaves[k] for k in names], dy)
        for k, g in zip(names, grads):
            assert torch.equal(g, want[k]), (names, k)
    y, _ = _moe._moe_forward(*(leaves[k] for k in ("x", "router_w", "w1", "b1", "w2", "b2")), *options)
    (gx,) = torch.autograd.grad(y.sum(), [leaves["x"]], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


# ---- GroupedLinear on separate weights (weight0..: the C++ discrete-weight operators) ------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias_kind", ["none", "add", "scaled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_separate_weights_run_in_cpp_and_match_the_python_function(device, bias_kind, dtype):
    """GroupedLinear with weight0.. runs the C++ operator (its autograd node is the C++ Function)
    and gives bitwise what the Python autograd.Function over ctypes (_GroupedLinearDiscrete) gives."""
    assert set(DISCRETE_OPS) <= ext.OPS
    torch.manual_seed(0)
    layer = mt.GroupedLinear(3, 8, 6, bias=bias_kind != "none", params_dtype=dtype, device=device)
    x = torch.randn(11, 8, dtype=dtype, device=device, requires_grad=True)
    p = torch.rand(11, device=device, requires_grad=True) if bias_kind == "scaled" else None
    splits = torch.tensor([4, 0, 5], device=device)
    dy = torch.randn(11, 6, dtype=dtype, device=device)

    y = layer(x, splits, probs=p)
    node = y.grad_fn
    if "View" in node.name():   # the module's view back to N-D inputs' shape
        node = node.next_functions[0][0]
    assert "GroupedLinearDiscreteFunction" in node.name()
    y.backward(dy)
    got = [y.detach()] + [t.grad.clone() for t in [x, *layer.parameters()] + ([p] if p is not None else [])]

    for t in [x, *layer.parameters()] + ([p] if p is not None else []):
        t.grad = None
    params = layer._weight_params()
    host = layer._pointers.arrays(params)[1]
    assert host.tolist()[:3] == [t.data_ptr() for t in params]   # the operator's cache, current
    assert layer._pointers.pointers(params) is not None
    w, ptrs = layer._pointers.weight("test", params)
    b = layer._bias()
    y_py = _linear_layer._GroupedLinearDiscrete.apply(x, splits, b, p, w, ptrs, layer._fp8, None, *params)
    assert "GroupedLinearDiscrete" in y_py.grad_fn.name() and y_py.grad_fn.name() != node.name()
    y_py.backward(dy)
    want = [y_py.detach()] + [t.grad for t in [x, *layer.parameters()] + ([p] if p is not None else [])]
    for i, (a, b_) in enumerate(zip(got, want)):
        assert torch.equal(a, b_), i


def test_separate_weights_operator_keeps_its_pointer_cache():
    """The operator's ptrs (and on the CPU ptrs_host is the same tensor, G + 4 entries) are a cache
    of the weights' addresses that it keeps current, with the key of their kept maps (dtype code,
    N, K, then the maps' bytes: none on the CPU): filled on the first call (zeros: no weight's
    address), rewritten when a weight changes storage or the weights their dtype; wrong sizes and
    weights raise ValueError. torch.ops.moex.weight_maps_size is 0 on the CPU."""
    assert torch.ops.moex.weight_maps_size(torch.zeros(6, 8, dtype=torch.bfloat16), 3) == 0
    with pytest.raises(ValueError, match="groups is 0, must be >= 1"):
        torch.ops.moex.weight_maps_size(torch.zeros(6, 8), 0)
    with pytest.raises(ValueError, match="weight"):
        torch.ops.moex.weight_maps_size(torch.zeros(6, 8, dtype=torch.int64), 3)
    ws = [torch.randn(6, 8) for _ in range(3)]
    ptrs = torch.zeros(3 + 4, dtype=torch.int64)
    x, splits = torch.randn(9, 8), torch.tensor([3, 3, 3])
    op = torch.ops.moex.grouped_linear_discrete_forward
    y = op(x, ws, ptrs, ptrs, splits, None, None, 0)
    assert torch.equal(y, _linear._forward.impl(x, torch.stack(ws), splits, None, None, 0))
    assert ptrs.tolist() == [w.data_ptr() for w in ws] + [0, 6, 8, 0] and ptrs._version == 0
    ws[1] = torch.randn(6, 8)
    y = op(x, ws, ptrs, ptrs, splits, None, None, 0)
    assert torch.equal(y, _linear._forward.impl(x, torch.stack(ws), splits, None, None, 0))
    assert ptrs.tolist()[:3] == [w.data_ptr() for w in ws]
    wb = [w.bfloat16() for w in ws]
    y = op(x.bfloat16(), wb, ptrs, ptrs, splits, None, None, 0)
    assert torch.equal(y, _linear._forward.impl(x.bfloat16(), torch.stack(wb), splits, None, None, 0))
    assert ptrs.tolist() == [w.data_ptr() for w in wb] + [1, 6, 8, 0]
    with pytest.raises(ValueError, match=r"3 weights, ptrs has 2 entries"):
        op(x, ws, ptrs[:2].clone(), ptrs[:2].clone(), splits, None, None, 0)
    with pytest.raises(ValueError, match=r"ptrs_host 3 \(G \+ 4\)"):
        op(x, ws, ptrs, ptrs[:3].clone(), splits, None, None, 0)
    with pytest.raises(ValueError, match=r"ptrs_host"):
        op(x, ws, ptrs, ptrs.int(), splits, None, None, 0)
    assert ptrs.tolist()[:3] == [w.data_ptr() for w in wb]   # (a refused call leaves the cache as it was)
    with pytest.raises(ValueError, match=r"weights\[2\] is \[6, 7\], weights\[0\] \[6, 8\]"):
        op(x, ws[:2] + [torch.randn(6, 7)], ptrs, ptrs, splits, None, None, 0)
    with pytest.raises(ValueError, match=r"weights\[0\] is torch.bfloat16"):
        op(x, [w.bfloat16() for w in ws], ptrs, ptrs, splits, None, None, 0)


# ---- the scaled GLU, splits_to_offsets and routing -------------------------------------------------

def test_rest_operators_match_the_python_implementation_bitwise():
    torch.manual_seed(3)
    T, E, k, H = 9, 4, 2, 6
    h, probs, splits = torch.randn(T, 2 * 8), torch.rand(T), torch.tensor([2, 0, 4, 1])
    for args in [(h, probs, splits, *GLU), (h, None, None, 0, 0, 7.0, 1.702, 1.0)]:
        z = _glu._glu_forward(*args)
        assert torch.equal(z, _glu._glu_forward.impl(*args))
        dz = torch.randn_like(z)
        for got, want in zip(_glu._glu_backward(*args[:3], dz, *args[3:], args[1] is not None),
                             _glu._glu_backward.impl(*args[:3], dz, *args[3:], args[1] is not None)):
            assert torch.equal(got, want)
    for lead, code in [(True, 4), (False, 3)]:
        assert torch.equal(_splits._splits_to_offsets(splits, 3, lead, code), _splits._splits_to_offsets.impl(splits, 3, lead, code))
    with pytest.raises(ValueError, match="dtype_code 0 is not int64's or int32's"):
        _splits._splits_to_offsets(splits, 1, True, 0)

    logits = torch.randn(T, E)
    for score, norm in [(0, 1), (1, 0)]:
        (p, ids), (p_py, ids_py) = _routing._router_forward(logits, k, score, norm), _routing._router_forward.impl(logits, k, score, norm)
        assert torch.equal(p, p_py) and torch.equal(ids, ids_py)
        dp = torch.randn(T, k)
        assert torch.equal(_routing._router_backward(logits, ids, dp, k, score, norm),
                           _routing._router_backward.impl(logits, ids, dp, k, score, norm))
    with pytest.raises(ValueError, match=r"topk = 5, must be 1..4 \(the experts, logits' columns\)"):
        _routing._router_forward(logits, 5, 0, 1)

    x = torch.randn(T, H)
    got, want = _routing._permute_forward(x, ids, p, E), _routing._permute_forward.impl(x, ids, p, E)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    xp, probs_p, psplits, row_map = got
    dxp, dpp = torch.randn_like(xp), torch.randn_like(probs_p)
    for a, b in zip(_routing._permute_backward(row_map, dxp, dpp, k), _routing._permute_backward.impl(row_map, dxp, dpp, k)):
        assert torch.equal(a, b)
    assert torch.equal(_routing._unpermute_forward(xp, row_map, k), _routing._unpermute_forward.impl(xp, row_map, k))
    dy = torch.randn(T, H)
    assert torch.equal(_routing._unpermute_backward(dy, row_map), _routing._unpermute_backward.impl(dy, row_map))
    with pytest.raises(ValueError, match=r"permute_forward: x \(9, 6\), ids \(8, 2\) and probs \(9, 2\)"):
        _routing._permute_forward(x, ids[:8].contiguous(), p, E)
    with pytest.raises(ValueError, match="k = 4 must be >= 1 and divide the 18 rows of yp"):
        _routing._unpermute_forward(xp, row_map, 4)


def test_routing_autograd_runs_in_cpp_and_matches_the_python_operators():
    """router -> permute -> scaled GLU -> unpermute, differentiated: the C++ nodes run, and the
    gradients are those the Python implementations compose."""
    torch.manual_seed(4)
    T, E, k = 7, 3, 2
    logits = torch.randn(T, E, requires_grad=True)
    x = torch.randn(T, 2 * 4, requires_grad=True)
    p, ids = mt.router(logits, k)
    xp, pp, s, row_map = mt.permute(x, ids, p, E)
    y = mt.unpermute(mt.scaled_glu(xp, pp, s), row_map, k)
    assert "UnpermuteFunction" in y.grad_fn.name()
    dy = torch.randn_like(y)
    y.backward(dy)

    # the same chain by hand through the Python implementations
    with torch.no_grad():
        p2, ids2 = _routing._router_forward.impl(logits, k, 0, 1)
        xp2, pp2, s2, rm2 = _routing._permute_forward.impl(x, ids2, p2, E)
        dz = _routing._unpermute_backward.impl(dy, rm2)
        dh, dpp = _glu._glu_backward.impl(xp2, pp2, s2, dz, 0, 0, 7.0, 1.702, 1.0, True)
        dx, dp = _routing._permute_backward.impl(rm2, dh, dpp, k)
        dlogits = _routing._router_backward.impl(logits, ids2, dp, k, 0, 1)
    assert torch.equal(x.grad, dx) and torch.equal(logits.grad, dlogits)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_calls_run_on_torchs_current_stream_and_capture():
    """The C++ kernels enqueue on torch's current stream: a CUDA graph captured on torch's
    capture stream (any other stream would break the capture) replays the forward and the
    backward of GroupedLinear and GroupedMLP, with new inputs, equal to eager calls."""
    torch.manual_seed(5)
    layer = mt.GroupedLinear(4, 64, 32, params_dtype=torch.bfloat16, device="cuda")
    mlp = mt.GroupedMLP(4, 32, 16, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(48, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    splits = torch.tensor([10, 0, 20, 18], device="cuda")

    def step():
        y = mlp(layer(x, splits), splits)
        y.float().square().sum().backward()
        return y

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):   # warm-up (the separate weights' pointer array is built here)
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(g):
        y_graph = step()   # x.grad is now the graph's tensor, which replays write
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    got, got_dx = y_graph.clone(), x.grad.clone()
    x.grad = None
    y = step()
    torch.cuda.synchronize()
    assert torch.equal(got, y.detach()) and torch.equal(got_dx, x.grad)


def test_an_unloadable_extension_falls_back_to_the_python_operators(tmp_path):
    """An extension that cannot be loaded (e.g. built for another torch) warns and leaves moex.torch
    on its Python operators over ctypes, which then work."""
    import subprocess
    import sys
    bogus = tmp_path / "libmoex_torch.so"
    bogus.write_bytes(b"not a shared library")
    code = ("import warnings, torch\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    import moex._torch_ext as ext, moex.torch as mt, moex.torch._linear as _linear\n"
            "assert ext.PATH is None and not ext.OPS and any('could not be loaded' in str(x.message) for x in w)\n"
            "assert type(_linear._forward).__name__ == '_Operator'\n"
            "y = mt.grouped_linear(torch.ones(4, 2), torch.ones(2, 3, 2), [1, 3])\n"
            "assert torch.equal(y, torch.full((4, 3), 2.0))\n")
    env = {**os.environ, "MOEX_TORCH_EXTENSION": str(bogus)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", [True, False])
def test_grouped_linear_records_nothing_without_grad(device, packed):
    """The grouped linear forward under no_grad, or with no input that requires grad, runs its
    operator without an autograd node (as torch's own kernels do): the same y bitwise as the
    recorded call, no grad_fn; with an input that requires grad the node is there."""
    torch.manual_seed(1)
    layer = mt.GroupedLinear(3, 8, 6, params_dtype=torch.float32, device=device, packed=packed)
    x = torch.randn(11, 8, device=device)
    splits = torch.tensor([4, 0, 5], device=device)
    y = layer(x, splits)   # the weights require grad: recorded
    assert y.grad_fn is not None
    with torch.no_grad():
        y0 = layer(x, splits)
    assert y0.grad_fn is None and not y0.requires_grad and torch.equal(y0, y.detach())
    layer.requires_grad_(False)
    y1 = layer(x, splits)   # grad mode on, nothing requires grad
    assert y1.grad_fn is None and torch.equal(y1, y.detach())
    y2 = layer(x.requires_grad_(True), splits)
    assert y2.grad_fn is not None and torch.equal(y2.detach(), y.detach())
    y2.sum().backward()
    assert x.grad is not None and all(p.grad is None for p in layer.parameters())
