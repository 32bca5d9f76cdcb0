"""moex.torch._ep - expert parallelism (docs/ops.md section 10): moex's EP context over a group's
communicator (EPContext), its dispatch and combine with their autograd (ep_dispatch, ep_combine)
and the EP MoE layer's operators moex::ep_moe_layer_forward and _backward with their autograd and
fake kernels (for MoELayer(ep_group=...), eager or under torch.compile).

The group: a torch.distributed process group of the NCCL backend, for CUDA tensors (moex.torch
makes an NCCL communicator of its own over the group's ranks: _NcclComm), or an mpi4py MPI
communicator, for the CPU backend (moex's EP runs over MPI there); anything else is a ValueError.
Every rank of the group makes the same calls, forward and backward: the EP steps are collective
(moex refuses on every rank a step whose ids or handle one rank refuses; the other checks are
each rank's own).
"""
import contextlib
import ctypes
import itertools
import os
import sys
import weakref
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import _capi
from .._capi import GRAD_WRITE
from ._moe import _moe_args, _moe_backward_outputs, _moe_needs, _shape_view
from ._operators import _DTYPES, _args, _once_differentiable, _operator, _run, _view, _zero_tail


def _mpi_comm(group):
    """The mpi4py communicator `group` is, or None. (mpi4py is not imported here: importing it
    initialises MPI; a communicator means it is.)"""
    MPI = sys.modules.get("mpi4py.MPI")
    return group if MPI is not None and isinstance(group, MPI.Comm) else None


def _torch_group(group):
    """The torch.distributed process group `group` is, or None."""
    if not torch.distributed.is_available():
        return None
    return group if isinstance(group, torch.distributed.ProcessGroup) else None


class _NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * 128)]   # nccl.h's ncclUniqueId (bytes, NULs included)


def _nccl_library(owner: str):
    """The process's NCCL (PyTorch's: the one moex's EP loads too, include/moex_ep.h), or the
    library $MOEX_EP_NCCL_LIBRARY names."""
    name = os.environ.get("MOEX_EP_NCCL_LIBRARY") or "libnccl.so.2"
    try:
        lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            raise ValueError(f"moex.{owner}: cannot load NCCL ({name}): {e}") from None
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(_NcclUniqueId)]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, _NcclUniqueId, ctypes.c_int]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    return lib


class _NcclComm:
    """An NCCL communicator over the ranks of a torch.distributed group, made by moex.torch for
    its EP context: rank 0's unique id broadcast over the group, then ncclCommInitRank on every
    rank (collective), on `device`. Its own, not the group's: NCCL runs one communicator's
    operations in the order they are issued, and torch issues the group's collectives on
    streams of its own, so the two sharing one communicator could deadlock. Destroyed with the
    EP context that uses it."""

    def __init__(self, group, device: torch.device, owner: str):
        dist = torch.distributed
        self.lib = _nccl_library(owner)
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        uid = _NcclUniqueId()
        if self.rank == 0:
            self._check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId", owner)
        obj = [bytes(uid.internal) if self.rank == 0 else None]
        dist.broadcast_object_list(obj, src=dist.get_global_rank(group, 0), group=group, device=device)
        ctypes.memmove(ctypes.addressof(uid), obj[0], ctypes.sizeof(uid))
        self.comm = ctypes.c_void_p()
        with torch.cuda.device(device):
            self._check(self.lib.ncclCommInitRank(ctypes.byref(self.comm), self.world, uid, self.rank),
                        "ncclCommInitRank", owner)

    def _check(self, result: int, call: str, owner: str) -> None:
        if result != 0:
            raise RuntimeError(f"moex.{owner}: {call} failed: {self.lib.ncclGetErrorString(result).decode()}")

    def address(self) -> int:
        """The address of the ncclComm_t (moex_ep_config.comm)."""
        return ctypes.addressof(self.comm)

    def destroy(self) -> None:
        if self.comm:
            self.lib.ncclCommDestroy(self.comm)
            self.comm = ctypes.c_void_p()


