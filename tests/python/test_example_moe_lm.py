"""test_example_moe_lm.py - the example examples/moe_lm on the CPU in f32, at a tiny size (a few
seconds): the plain PyTorch MoE layer of train.py (the loop over experts, and torch._grouped_mm
where torch has it on the CPU) against moex.torch.MoELayer on the same weights, forward and
gradients; 12 training steps of the language model with each layer: the same loss at every
step, and a loss that goes down; train_ep.py (expert parallelism, 2 ranks under mpirun) giving
train.py's losses; compare.py's judgement of several seeds (its f32 parity gate,
which a wrong layer fails, and its rule for the final losses against the seed spread), its
table, summary.json and plot from the runs' JSON.

Tolerances, f32 (unit roundoff u = 6e-8):
- one MoE layer: 1e-5 of the largest magnitude, forward and every gradient. The two compute
  the same sums (of H, F or T <= 64 terms) in other orders: at most about 64 u = 4e-6;
  measured 1e-7 to 4e-7.
- training: the loss of every step (and the validation loss) within 1e-5 relative. Measured
  at most 1.2e-7 (2 ulps) over the 12 steps; training amplifies differences, so the margin
  is 80x. A wrong MoE (the GLU's halves swapped, p not applied, no renormalisation) moves
  the loss by 5e-5 to 2e-3 relative at every step from the second on (measured).
"""
import argparse
import functools
import importlib.util
import json
import math
import os
import random
import re
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET

import pytest

torch = pytest.importorskip("torch")

import moex.torch as mt  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "moe_lm")
_spec = importlib.util.spec_from_file_location("moe_lm_train", os.path.join(EXAMPLE, "train.py"))
lm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lm)
_spec = importlib.util.spec_from_file_location("moe_lm_compare", os.path.join(EXAMPLE, "compare.py"))
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)

TINY = ("--device cpu --hidden 32 --heads 2 --layers 2 --experts 4 --topk 2 --ffn 32 --seq 32 "
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
def run(variant, seed=0, dtype="f32"):
    return lm.train(lm.parse_args(TINY + ["--moe", variant, "--seed", str(seed), "--dtype", dtype]))


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
def test_fp8_variant_trains_near_moex():
    """moex_fp8 (fp8_recipe="block", the weights' copies made once per forward): the loss goes
    down as moex's does, within FP8's rounding of it (a few percent at this size) and not equal
    to it (the recipe ran)."""
    got, want = run("moex_fp8"), run("moex")
    assert len(got["train_loss"]) == 12 and got["train_loss"][-1] < got["train_loss"][0]
    rel = [abs(a - b) / b for a, b in zip(got["train_loss"], want["train_loss"])]
    assert max(rel) < 0.05, f"moex_fp8's loss {max(rel):.3g} from moex's (relative)"
    assert max(rel[1:]) > 1e-6, "moex_fp8 trains exactly as moex: the FP8 recipe did not take effect"


def _have_mpi():
    import shutil
    if shutil.which("mpirun") is None:
        return False
    return subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True).returncode == 0


