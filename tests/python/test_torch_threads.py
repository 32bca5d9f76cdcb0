"""test_torch_threads.py - moex calls from threads with no current CUDA context (skipped without
CUDA). Each case runs in a fresh Python process, so that the thread under test has done no CUDA
work before the moex call:
- autograd's worker thread: GroupedLinear, gmm and GroupedMLP steps whose backward is the first
  CUDA work of that thread (`y.sum().backward()`: the sum's backward launches nothing);
- a new threading.Thread whose first CUDA work is a torch.ops.moex operator call (tensors made on
  the main thread; the operator's outputs are allocated by torch on that thread before moex
  runs, which may bind the context first: the autograd case above and the C tests' fresh-thread
  variants, tests/cuda/cuda_mirror.h, are the ones where moex's call is the very first).
Every call must succeed and match the same call made on the main thread bitwise (moex is
deterministic).
"""
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

_PRELUDE = textwrap.dedent("""
    import threading
    import torch
    import moex.torch as mt
    torch.manual_seed(0)
    dev = "cuda"
""")


def _run(body: str) -> str:
    proc = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def test_backward_on_autograd_thread():
    out = _run("""
        G, T, K, N = 8, 4096, 512, 1024
        fails = 0
        for step in range(12):
            layer = mt.GroupedLinear(G, K, N, bias=step % 2 == 0, params_dtype=torch.bfloat16, device=dev)
            x = torch.randn(T, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
            y = layer(x, [T // G] * G)
            y.float().sum().backward()    # the first CUDA work of autograd's device thread
            assert x.grad is not None and torch.isfinite(x.grad.float()).all()
            a = torch.randn(T, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
            b = torch.randn(G, K, N, device=dev, dtype=torch.bfloat16, requires_grad=True)
            mt.gmm(a, b, torch.full((G,), T // G, dtype=torch.int64)).sum().backward()
            assert torch.isfinite(b.grad.float()).all()
            mlp = mt.GroupedMLP(G, K, 256, params_dtype=torch.bfloat16, device=dev)
            probs = torch.rand(T, device=dev)
            mlp(x.detach().requires_grad_(), [T // G] * G, probs).sum().backward()
        torch.cuda.synchronize()
        print("ok", step + 1)
    """)
    assert "ok 12" in out


def test_ops_on_fresh_threads():
    out = _run("""
        G, T, K, N = 4, 1024, 256, 512
        dy = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
        x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(G, N, K, device=dev, dtype=torch.bfloat16)
        splits = torch.tensor([300, 0, 500, 224], device=dev)
        torch.cuda.synchronize()
        calls = {
            "dgrad": lambda: torch.ops.moex.grouped_linear_backward_data(dy, w, splits, None, None, 0, True, False,
                                                                         False)[0],
            "wgrad": lambda: torch.ops.moex.grouped_linear_backward_weight(x, dy, splits, 1),
            "forward": lambda: torch.ops.moex.grouped_linear_forward(x, w, splits, None, None, 0),
        }
        for name, call in calls.items():
            ref = call()
            torch.cuda.synchronize()
            for i in range(5):
                box = {}
                def body():
                    try:
                        box["out"] = call()
                        torch.cuda.synchronize()
                    except Exception as e:   # reported below
                        box["err"] = e
                t = threading.Thread(target=body)
                t.start()
                t.join()
                assert "err" not in box, f"{name} on a new thread: {box['err']}"
                assert torch.equal(box["out"], ref), f"{name} on a new thread differs"
        print("ok")
    """)
    assert "ok" in out
