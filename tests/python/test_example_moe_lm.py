"""test_example_moe_lm.py - the example examples/moe_lm on the CPU in f32, at a tiny size (a few
seconds): the plain PyTorch MoE layer of train.py (the loop over experts, and torch._grouped_mm
where torch has it on the CPU) against moex.torch.MoELayer on the same weights, forward and
gradients; 12 training steps of the language model with each layer: the same loss at every
step, and a loss that goes down; compare.py's table and plot from the runs' JSON.

Tolerances, f32 (unit roundoff u = 6e-8):
- one MoE layer: 1e-5 of the largest magnitude, forward and every gradient. The two compute
  the same sums (of H, F or T <= 64 terms) in other orders: at most about 64 u = 4e-6;
  measured 1e-7 to 4e-7.
- training: the loss of every step (and the validation loss) within 1e-5 relative. Measured
  at most 1.2e-7 (2 ulps) over the 12 steps; training amplifies differences, so the margin
  is 80x. A wrong MoE (the GLU's halves swapped, p not applied, no renormalisation) moves
  the loss by 5e-5 to 2e-3 relative at every step from the second on (measured).
"""
import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

torch = pytest.importorskip("torch")

import moex.torch as mt  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "moe_lm")
_spec = importlib.util.spec_from_file_location("moe_lm_train", os.path.join(EXAMPLE, "train.py"))
lm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lm)

TINY = ("--device cpu --dtype f32 --hidden 32 --heads 2 --layers 2 --experts 4 --topk 2 --ffn 32 --seq 32 "
        "--batch 8 --steps 12 --eval-every 6 --warmup 2 --lr 1e-2").split()
needs_text = pytest.mark.skipif(not os.path.isdir(lm.TEXT_DIR), reason=f"no {lm.TEXT_DIR} (Debian's base-files)")


def grouped_mm_on_cpu():
    """Whether this torch has torch._grouped_mm on the CPU in f32, with its backward."""
    try:
        w = torch.zeros(2, 8, 4, requires_grad=True)
        y = torch._grouped_mm(torch.zeros(8, 4), w.transpose(-2, -1), offs=torch.tensor([3, 8], dtype=torch.int32))
        y.backward(torch.ones_like(y))
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


GMM = pytest.param("torch_gmm", marks=pytest.mark.skipif(
    not grouped_mm_on_cpu(), reason="torch._grouped_mm does not run on the CPU in this torch"))


@functools.lru_cache(maxsize=None)
def run(variant):
    return lm.train(lm.parse_args(TINY + ["--moe", variant]))


@pytest.mark.parametrize("variant", ["torch", GMM])
def test_plain_pytorch_moe_equals_moe_layer(variant):
    E, H, F, k = 4, 32, 32, 2
    torch.manual_seed(0)
    layer = mt.MoELayer(E, H, F, k, score="softmax", renorm=True,
                        init_method=lambda t: torch.nn.init.normal_(t, std=0.3))
    plain = lm.TorchMoE(E, H, F, k, grouped=variant == "torch_gmm")
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 32, H, requires_grad=True)
    y, want = layer(x), plain(x)
    m = want.abs().max()
    torch.testing.assert_close(y / m, want / m, rtol=0, atol=1e-5)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, layer.router_w, layer.w1, layer.w2], dy)
    ref = torch.autograd.grad(want, [x, plain.router_w, plain.w1, plain.w2], dy)
    for name, a, b in zip(("x", "router_w", "w1", "w2"), got, ref):
        s = b.abs().max()
        torch.testing.assert_close(a / s, b / s, rtol=0, atol=1e-5, msg=lambda msg, name=name: f"d{name}: {msg}")


@needs_text
@pytest.mark.parametrize("variant", ["moex", GMM])
def test_training_matches_plain_pytorch(variant):
    got, want = run(variant), run("torch")
    assert len(got["train_loss"]) == 12
    for step, (a, b) in enumerate(zip(got["train_loss"], want["train_loss"])):
        assert abs(a - b) <= 1e-5 * b, f"step {step}: {variant} loss {a}, torch {b}"
    assert [s for s, _ in got["val_loss"]] == [6, 12]
    for (step, a), (_, b) in zip(got["val_loss"], want["val_loss"]):
        assert abs(a - b) <= 1e-5 * b, f"validation at step {step}: {variant} {a}, torch {b}"


@needs_text
def test_loss_goes_down():
    r = run("moex")
    loss, uniform = r["train_loss"], math.log(256)
    assert abs(loss[0] - uniform) < 0.05, "the untrained model should predict about uniformly"
    assert max(loss[-3:]) < uniform - 1.0, loss
    assert r["val_loss"][-1][1] < r["val_loss"][0][1] < uniform - 0.5, r["val_loss"]
    assert r["ms_per_step"] > 0 and r["timed_steps"] == 10


@needs_text
def test_compare_reads_the_runs(tmp_path):
    for v in ("moex", "torch"):
        (tmp_path / f"{v}.json").write_text(json.dumps(run(v)))
    out = subprocess.run([sys.executable, os.path.join(EXAMPLE, "compare.py"), "--read", "--out-dir", str(tmp_path),
                          "--variants", "moex,torch"], check=True, capture_output=True, text=True).stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["moex"], ["torch"])}
    assert float(rows["moex"][1]) == pytest.approx(float(rows["torch"][1]), abs=1e-3)
    assert rows["moex"][4].endswith("x") and float(rows["moex"][5]) < 1e-4
    svg = ET.parse(tmp_path / "loss.svg").getroot()
    assert len(svg.findall("{http://www.w3.org/2000/svg}polyline")) == 6  # per run: every step, average, validation
