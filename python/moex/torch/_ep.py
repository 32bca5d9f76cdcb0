"""moex.torch._ep - expert parallelism for MoELayer(ep_group=...): moex's EP context over the
group's communicator (_EPContext) and the EP MoE layer's autograd (_EPMoE: moex_ep_moe_layer_forward
and _backward, docs/ops.md section 10).

Today the group is an MPI communicator (an mpi4py MPI.Comm) and the layer runs on the CPU
backend; CUDA (NCCL, from a torch.distributed process group) is refused with a ValueError. Every
rank of the group makes the same calls: the forward, and the backward of what it returns (the
EP steps are collective; moex refuses a step one rank gets wrong on every rank).
"""
import sys
from typing import Optional

import torch
from torch import Tensor

from .. import _capi
from .._capi import BIAS_NONE, GRAD_WRITE
from ._moe import _moe_args, _moe_backward_outputs, _shape_view
from ._operators import _DTYPES, _fill, _run, _view


def _mpi_comm_address(group) -> int:
    """The address of the MPI_Comm inside an mpi4py communicator; ValueError for anything else.
    (mpi4py is not imported here: importing it initialises MPI; a communicator means it is.)"""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not isinstance(group, MPI.Comm):
        raise ValueError(f"moex.torch.MoELayer: ep_group must be an mpi4py MPI.Comm (moex's EP on the CPU backend "
                         f"runs over MPI), got {type(group).__name__}; torch.distributed process groups (NCCL on "
                         f"CUDA) are not supported yet")
    return MPI._addressof(group)


class _EPContext:
    """A moex EP context (moex_ep) of one layer's shapes over the group's communicator, created
    at construction (collective: every rank constructs the layer with the same arguments) and
    destroyed with the layer. Keeps the group alive: moex uses its communicator."""

    def __init__(self, group, num_experts: int, topk: int, hidden: int, dtype: torch.dtype, max_tokens: int,
                 max_recv_rows: int):
        self.group = group
        cfg = _capi.EpConfig(comm_kind=_capi.EP_COMM_MPI, comm=_mpi_comm_address(group), num_experts=num_experts,
                             topk=topk, hidden=hidden, dtype=_DTYPES[dtype], max_tokens=max_tokens,
                             max_recv_rows=max_recv_rows, transfer=_capi.EP_TRANSFER_AUTO)
        self.ctx = _capi.context(_capi.BACKEND_CPU, 0)
        self.handle = _capi.ep_create(self.ctx, cfg)
        info = _capi.ep_info(self.ctx, self.handle)
        self.rank, self.world, self.local_experts = info.rank, info.world, info.local_experts
        self.max_tokens = max_tokens

    def __del__(self):
        MPI = sys.modules.get("mpi4py.MPI")
        if MPI is not None and MPI.Is_finalized():
            return   # (the process is ending; moex_ep_destroy frees an MPI datatype: not after MPI_Finalize)
        _capi.ep_destroy(getattr(self, "handle", None))


def _ep_args(ep: _EPContext, x, router_w, w1, b1, w2, b2, options, saved, y, view=_view):
    """The EP MoE layer's arguments (options: MoELayer.options; no FP8 recipe)."""
    topk, score, norm, b2_mode, *glu = options
    layer = _moe_args(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, tuple(glu), saved, y,
                      (0, 0, False, 0.0), view=view)
    return _capi.EpMoeLayerArgs(ep=ep.handle, layer=layer)


class _EPMoE(torch.autograd.Function):
    """y = the EP MoE layer of this rank's tokens x (router_w [E, H] whole on every rank, w1, b1,
    w2, b2 this rank's experts); the backward gives dx, this rank's share of drouter_w (the
    ranks' shares sum to the gradient of the whole layer: sum them, as data parallelism does)
    and the local experts' gradients."""

    @staticmethod
    def forward(ctx, x, router_w, w1, b1, w2, b2, ep, options):
        if x.shape[0] > ep.max_tokens:
            raise ValueError(f"moex.torch.MoELayer: {x.shape[0]} tokens, more than the layer's ep_max_tokens "
                             f"{ep.max_tokens}")
        nbytes = _capi.ep_moe_layer_saved_size(
            ep.ctx, _ep_args(ep, x, router_w, w1, b1, w2, b2, options, None, None, view=_shape_view))
        saved = x.new_empty(nbytes, dtype=torch.uint8)
        y = x.new_empty(x.shape)
        _run("ep_moe_layer_forward", _ep_args(ep, x, router_w, w1, b1, w2, b2, options, saved, y), x.device)
        ctx.save_for_backward(x, router_w, w1, b1, w2, b2, saved)
        ctx.ep, ctx.options = ep, options
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, router_w, w1, b1, w2, b2, saved = ctx.saved_tensors
        n, b2_mode = ctx.needs_input_grad, ctx.options[3]
        needs = [n[0], n[1], n[2], n[4], n[3] and b1 is not None, n[5] and b2 is not None and b2_mode != BIAS_NONE]
        outs = _moe_backward_outputs(x, router_w, w1, b1, w2, b2, needs)
        dx, drw, dw1, dw2, db1, db2 = (o if k else None for o, k in zip(outs, needs))
        fwd = _ep_args(ctx.ep, x, router_w, w1, b1, w2, b2, ctx.options, saved, None).layer
        grad = _capi.MoeLayerGradArgs(fwd=fwd, dw_mode=GRAD_WRITE)
        for name, t in (("dy", dy.contiguous()), ("dx", dx), ("drouter_w", drw), ("dw1", dw1), ("dw2", dw2),
                        ("db1", db1), ("db2", db2)):
            if t is not None:
                dst = getattr(grad, name)
                _fill(dst.t if type(dst) is _capi.Weight else dst, t)
        _run("ep_moe_layer_backward", _capi.EpMoeLayerGradArgs(ep=ctx.ep.handle, layer=grad), x.device)
        return dx, drw, dw1, db1, dw2, db2, None, None


def ep_moe_forward(layer, x: Tensor) -> Tensor:
    """MoELayer.forward's EP path: x [T, H] (contiguous rows) of this rank."""
    return _EPMoE.apply(x, layer.router_w, layer.w1, layer.b1, layer.w2, layer.b2, layer._ep, layer.options)


def ep_setup(owner: str, group, num_experts: int, topk: int, hidden: int, dtype: torch.dtype, device,
             max_tokens: Optional[int], max_recv_rows: Optional[int]):
    """The layer's _EPContext and its local expert count, after the arguments' checks."""
    if torch.device(device if device is not None else "cpu").type != "cpu":
        raise ValueError(f"moex.{owner}: ep_group runs on the CPU backend (over MPI) only, for now; the layer is on "
                         f"{device}")
    if max_tokens is None or int(max_tokens) < 1:
        raise ValueError(f"moex.{owner}: ep_group needs ep_max_tokens >= 1 (the most tokens of one rank's call: "
                         f"moex sizes its transfer buffers for it)")
    _mpi_comm_address(group)
    world = group.Get_size()
    if num_experts % world:
        raise ValueError(f"moex.{owner}: num_experts {num_experts} is not a multiple of the group's {world} ranks")
    local = num_experts // world
    if max_recv_rows is None:   # no row dropped: every rank's tokens, each up to min(topk, local) times
        max_recv_rows = world * int(max_tokens) * min(topk, local)
    return _EPContext(group, num_experts, topk, hidden, dtype, int(max_tokens), int(max_recv_rows)), local