def _ep_device(group, device, owner: str) -> torch.device:
    """The device an EP context over `group` runs on: the CPU for an MPI communicator, a CUDA
    device (default: the current one) for an NCCL process group; ValueError otherwise."""
    if _mpi_comm(group) is not None:
        dev = torch.device(device if device is not None else "cpu")
        if dev.type != "cpu":
            raise ValueError(f"moex.{owner}: an MPI communicator runs moex's EP on the CPU backend; for {dev} "
                             f"give a torch.distributed process group of the NCCL backend")
        return dev
    pg = _torch_group(group)
    if pg is None:
        raise ValueError(f"moex.{owner}: the group must be a torch.distributed process group (NCCL, CUDA tensors) "
                         f"or an mpi4py MPI.Comm (the CPU backend), got {type(group).__name__}")
    backend = torch.distributed.get_backend(pg)
    if backend != "nccl":
        raise ValueError(f"moex.{owner}: the process group's backend is {backend}; moex's EP runs over NCCL on "
                         f"CUDA, or over MPI on the CPU (give an mpi4py MPI.Comm there)")
    dev = torch.device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise ValueError(f"moex.{owner}: an NCCL process group runs moex's EP on CUDA, got device {dev}")
    return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())


# The live EP contexts by id: the operators below take an int (a schema has no object type).
_EP_CONTEXTS = weakref.WeakValueDictionary()
_EP_IDS = itertools.count(1)


def _ep_of(ep_id: int) -> "EPContext":
    ep = _EP_CONTEXTS.get(ep_id)
    if ep is None:
        raise ValueError(f"moex.ep_moe_layer: no live EPContext has id {ep_id}")
    if ep.handle is None:   # (before its saved-size query, which would name only a NULL ep)
        raise ValueError(f"moex.ep_moe_layer: the EPContext (id {ep_id}) is closed")
    return ep


def _ep_run(ep: "EPContext", name: str, args, device: torch.device) -> None:
    """_run of an EP call; one made while the current stream is being captured marks the context
    captured (EPContext's CUDA graphs note)."""
    if ep.handle is None:
        raise ValueError(f"moex.{name}: the EPContext is closed")
    if ep._nccl is not None and torch.cuda.is_current_stream_capturing():
        ep.captured = True
    _run(name, args, device)


_TRANSFERS = {"auto": _capi.EP_TRANSFER_AUTO, "capacity": _capi.EP_TRANSFER_CAPACITY, "peer": _capi.EP_TRANSFER_PEER}


