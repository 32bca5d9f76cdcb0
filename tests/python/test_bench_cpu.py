"""The Python benchmarks' moex functions, run once on the CPU: CI has no GPU to run the
benchmarks, so this keeps their calls into moex.torch in step with the package (a renamed or
moved function fails here, not on the GPU machine)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
mlp_bench = pytest.importorskip("mlp_bench")


def test_mlp_bench_moex_functions_run_on_cpu():
    d = mlp_bench.make_inputs(4, 64, 32, 16, "skewed", dev="cpu")
    grads = mlp_bench.step_fns(d, None)["moex"]()
    assert len(grads) == len(mlp_bench.LEAVES) and all(torch.isfinite(g).all() for g in grads)
    for name, fn in mlp_bench.gemm_fns(d).items():
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        assert torch.isfinite(out).all(), name


def test_mlp_bench_fp8_functions_run_on_cpu():
    """--fp8 block with --fp8-kept: the per-call and the kept-copies steps compute the same."""
    d = mlp_bench.make_inputs(4, 64, 32, 16, "skewed", dev="cpu")
    steps, ys = mlp_bench.fp8_fns(d, ["block"], kept=True)
    torch.testing.assert_close(ys["block-kept"](), ys["block"](), rtol=0, atol=0)
    for a, b in zip(steps["fp8_block-kept"](), steps["fp8_block"]()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
