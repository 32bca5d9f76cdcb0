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
import threading

import pytest

torch = pytest.importorskip("torch")

import moex  # noqa: E402
import moex._torch_ext as ext  # noqa: E402
import moex.torch as mt  # noqa: E402

# The operators each migration step moved to C++ (python/csrc).
GROUPED_LINEAR_OPS = ["grouped_linear_forward", "grouped_linear_backward_data", "grouped_linear_backward_weight",
                      "grouped_linear_backward_weight_accumulate"]
CPP_OPS = GROUPED_LINEAR_OPS

_INSTALLED = os.path.isdir(os.path.join(os.path.dirname(moex.__file__), "lib"))
if ext.PATH is None and (not _INSTALLED or os.environ.get("MOEX_TORCH_EXTENSION") == "0"):
    pytest.skip(f"the PyTorch extension is not loaded ({ext.LOAD_ERROR})", allow_module_level=True)


def test_extension_is_loaded_and_defines_the_operators():
    assert ext.PATH is not None, f"the installed package has no working PyTorch extension: {ext.LOAD_ERROR}"
    assert set(CPP_OPS) <= ext.OPS
    for name in CPP_OPS:
        assert isinstance(getattr(mt, {"grouped_linear_forward": "_forward",
                                       "grouped_linear_backward_data": "_backward_data",
                                       "grouped_linear_backward_weight": "_backward_weight",
                                       "grouped_linear_backward_weight_accumulate": "_backward_weight_accumulate"}
                               [name]), mt._CppOperator)
        # the dispatcher's registrations: schema, CPU and CUDA kernels from python/csrc
        dump = torch._C._dispatch_dump(f"moex::{name}")
        for key, source in (("debug", "schemas.cpp"), ("CPU", "kernels.cpp"), ("CUDA", "kernels.cpp")):
            line = next(ln for ln in dump.splitlines() if ln.startswith(key + ":"))
            assert source in line, f"moex::{name} {key}: {line}"
    dump = torch._C._dispatch_dump("moex::grouped_linear_forward")
    assert "autograd.cpp" in next(ln for ln in dump.splitlines() if ln.startswith("Autograd"))


def inputs(T=13, K=24, N=16, splits=(3, 0, 7, 2), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(dtype)
    w = (0.2 * torch.randn(len(splits), N, K, generator=g)).to(dtype)
    b = torch.randn(len(splits), N, generator=g).to(dtype)
    p = torch.rand(T, generator=g)
    return x, w, torch.tensor(splits), b, p


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_operators_match_the_python_implementation_bitwise(dtype, mode):
    """Each C++ kernel against its Python implementation over ctypes (_CppOperator.impl)."""
    x, w, splits, b, p = inputs(dtype=dtype)
    n = int(splits.sum())
    bias, probs = (b if mode else None), (p if mode == 2 else None)
    args = (x, w, splits, bias, probs, mode)
    y = mt._forward(*args)
    assert torch.equal(y, mt._forward.impl(*args)) and torch.count_nonzero(y[n:]) == 0   # zero tail

    dy = torch.randn_like(y)
    args = (dy, w, splits, bias, probs, mode, True, mode != 0, mode == 2)
    for got, want in zip(mt._backward_data(*args), mt._backward_data.impl(*args)):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got, want)

    code = 0 if dtype == torch.float32 else 1
    assert torch.equal(mt._backward_weight(x, dy, splits, code), mt._backward_weight.impl(x, dy, splits, code))
    main, main_py = torch.ones(4, 16, 24), torch.ones(4, 16, 24)
    mt._backward_weight_accumulate(x, dy, splits, main)
    mt._backward_weight_accumulate.impl(x, dy, splits, main_py)
    assert torch.equal(main, main_py) and not torch.equal(main, torch.ones(4, 16, 24))


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
    dx, dbias, dprobs = mt._backward_data.impl(dy, w, splits, b if mode else None, p if mode == 2 else None, mode, True,
                                               mode != 0, mode == 2)
    want = {"x": dx, "w": mt._backward_weight.impl(x, dy, splits, 0), "bias": dbias, "probs": dprobs}
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
    want = [mt._forward.impl(x, w, s, None, None, 0) for x, w, s, _, _ in cases]
    got, errors = [[] for _ in cases], []

    def work(i):
        try:
            x, w, s, _, _ = cases[i]
            for _ in range(50):
                got[i].append(mt._forward(x, w, s, None, None, 0))
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