class EPContext:
    """moex's expert parallelism over a group of W ranks (moex_ep, docs/ops.md section 10) for one
    shape of traffic: num_experts experts spread over the ranks (rank r holds [r E/W, (r+1) E/W)),
    topk, rows of `hidden` elements of `dtype`, at most max_tokens tokens a rank per call, and
    max_recv_rows expert rows received per call (default: what no routing can overflow,
    W max_tokens min(topk, E/W)). The group: a torch.distributed process group of the NCCL
    backend (CUDA; device: this rank's GPU, default the current one; moex.torch makes an NCCL
    communicator of its own over the group's ranks), or an mpi4py MPI.Comm (the CPU backend).
    transfer: how NCCL ranks exchange rows (include/moex_ep.h, moex_ep_transfer): "auto" (peer
    where every rank can map every peer's memory, one node with NVLink; else capacity),
    "capacity" (NCCL send/recv, across nodes too) or "peer". Created collectively (every rank
    alike: moex refuses differing ranks on every rank), kept with what uses it, freed with it.
    ep_dispatch and ep_combine take it; so does MoELayer (ep_group). Attributes: rank, world,
    local_experts, max_tokens, max_recv_rows, device, transfer (AUTO's choice), id (the
    operators' name for it), captured (a call of it ran inside a CUDA graph capture).

    CUDA graphs: its calls can be captured. NCCL destroys a communicator only once every graph
    that captured work on it is freed (it waits for them), so a context whose calls were
    captured keeps its NCCL communicator when it is collected (a graph may outlive it); close()
    destroys it at once: call it after the graphs are freed (del graph)."""

    def __init__(self, group, num_experts: int, topk: int, hidden: int, dtype: torch.dtype = torch.float32,
                 max_tokens: Optional[int] = None, max_recv_rows: Optional[int] = None, device=None,
                 transfer: str = "auto", _owner: str = "torch.EPContext"):
        if transfer not in _TRANSFERS:
            raise ValueError(f"moex.{_owner}: transfer must be one of {list(_TRANSFERS)}, got {transfer!r}")
        if max_tokens is None or int(max_tokens) < 1:
            raise ValueError(f"moex.{_owner}: expert parallelism needs max_tokens >= 1 (ep_max_tokens for a layer: "
                             f"the most tokens of one rank's call; moex sizes its transfer buffers for it)")
        self.device = _ep_device(group, device, _owner)
        world = group.Get_size() if _mpi_comm(group) is not None else torch.distributed.get_world_size(group)
        if num_experts % world:
            raise ValueError(f"moex.{_owner}: num_experts {num_experts} is not a multiple of the group's {world} "
                             f"ranks")
        if max_recv_rows is None:
            max_recv_rows = world * int(max_tokens) * min(topk, num_experts // world)
        self.group = group   # (kept alive: moex uses its communicator)
        self._nccl = None
        if self.device.type == "cuda":
            self._nccl = _NcclComm(group, self.device, _owner)
            kind, comm = _capi.EP_COMM_NCCL, self._nccl.address()
            self.ctx = _capi.context(_capi.BACKEND_CUDA, self.device.index)
        else:
            MPI = sys.modules["mpi4py.MPI"]
            kind, comm = _capi.EP_COMM_MPI, MPI._addressof(group)
            self.ctx = _capi.context(_capi.BACKEND_CPU, 0)
        cfg = _capi.EpConfig(comm_kind=kind, comm=comm, num_experts=num_experts, topk=topk, hidden=hidden,
                             dtype=_DTYPES[dtype], max_tokens=int(max_tokens), max_recv_rows=int(max_recv_rows),
                             transfer=_TRANSFERS[transfer])
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            self.handle = _capi.ep_create(self.ctx, cfg)
        info = _capi.ep_info(self.ctx, self.handle)
        self.rank, self.world, self.local_experts = info.rank, info.world, info.local_experts
        self.transfer = {v: k for k, v in _TRANSFERS.items()}[info.transfer]   # (auto's choice)
        self.handle_bytes = info.handle_bytes
        self.num_experts, self.topk, self.hidden, self.dtype = num_experts, topk, hidden, dtype
        self.max_tokens, self.max_recv_rows = int(max_tokens), int(max_recv_rows)
        self.id = next(_EP_IDS)   # (the operators name their context by it: _ep_of)
        self.captured = False   # a call of it ran inside a CUDA graph capture (_ep_run)
        _EP_CONTEXTS[self.id] = self

    def close(self) -> None:
        """Frees moex's EP state and destroys the NCCL communicator now, captured or not (NCCL's
        destroy waits until the graphs that captured work on it are freed: free them first).
        The context is unusable after it; calling close again does nothing."""
        self._free(destroy_nccl=True)

    def __del__(self):
        self._free(destroy_nccl=not getattr(self, "captured", False))

    def _free(self, destroy_nccl: bool) -> None:
        nccl, MPI = getattr(self, "_nccl", None), sys.modules.get("mpi4py.MPI")
        if nccl is None and MPI is not None and MPI.Is_finalized():
            return   # (the process is ending; moex_ep_destroy frees an MPI datatype: not after MPI_Finalize)
        _capi.ep_destroy(getattr(self, "handle", None))
        self.handle = None
        if nccl is not None and destroy_nccl:
            nccl.destroy()

    def __repr__(self):
        return (f"EPContext(rank={self.rank}, world={self.world}, num_experts={self.num_experts}, topk={self.topk}, "
                f"hidden={self.hidden}, dtype={self.dtype}, max_tokens={self.max_tokens}, "
                f"max_recv_rows={self.max_recv_rows}, device={self.device}, transfer={self.transfer!r})")


def _ep_args(ep: EPContext, x, router_w, w1, b1, w2, b2, options, saved, y, dropped=None, view=_view):
    """The EP MoE layer's arguments (options: MoELayer.options, then its FP8 recipe's four and
    the kept copies of its weights, fp8_weights, or None)."""
    topk, score, norm, b2_mode, *rest = options
    layer = _moe_args(x, router_w, w1, b1, w2, b2, topk, score, norm, b2_mode, tuple(rest[:5]), saved, y,
                      tuple(rest[5:]), view=view)
    return _capi.EpMoeLayerArgs(ep=ep.handle, layer=layer, dropped=view(dropped))


# ---- the EP MoE layer's operators: moex::ep_moe_layer_forward and _backward ----------------------
# As moex::moe_layer_forward and _backward (_moe.py), with the EP context by its id: registered with
# torch.library (fake kernels from the shapes, autograd), so torch.compile traces the layer; eager
# calls run the implementation directly. The layer's router_w is whole on every rank, w1, b1, w2,
# b2 this rank's experts; the backward gives dx, this rank's share of drouter_w (the ranks' shares
# sum to the gradient of the whole layer: sum them, as data parallelism does) and the local
# experts' gradients.

def _ep_saved_bytes(ep, x, router_w, w1, b1, w2, b2, options) -> int:
    """moex_ep_moe_layer_saved_size from the shapes (without fp8_weights: a size query reads no copy)."""
    return _capi.ep_moe_layer_saved_size(ep.ctx, _ep_args(ep, x, router_w, w1, b1, w2, b2, options[:13], None, None,
                                                          view=_shape_view))


@_operator("ep_moe_layer_forward", mutates_args=())
def _ep_moe_forward(x: Tensor, router_w: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor,
                    b2: Optional[Tensor], ep_id: int, topk: int, score: int, norm: int, b2_mode: int, glu_kind: int,
                    glu_layout: int, glu_limit: float, glu_alpha: float, glu_offset: float, fp8_mode: int,
                    fp8_dtypes: int, fp8_pow2_scales: bool,
                    fp8_amax_epsilon: float, fp8_weights: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """(y, saved, dropped: [1] int64, the expert rows this rank received past max_recv_rows)."""
    ep = _ep_of(ep_id)
    options = (topk, score, norm, b2_mode, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset, fp8_mode,
               fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights)
    if x.shape[0] > ep.max_tokens:
        raise ValueError(f"moex.torch.MoELayer: {x.shape[0]} tokens, more than the layer's ep_max_tokens "
                         f"{ep.max_tokens}")
    saved = x.new_empty(_ep_saved_bytes(ep, x, router_w, w1, b1, w2, b2, options), dtype=torch.uint8)
    y, dropped = x.new_empty(x.shape), x.new_empty(1, dtype=torch.int64)
    _ep_run(ep, "ep_moe_layer_forward", _ep_args(ep, x, router_w, w1, b1, w2, b2, options, saved, y, dropped),
            x.device)
    return y, saved, dropped


@_ep_moe_forward.register_fake
def _(x, router_w, w1, b1, w2, b2, ep_id, *options):
    n = _ep_saved_bytes(_ep_of(ep_id), x, router_w, w1, b1, w2, b2, options)
    return x.new_empty(x.shape), x.new_empty(n, dtype=torch.uint8), x.new_empty(1, dtype=torch.int64)


@_operator("ep_moe_layer_backward", mutates_args=())
def _ep_moe_backward(x: Tensor, router_w: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor,
                     b2: Optional[Tensor], saved: Tensor, dy: Tensor, ep_id: int, topk: int, score: int, norm: int,
                     b2_mode: int, glu_kind: int, glu_layout: int, glu_limit: float, glu_alpha: float,
                     glu_offset: float, fp8_mode: int, fp8_dtypes: int, fp8_pow2_scales: bool,
                     fp8_amax_epsilon: float, fp8_weights: Optional[Tensor], needs: List[bool]) -> List[Tensor]:
    """needs: (dx, drouter_w, dw1, dw2, db1, db2); the outputs in that order, 0 rows when not needed."""
    ep = _ep_of(ep_id)
    options = (topk, score, norm, b2_mode, glu_kind, glu_layout, glu_limit, glu_alpha, glu_offset, fp8_mode,
               fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon, fp8_weights)
    outs = _moe_backward_outputs(x, router_w, w1, b1, w2, b2, needs)
    dx, drw, dw1, dw2, db1, db2 = (o if n else None for o, n in zip(outs, needs))
    fwd = _ep_args(ep, x, router_w, w1, b1, w2, b2, options, saved, None).layer
    grad = _args(_capi.MoeLayerGradArgs, fwd=fwd, dy=dy, dx=dx, dw_mode=GRAD_WRITE, drouter_w=drw, dw1=dw1, dw2=dw2,
                 db1=db1, db2=db2)
    _ep_run(ep, "ep_moe_layer_backward", _capi.EpMoeLayerGradArgs(ep=ep.handle, layer=grad), x.device)
    return outs


@_ep_moe_backward.register_fake
def _(x, router_w, w1, b1, w2, b2, saved, dy, ep_id, *rest):
    return _moe_backward_outputs(x, router_w, w1, b1, w2, b2, rest[-1])


def _ep_moe_setup(ctx, inputs, output):
    x, router_w, w1, b1, w2, b2 = inputs[:6]
    ctx.save_for_backward(x, router_w, w1, b1, w2, b2, output[1])
    ctx.ep_id, ctx.options = inputs[6], inputs[7:]
    ctx.set_materialize_grads(False)   # saved and dropped are outputs for the backward only: no zero gradients


def _ep_moe_grads(ctx, dy, _dsaved, _ddropped):
    if dy is None:
        return (None,) * (7 + len(ctx.options))
    x, router_w, w1, b1, w2, b2, saved = ctx.saved_tensors
    needs = _moe_needs(ctx.needs_input_grad, b1, b2, ctx.options[3])
    outs = _ep_moe_backward(x, router_w, w1, b1, w2, b2, saved, dy.contiguous(), ctx.ep_id, *ctx.options, needs)
    dx, drw, dw1, dw2, db1, db2 = (o if k else None for o, k in zip(outs, needs))
    return (dx, drw, dw1, db1, dw2, db2) + (None,) * (1 + len(ctx.options))


_ep_moe_forward.register_autograd(_ep_moe_grads, setup_context=_ep_moe_setup)


# ---- dispatch and combine ----------------------------------------------------------------------

def _check_ep(op: str, ep, t: Tensor, name: str, expert_rows: bool) -> None:
    """ValueError unless ep is an EPContext and t a [rows, H] tensor of its dtype (expert rows:
    ep.max_recv_rows of them)."""
    if not isinstance(ep, EPContext):
        raise ValueError(f"moex.torch.{op}: ep must be an EPContext, got {type(ep).__name__}")
    if isinstance(t, Tensor) and t.device != ep.device:
        raise ValueError(f"moex.torch.{op}: {name} is on {t.device}, the EPContext on {ep.device}")
    rows = ep.max_recv_rows if expert_rows else -1
    if not isinstance(t, Tensor) or t.dim() != 2 or t.shape[1] != ep.hidden or t.dtype != ep.dtype:
        raise ValueError(f"moex.torch.{op}: {name} must be a [rows, {ep.hidden}] {ep.dtype} tensor (the EPContext's), "
                         f"got {tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}"
                         f"{' ' + str(t.dtype) if isinstance(t, Tensor) else ''}")
    if rows >= 0 and t.shape[0] != rows:
        raise ValueError(f"moex.torch.{op}: {name} has {t.shape[0]} rows, must have {rows}")


def _handle_of(op: str, ep: EPContext, handle: Tensor) -> Tensor:
    if not isinstance(handle, Tensor) or handle.dtype != torch.uint8 or handle.numel() != ep.handle_bytes:
        raise ValueError(f"moex.torch.{op}: handle must be the uint8 [{ep.handle_bytes}] tensor ep_dispatch returned")
    return handle


class _EPDispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ep, x, ids, probs):
        T, R = x.shape[0], ep.max_recv_rows
        handle = x.new_empty(ep.handle_bytes, dtype=torch.uint8)
        xr, probs_r = x.new_empty(R, ep.hidden), x.new_empty(R, dtype=torch.float32)
        splits = x.new_empty(ep.local_experts, dtype=torch.int64)
        dropped = x.new_empty(1, dtype=torch.int64)
        args = _capi.EpDispatchArgs(ep=ep.handle, x=_view(x), ids=_view(ids), probs=_view(probs),
                                    handle=handle.data_ptr(), handle_bytes=ep.handle_bytes, xr=_view(xr),
                                    probs_r=_view(probs_r), splits=_view(splits), dropped=_view(dropped))
        _ep_run(ep, "ep_dispatch_forward", args, x.device)
        _zero_tail(xr, splits), _zero_tail(probs_r, splits)   # (the rows past the splits: 0)
        ctx.ep, ctx.T = ep, T
        ctx.save_for_backward(handle)
        ctx.mark_non_differentiable(splits, handle, dropped)
        return xr, probs_r, splits, handle, dropped

    @staticmethod
    @_once_differentiable
    def backward(ctx, dxr, dprobs_r, _dsplits, _dhandle, _ddropped):
        handle, = ctx.saved_tensors
        ep, need_x, need_p = ctx.ep, ctx.needs_input_grad[1], ctx.needs_input_grad[3]
        dxr = dxr.contiguous()   # (autograd gives zeros for an output that did not reach the loss)
        dx = dxr.new_empty(ctx.T, ep.hidden)   # (moex's backward writes dx whole; dprobs only with it)
        dprobs = dxr.new_empty(ctx.T, ep.topk, dtype=torch.float32) if need_p else None
        dpr = dprobs_r.contiguous() if need_p else None
        args = _capi.EpDispatchGradArgs(ep=ep.handle, handle=handle.data_ptr(), handle_bytes=ep.handle_bytes,
                                        dxr=_view(dxr), dprobs_r=_view(dpr), dx=_view(dx), dprobs=_view(dprobs))
        _ep_run(ep, "ep_dispatch_backward", args, dxr.device)
        return None, dx if need_x else None, None, dprobs


class _EPCombine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ep, yr, handle, T):
        y = yr.new_empty(T, ep.hidden)
        args = _capi.EpCombineArgs(ep=ep.handle, handle=handle.data_ptr(), handle_bytes=ep.handle_bytes,
                                   yr=_view(yr), y=_view(y))
        _ep_run(ep, "ep_combine_forward", args, yr.device)
        ctx.ep = ep
        ctx.save_for_backward(handle)
        return y

    @staticmethod
    @_once_differentiable
    def backward(ctx, dy):
        handle, = ctx.saved_tensors
        ep = ctx.ep
        dyr = dy.new_zeros(ep.max_recv_rows, ep.hidden)   # (rows past the splits: 0)
        dy = dy.contiguous()   # (held here: the args below hold only its address)
        args = _capi.EpCombineGradArgs(ep=ep.handle, handle=handle.data_ptr(), handle_bytes=ep.handle_bytes,
                                       dy=_view(dy), dyr=_view(dyr))
        _ep_run(ep, "ep_combine_backward", args, dy.device)
        return None, dyr, None, None


