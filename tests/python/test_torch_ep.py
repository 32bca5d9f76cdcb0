"""moex.torch's expert parallelism (EPContext, ep_dispatch, ep_combine, MoELayer's ep_group): under
mpirun (moex's EP over MPI, the CPU backend), at 1, 2 and 3 ranks, and under torchrun (over NCCL,
one GPU a rank; where the machine has 2 GPUs or more), against the single-process layer on the
whole batch and the same math on each rank's tokens (tests/python/ep_worker.py, one process per
rank; skipped without mpirun and mpi4py, or the GPUs); and the arguments they refuse, in this
process."""
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import moex.torch as mt  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ep_worker.py")


def _have_mpi():
    if shutil.which("mpirun") is None:
        return False
    return subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _have_mpi(), reason="needs mpirun and mpi4py")
@pytest.mark.parametrize("ranks,extra", [(1, []), (2, []), (2, ["--dtype", "bf16"]), (2, ["--empty-rank"]),
                                         (3, []), (3, ["--empty-rank", "--dtype", "bf16"]), (2, ["--compile"]),
                                         (2, ["--fp8", "--dtype", "bf16", "--empty-rank"]), (3, ["--fp8"])])
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


def gpus(n):
    return pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < n, reason=f"needs {n} GPUs")


@pytest.mark.parametrize("ranks,extra,network", [
    pytest.param(2, [], False, marks=gpus(2)), pytest.param(2, ["--dtype", "bf16"], False, marks=gpus(2)),
    pytest.param(2, ["--empty-rank"], False, marks=gpus(2)),
    pytest.param(2, ["--tokens", "300", "--dtype", "bf16"], False, marks=gpus(2)),
    pytest.param(2, ["--transfer", "capacity"], False, marks=gpus(2)), pytest.param(2, ["--compile"], False, marks=gpus(2)),
    pytest.param(2, ["--transfer", "capacity", "--tokens", "300", "--empty-rank"], True, marks=gpus(2)),
    pytest.param(2, ["--graph"], False, marks=gpus(2)),
    pytest.param(2, ["--graph", "--transfer", "capacity", "--dtype", "bf16"], False, marks=gpus(2)),
    pytest.param(2, ["--fp8", "--dtype", "bf16", "--tokens", "300"], False, marks=gpus(2)),
    pytest.param(4, [], False, marks=gpus(4)),
    pytest.param(4, ["--transfer", "capacity", "--dtype", "bf16", "--empty-rank", "--tokens", "300"], False,
                 marks=gpus(4)),
    pytest.param(4, ["--graph", "--empty-rank"], False, marks=gpus(4))])
def test_ep_layer_over_nccl_matches_the_whole_layer(ranks, extra, network):
    """network: NCCL's peer-to-peer and shared-memory transports off, so that its send/recv (the
    CAPACITY exchange) take the network path they take between nodes."""
    env = dict(os.environ, NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1") if network else None
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), WORKER]
    run = subprocess.run(cmd + extra + ["--hang-s", "240"], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    transfer = extra[extra.index("--transfer") + 1] if "--transfer" in extra else ""   # (auto: either)
    assert f"ok: {ranks} ranks over NCCL ({transfer}" in run.stdout, run.stdout


def test_ep_group_arguments_refused():
    with pytest.raises(ValueError, match="torch.distributed process group .NCCL, CUDA tensors. or an mpi4py MPI.Comm"):
        mt.MoELayer(4, 8, 4, 2, ep_group=object(), ep_max_tokens=4)
    with pytest.raises(ValueError, match="ep_max_tokens"):
        mt.MoELayer(4, 8, 4, 2, ep_group=object())
    # not a group, whatever the device (the device rules of a real group: ep_worker.py's refusals)
    with pytest.raises(ValueError, match="CPU backend"):
        mt.MoELayer(4, 8, 4, 2, ep_group=object(), ep_max_tokens=4, device="cuda")
    with pytest.raises(ValueError, match="NCCL"):
        mt.EPContext(object(), 4, 2, 8, max_tokens=4, device="cuda")
    with pytest.raises(ValueError, match="transfer must be one of"):
        mt.MoELayer(4, 8, 4, 2, ep_group=object(), ep_max_tokens=4, ep_transfer="nvlink")
    with pytest.raises(ValueError, match="weight-gradient"):
        mt.MoELayer(4, 8, 4, 2, ep_group=object(), ep_max_tokens=4, fuse_wgrad_accumulation=True)
    with pytest.raises(ValueError, match="mpi4py MPI.Comm"):
        mt.EPContext(object(), 4, 2, 8, max_tokens=4)
    x, ids, probs = torch.randn(3, 8), torch.zeros(3, 2, dtype=torch.int64), torch.rand(3, 2)
    with pytest.raises(ValueError, match="EPContext"):
        mt.ep_dispatch(object(), x, ids, probs)
    with pytest.raises(ValueError, match="EPContext"):
        mt.ep_combine(object(), x, torch.zeros(8, dtype=torch.uint8), 3)
    from moex.torch import _ep   # the layer's operator names its context by id: a dead one is refused
    w1, w2 = torch.zeros(2, 8, 8), torch.zeros(2, 8, 4)
    with pytest.raises(ValueError, match="no live EPContext has id -1"):
        _ep._ep_moe_forward(x, torch.zeros(4, 8), w1, None, w2, None, -1, 2, 0, 1, 0, 0, 0, 7.0, 1.702, 1.0, 0, 0, False,
                            0.0)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_ep_group_of_another_backend_refused(tmp_path):
    """A gloo process group: moex's EP runs over NCCL (CUDA) or MPI (the CPU), so a ValueError
    naming the backend."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="backend is gloo"):
            mt.MoELayer(4, 8, 4, 2, ep_group=dist.group.WORLD, ep_max_tokens=4)
    finally:
        dist.destroy_process_group()
