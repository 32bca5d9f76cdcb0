"""test_torch_glu_offsets.py - moex.torch.scaled_glu against the GLU written out in PyTorch
(both kinds and layouts, with and without probs and splits; forward and autograd), and
moex.torch.splits_to_offsets against torch.cumsum, on the CPU and, where there is a GPU, on
CUDA. f32: 1e-5."""
import pytest

torch = pytest.importorskip("torch")

import moex.torch as mt  # noqa: E402
from test_torch_grouped_mlp import glu_ref  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["swiglu", "clamped_swiglu"])
@pytest.mark.parametrize("layout", ["contiguous", "interleaved_32"])
@pytest.mark.parametrize("with_probs", [False, True])
def test_scaled_glu(device, kind, layout, with_probs):
    torch.manual_seed(8)
    T, F = 21, 64
    h = (3 * torch.randn(T, 2 * F, device=device)).requires_grad_(True)   # reaches the clamp
    p = torch.rand(T, device=device, requires_grad=True) if with_probs else None
    z = mt.scaled_glu(h, p, glu=kind, layout=layout)
    want = glu_ref(h, kind, layout, p)
    torch.testing.assert_close(z, want, rtol=1e-5, atol=1e-5)
    leaves = [h] + ([p] if with_probs else [])
    dz = torch.randn_like(z)
    got = torch.autograd.grad(z, leaves, dz)
    ref = torch.autograd.grad(want, leaves, dz)
    for a, e in zip(got, ref):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_scaled_glu_rows_of_the_splits(device):
    h = torch.randn(10, 8, device=device)
    z = mt.scaled_glu(h, splits=[3, 0, 4])
    torch.testing.assert_close(z[:7], glu_ref(h, "swiglu", "contiguous", None)[:7])


@pytest.mark.parametrize("device", DEVICES)
def test_splits_to_offsets(device):
    s = torch.tensor([3, 0, 5, 1], device=device)
    c = torch.cumsum(s, 0)
    assert torch.equal(mt.splits_to_offsets(s), torch.cat([c.new_zeros(1), c]))
    got = mt.splits_to_offsets(s, stride=7, leading_zero=False, dtype=torch.int32)
    assert got.dtype == torch.int32 and torch.equal(got.long(), 7 * c)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    h = torch.randn(6, 64, device=device, requires_grad=True)
    p = torch.rand(6, device=device)

    def step(h):
        return (mt.scaled_glu(h, p, layout="interleaved_32") ** 2).sum() + mt.splits_to_offsets(
            torch.tensor([2, 4], device=device))[-1]

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    (got,) = torch.autograd.grad(compiled(h), [h])
    (want,) = torch.autograd.grad(step(h), [h])
    torch.testing.assert_close(got, want)


def test_errors():
    with pytest.raises(ValueError, match="glu must be"):
        mt.scaled_glu(torch.randn(2, 4), glu="gelu")
    with pytest.raises(ValueError, match="dtype must be"):
        mt.splits_to_offsets(torch.tensor([1, 2]), dtype=torch.int16)
    with pytest.raises(ValueError, match="splits must be a 1-D int64 or int32"):
        mt.splits_to_offsets(torch.tensor([1, 2], dtype=torch.int16))
    assert torch.equal(mt.splits_to_offsets(torch.tensor([1, 2], dtype=torch.int32)), torch.tensor([0, 1, 3]))