@needs_text
@pytest.mark.skipif(not _have_mpi(), reason="needs mpirun and mpi4py")
@pytest.mark.parametrize("variant", ["moex", "torch"])
def test_expert_parallel_training_matches_one_process(variant, tmp_path):
    """train_ep.py under mpirun on 2 ranks (moex's EP over MPI, or the all-to-all EP layer over
    gloo; the replicated gradients averaged over gloo) gives train.py's losses on the whole batch:
    the same tolerance as above (measured 1.4e-7)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1",
               MOEX_EP_PORT=str(29600 + (os.getpid() + (variant == "torch")) % 300))
    cmd = ["mpirun", "-np", "2"]
    if "Open MPI" in subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout:
        cmd += ["--oversubscribe", "--bind-to", "none"]
    out = tmp_path / "ep.json"
    run_ep = subprocess.run(cmd + [sys.executable, os.path.join(EXAMPLE, "train_ep.py"), "--moe", variant] + TINY +
                            ["--out", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert run_ep.returncode == 0, run_ep.stdout[-3000:] + run_ep.stderr[-3000:]
    got, want = json.loads(out.read_text()), run("torch")
    assert got["world"] == 2 and len(got["train_loss"]) == 12
    for step, (a, b) in enumerate(zip(got["train_loss"], want["train_loss"])):
        assert abs(a - b) <= 1e-5 * b, f"step {step}: EP {variant} loss {a}, one process {b}"
    for (step, a), (_, b) in zip(got["val_loss"], want["val_loss"]):
        assert abs(a - b) <= 1e-5 * b, f"validation at step {step}: EP {variant} {a}, one process {b}"


@needs_text
@pytest.mark.skipif(not _have_mpi(), reason="needs mpirun and mpi4py")
def test_compare_trains_and_judges_expert_parallelism(tmp_path):
    """compare.py --variants moex,ep_moex on the CPU: ep_moex (train_ep.py on 2 ranks under
    mpirun) judged against moex's one-process runs: f32 parity for each seed (the same losses to
    rounding), the final losses within the spread, all checks passed."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1",
               MOEX_EP_PORT=str(29300 + os.getpid() % 200))
    res = subprocess.run([sys.executable, os.path.join(EXAMPLE, "compare.py"), "--out-dir", str(tmp_path),
                          "--variants", "moex,ep_moex", "--seeds", "0,1", "--ep-ranks", "2"] + TINY,
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    parity = summary["checks"]["parity"]
    assert [(p["variant"], p["reference"], p["seed"]) for p in parity] == [("ep_moex", "moex", 0),
                                                                            ("ep_moex", "moex", 1)], parity
    assert all(p["ok"] and p["max_rel_diff"] <= 1e-5 for p in parity), parity
    spread = summary["checks"]["spread"]
    assert {(c["variant"], c["metric"]) for c in spread} == {("ep_moex", "train"), ("ep_moex", "val")}
    assert all(c["judged"] and c["ok"] for c in spread), spread
    assert json.loads((tmp_path / "ep_moex_f32_seed1.json").read_text())["world"] == 2
    assert "f32 parity (ep_moex and moex" in res.stdout and "all checks passed" in res.stdout


@needs_text
def test_loss_goes_down():
    r = run("moex")
    loss, uniform = r["train_loss"], math.log(256)
    assert abs(loss[0] - uniform) < 0.05, "the untrained model should predict about uniformly"
    assert max(loss[-3:]) < uniform - 1.0, loss
    assert r["val_loss"][-1][1] < r["val_loss"][0][1] < uniform - 0.5, r["val_loss"]
    assert r["ms_per_step"] > 0 and r["timed_steps"] == 10


def write_runs(path, seeds, dtypes):
    """The tiny runs of moex and torch for every seed and dtype, as compare.py names them."""
    for seed in seeds:
        for dtype in dtypes:
            for v in ("moex", "torch"):
                (path / f"{compare.run_name(v, dtype, seed)}.json").write_text(json.dumps(run(v, seed, dtype)))


def run_compare(path, seeds, dtypes):
    return subprocess.run([sys.executable, os.path.join(EXAMPLE, "compare.py"), "--read", "--out-dir", str(path),
                           "--variants", "moex,torch", "--seeds", seeds, "--dtypes", dtypes],
                          capture_output=True, text=True)


@needs_text
def test_compare_judges_the_seeds(tmp_path):
    write_runs(tmp_path, (0, 1), ("f32", "bf16"))
    res = run_compare(tmp_path, "0,1", "f32,bf16")
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    window = summary["window"]
    assert window == 11   # the 12 steps' largest odd window
    groups = {(g["variant"], g["dtype"]): g for g in summary["groups"]}
    assert set(groups) == {(v, d) for v in ("moex", "torch") for d in ("f32", "bf16")}
    for (v, d), g in groups.items():
        finals = [sum(run(v, s, d)["train_loss"][-window:]) / window for s in (0, 1)]
        vals = [run(v, s, d)["val_loss"][-1][1] for s in (0, 1)]
        assert g["seeds"] == [0, 1]
        assert g["train"]["per_seed"] == pytest.approx(finals, rel=1e-12)
        assert g["train"]["mean"] == pytest.approx(sum(finals) / 2, rel=1e-12)
        assert (g["train"]["min"], g["train"]["max"]) == (min(finals), max(finals))
        assert g["val"]["per_seed"] == vals
        assert g["ms_per_step"] > 0
    # the two seeds start from other weights and see other batches: a spread to judge by
    assert groups[("torch", "f32")]["train"]["std"] > 0
    parity = summary["checks"]["parity"]
    assert [p["seed"] for p in parity] == [0, 1]
    assert all(p["ok"] and p["max_rel_diff"] <= 1e-5 and p["steps"] == 10 for p in parity), parity
    spread = {(c["dtype"], c["metric"]): c for c in summary["checks"]["spread"]}
    assert set(spread) == {(d, m) for d in ("f32", "bf16") for m in ("train", "val")}
    for (d, m), c in spread.items():
        a = [run("moex", s, d)["train_loss" if m == "train" else "val_loss"] for s in (0, 1)]
        a = [sum(x[-window:]) / window if m == "train" else x[-1][1] for x in a]
        assert c["judged"] and c["ok"] and c["diff"] == pytest.approx(
            sum(a) / 2 - groups[("torch", d)][m]["mean"], abs=1e-12), c
    rows = [line.split() for line in res.stdout.splitlines() if line.split()[:1] in (["moex"], ["torch"])]
    assert [r[:3] for r in rows] == [["moex", "f32", "2"], ["torch", "f32", "2"], ["moex", "bf16", "2"],
                                     ["torch", "bf16", "2"]]
    assert "all checks passed" in res.stdout
    svg = ET.parse(tmp_path / "loss.svg").getroot()
    assert len(svg.findall("{http://www.w3.org/2000/svg}polyline")) == 2 * 8  # per run: train average, validation


@needs_text
def test_compare_fails_a_wrong_layer_on_f32_parity(tmp_path):
    """moex's f32 losses of seed 1 moved by 5e-5 relative from the second step on, as a wrong
    layer moves them (the smallest such move measured): the gate fails and names the seed."""
    write_runs(tmp_path, (0, 1), ("f32",))
    path = tmp_path / f"{compare.run_name('moex', 'f32', 1)}.json"
    r = json.loads(path.read_text())
    r["train_loss"] = r["train_loss"][:1] + [x * (1 + 5e-5) for x in r["train_loss"][1:]]
    path.write_text(json.dumps(r))
    res = run_compare(tmp_path, "0,1", "f32")
    assert res.returncode == 1, res.stdout + res.stderr
    assert re.search(r"seed 0: max \S+ \(step \d+\)  ok", res.stdout), res.stdout
    assert re.search(r"seed 1: max 5\.0e-05 \(step \d+\)  FAIL", res.stdout), res.stdout
    assert "A CHECK FAILED" in res.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert not summary["ok"] and [p["ok"] for p in summary["checks"]["parity"]] == [True, False]


def test_spread_rule():
    """against_spread: the two-sample t rule at 1%, by hand and by its false-alarm rate."""
    a, b = [1.0, 1.1, 1.2], [1.05, 1.15, 1.25]          # pooled std 0.1, 4 degrees of freedom
    res = compare.against_spread(a, b)
    assert res["diff"] == pytest.approx(-0.05) and res["pooled_std"] == pytest.approx(0.1)
    assert res["t"] == 4.604 and res["allowed"] == pytest.approx(4.604 * 0.1 * math.sqrt(2 / 3))
    assert res["ok"]
    assert not compare.against_spread([x + 0.5 for x in a], b)["ok"]        # 0.45 > 0.376
    assert compare.against_spread([1.0], b) is None                         # no spread on one side
    assert compare.t99(23) == compare.T99[22] and compare.t99(31) == 2.576  # conservative between entries
    # the rule's false alarms when both sides are one distribution: 1% (normal final losses)
    rng = random.Random(0)
    for n in (2, 4):
        trials = 20000
        fails = sum(not compare.against_spread([rng.gauss(0, 1) for _ in range(n)],
                                               [rng.gauss(0, 1) for _ in range(n)])["ok"] for _ in range(trials))
        assert 0.006 < fails / trials < 0.014, (n, fails / trials)


def test_flatness_and_finals():
    r = {"train_loss": [5.0] * 80 + [3.0] * 10 + [2.0] * 10, "val_loss": [[50, 4.0], [100, 3.5]]}
    assert compare.tail_drop(r) == pytest.approx(-1.0)      # the last 10 steps against the 10 before
    assert compare.final_train(r, 21) == pytest.approx((5.0 + 3.0 * 10 + 2.0 * 10) / 21)
    assert compare.tail_drop({"train_loss": [2.0] * 100}) == 0.0


def test_train_all_spreads_the_seeds_over_the_gpus(tmp_path, monkeypatch):
    """compare.py --gpus N: every (variant, dtype, seed) run once, seed i on the i mod N-th GPU
    of CUDA_VISIBLE_DEVICES, a GPU's runs one after the other in seed order; a failed run
    raises; more GPUs than are visible is refused."""
    calls, lock = [], threading.Lock()

    def fake_run(cmd, check, env):
        with lock:
            calls.append((env["CUDA_VISIBLE_DEVICES"], cmd[cmd.index("--seed") + 1], cmd[cmd.index("--moe") + 1],
                          cmd[cmd.index("--dtype") + 1]))
        if cmd[cmd.index("--seed") + 1] == "13":
            raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(compare.subprocess, "run", fake_run)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,9")
    args = argparse.Namespace(gpus=2, out_dir=str(tmp_path), device="cuda")
    compare.train_all(args, [0, 1, 2, 3, 4], ["f32", "bf16"], ["moex", "torch"], [])
    assert sorted(c[1:] for c in calls) == sorted((str(s), v, d) for s in range(5) for v in ("moex", "torch")
                                                 for d in ("f32", "bf16"))
    for gpu, seeds in (("5", ["0", "2", "4"]), ("7", ["1", "3"])):
        mine = [c[1] for c in calls if c[0] == gpu]
        assert mine == [s for s in seeds for _ in range(4)], (gpu, mine)
    assert {c[0] for c in calls} == {"5", "7"}
    calls.clear()
    with pytest.raises(subprocess.CalledProcessError):
        compare.train_all(args, [12, 13], ["f32"], ["moex"], [])
    with pytest.raises(ValueError, match="names 3"):
        compare.visible_gpus(4)