def ep_dispatch(ep: EPContext, x: Tensor, ids: Tensor,
                probs: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """This rank's tokens to the ranks that hold their experts (moex_ep_dispatch_forward,
    docs/ops.md 10.1; collective): x [T, H] (T <= ep.max_tokens), ids [T, k] global expert ids
    (int32 or int64), probs [T, k] f32. Returns (xr [R, H], the rows this rank received, by
    local expert; probs_r [R] f32, each row's prob; splits [El] int64, rows per local expert;
    handle, uint8, the routing that ep_combine needs; dropped, int64 [1], the expert rows past R
    this rank did not keep: the last experts' last rows, which count 0 in ep_combine's sums and
    get zero gradients), R = ep.max_recv_rows; rows of xr and probs_r past sum(splits) are 0. Differentiable in x and probs (the backward is collective
    too: every rank runs it)."""
    op = "ep_dispatch"
    _check_ep(op, ep, x, "x", False)
    if x.shape[0] > ep.max_tokens:
        raise ValueError(f"moex.torch.{op}: {x.shape[0]} tokens, more than the EPContext's max_tokens {ep.max_tokens}")
    for name, t, dtypes in (("ids", ids, (torch.int32, torch.int64)), ("probs", probs, (torch.float32,))):
        if not isinstance(t, Tensor) or t.shape != (x.shape[0], ep.topk) or t.dtype not in dtypes \
                or t.device != x.device:
            raise ValueError(f"moex.torch.{op}: {name} must be [{x.shape[0]}, {ep.topk}] on {x.device} of "
                             f"{' or '.join(map(str, dtypes))}, got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    return _EPDispatch.apply(ep, x.contiguous(), ids.to(torch.int32).contiguous(), probs.contiguous())


def ep_combine(ep: EPContext, yr: Tensor, handle: Tensor, tokens: int) -> Tensor:
    """The expert rows back to their tokens (moex_ep_combine_forward, docs/ops.md 10.2;
    collective): yr [R, H] in ep_dispatch's row order, handle and tokens (T) its dispatch's.
    Returns y [T, H], each token the sum of its rows (weight them by probs_r before, as the
    experts do). Differentiable in yr."""
    op = "ep_combine"
    _check_ep(op, ep, yr, "yr", True)
    return _EPCombine.apply(ep, yr.contiguous(), _handle_of(op, ep, handle), int(tokens))


def ep_moe_forward(layer, x: Tensor, first_microbatch: Optional[bool] = None) -> Tensor:
    """MoELayer.forward's EP path: x [T, H] (contiguous rows) of this rank; first_microbatch as
    the layer's is_first_microbatch (its kept FP8 weight copies, _Fp8Options)."""
    if x.device != layer._ep.device:
        raise ValueError(f"moex.torch.MoELayer: x is on {x.device}, the layer's expert parallelism on "
                         f"{layer._ep.device}")
    ep = layer._ep
    kept = layer._fp8_kept((layer.w1, layer.w2), first_microbatch)
    y, _, layer.ep_dropped = _ep_moe_forward(x, layer.router_w, layer.w1, layer.b1, layer.w2, layer.b2, ep.id,
                                             *layer.options, *layer._fp8, kept)
    return y


def ep_setup(owner: str, group, num_experts: int, topk: int, hidden: int, dtype: torch.dtype, device,
             max_tokens: Optional[int], max_recv_rows: Optional[int], transfer: str):
    """A layer's EPContext and its local expert count."""
    ep = EPContext(group, num_experts, topk, hidden, dtype, max_tokens, max_recv_rows, device, transfer,
                   _owner=owner)
    return ep, ep.local_experts
