"""moex.torch's expert parallelism (EPContext, ep_dispatch, ep_combine, MoELayer's ep_group: moex's
EP over MPI, the CPU backend): under mpirun, at 1, 2 and 3 ranks, against the single-process layer
on the whole batch and the same math on each rank's tokens (tests/python/ep_mpi_worker.py, one
process per rank; skipped without mpirun or mpi4py); and the arguments they refuse, in this
process."""
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import moex.torch as mt  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ep_mpi_worker.py")


def _have_mpi():
    if shutil.which("mpirun") is None:
        return False
    return subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _have_mpi(), reason="needs mpirun and mpi4py")
@pytest.mark.parametrize("ranks,extra", [(1, []), (2, []), (2, ["--dtype", "bf16"]), (2, ["--empty-rank"]),
                                         (3, []), (3, ["--empty-rank", "--dtype", "bf16"])])
def test_ep_layer_matches_the_whole_layer(ranks, extra):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = ["mpirun", "-np", str(ranks)]
    if "Open MPI" in subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout:
        cmd += ["--oversubscribe", "--bind-to", "none"]
    run = subprocess.run(cmd + [sys.executable, WORKER] + extra, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.startswith("ok:"), run.stdout


def test_ep_group_arguments_refused():
    with pytest.raises(ValueError, match="mpi4py MPI.Comm"):
        mt.MoELayer(4, 8, 4, 2, ep_group=object(), ep_max_tokens=4)
    with pytest.raises(ValueError, match="ep_max_tokens"):
        mt.MoELayer(4, 8, 4, 2, ep_group=object())
    with pytest.raises(ValueError, match="CPU backend"):
        mt.MoELayer(4, 8, 4, 2, ep_group=object(), ep_max_tokens=4, device="cuda")
    with pytest.raises(ValueError, match="fp8_recipe"):
        mt.MoELayer(4, 8, 4, 2, ep_group=object(), ep_max_tokens=4, fp8_recipe="block")
    with pytest.raises(ValueError, match="mpi4py MPI.Comm"):
        mt.EPContext(object(), 4, 2, 8, max_tokens=4)
    x, ids, probs = torch.randn(3, 8), torch.zeros(3, 2, dtype=torch.int64), torch.rand(3, 2)
    with pytest.raises(ValueError, match="EPContext"):
        mt.ep_dispatch(object(), x, ids, probs)
    with pytest.raises(ValueError, match="EPContext"):
        mt.ep_combine(object(), x, torch.zeros(8, dtype=torch.uint8), 3)
