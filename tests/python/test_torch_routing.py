"""test_torch_routing.py - moex.torch.router, permute and unpermute against plain PyTorch
(softmax or sigmoid and topk, renormalised or not; bincount, gathers and sums), forward and
backward, on the CPU and, where there is a GPU, on CUDA. f32 throughout: 1e-5."""
import pytest

torch = pytest.importorskip("torch")

import moex.torch as mt  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
T, E, K, H = 37, 8, 3, 5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("score,renorm", [("softmax", True), ("softmax", False), ("sigmoid", True),
                                          ("sigmoid", False)])
def test_router(device, score, renorm):
    torch.manual_seed(4)
    logits = torch.randn(T, E, device=device, requires_grad=True)
    probs, ids = mt.router(logits, K, score, renorm)
    s = torch.softmax(logits, 1) if score == "softmax" else torch.sigmoid(logits)
    q, want_ids = s.topk(K, dim=1)
    want = q / q.sum(1, keepdim=True) if renorm else q
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(probs, want, rtol=1e-5, atol=1e-6)
    dp = torch.randn(T, K, device=device)
    (got,) = torch.autograd.grad(probs, [logits], dp)
    (ref,) = torch.autograd.grad(want, [logits], dp)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_permute_and_unpermute(device):
    torch.manual_seed(5)
    x = torch.randn(T, H, device=device)
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).to(device, torch.int32)
    probs = torch.rand(T, K, device=device)
    xp, probs_p, splits, row_map = mt.permute(x, ids, probs, E)
    assert torch.equal(splits, torch.bincount(ids.flatten().long(), minlength=E))
    assert row_map.shape == (T, K)   # row_map[t, j]: the row of token t's j-th expert
    rm = row_map.long().flatten()
    assert torch.equal(torch.sort(rm).values, torch.arange(T * K, device=device))   # a permutation
    assert torch.equal(xp[rm], x.repeat_interleave(K, dim=0))
    assert torch.equal(probs_p[rm], probs.flatten())
    expert_of_row = torch.repeat_interleave(torch.arange(E, device=device), splits)
    assert torch.equal(expert_of_row[rm], ids.flatten().long())   # rows sorted by expert
    y = mt.unpermute(xp, row_map, K)
    torch.testing.assert_close(y, K * x)


@pytest.mark.filterwarnings("ignore:Input #")
def test_gradcheck():
    torch.manual_seed(6)
    x = torch.randn(6, 3, requires_grad=True)
    ids = torch.tensor([[0, 2], [1, 0], [2, 1], [0, 1], [2, 0], [1, 2]], dtype=torch.int32)
    probs = torch.rand(6, 2, requires_grad=True)

    def fn(x, probs):
        xp, pp, _, rm = mt.permute(x, ids, probs, 3)
        return mt.unpermute(xp * pp[:, None], rm, 2)

    assert torch.autograd.gradcheck(fn, (x, probs), eps=1e-2, atol=1e-3,
                                    rtol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch.manual_seed(7)
    logits = torch.randn(T, E, device=device, requires_grad=True)
    x = torch.randn(T, H, device=device, requires_grad=True)

    def step(logits, x):
        probs, ids = mt.router(logits, K)
        xp, pp, _, rm = mt.permute(x, ids, probs, E)
        return (mt.unpermute(xp * pp[:, None], rm, K) ** 2).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(logits, x), [logits, x])
    want = torch.autograd.grad(step(logits, x), [logits, x])
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


def test_errors():
    with pytest.raises(ValueError, match="score must be"):
        mt.router(torch.randn(3, 4), 2, "relu")
    with pytest.raises(ValueError, match="ids is torch.int64"):
        mt.permute(torch.randn(3, 4), torch.zeros(3, 2, dtype=torch.int64), torch.rand(3, 2), 4)
