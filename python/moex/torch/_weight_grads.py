"""moex.torch._weight_grads - Transformer Engine's weight-gradient options of the modules
(fuse_wgrad_accumulation, delay_wgrad_compute, backward_dw(): _WeightGradOptions) and the
operator moex::module_weight_grads through which a module's backward hands its weight gradients
to it (an opaque side effect that torch.compile keeps).
"""
import itertools
import weakref
from typing import List, Tuple

import torch
import torch.fx.node
from torch import Tensor

from .. import _capi
from ._fp8 import _FP8_OFF, Fp8
from ._linear import _backward_weight, _backward_weight_accumulate
from ._operators import _DTYPES, _operator


_WGRAD_MODULES = weakref.WeakValueDictionary()   # key -> module with _WeightGradOptions
_WGRAD_KEYS = itertools.count()


@_operator("module_weight_grads", mutates_args=())
def _module_weight_grads(xs: List[Tensor], dys: List[Tensor], splits: Tensor, module: int, first_microbatch: bool,
                         keep_copies: bool, fp8_mode: int = 0, fp8_dtypes: int = 0, fp8_pow2_scales: bool = False,
                         fp8_amax_epsilon: float = 0.0) -> None:
    """The weight gradients of a module with the weight-gradient options (_WeightGradOptions;
    `module` its key): dW = dys[i]^T xs[i] for its i-th weight group, into .grad or main_grad, now
    or queued for backward_dw(). A side effect on the module, opaque to torch.compile, which
    keeps the call (it is registered as side-effecting) and runs it where the backward does."""
    target = _WGRAD_MODULES.get(module)
    if target is None:
        raise RuntimeError("moex.torch: the module of this backward's weight gradients no longer exists")
    target._weight_grads(xs, dys, splits, first_microbatch, keep_copies,
                         (fp8_mode, fp8_dtypes, fp8_pow2_scales, fp8_amax_epsilon))


@_module_weight_grads.register_fake
def _(xs, dys, splits, module, first_microbatch, keep_copies, *fp8):
    return None


if hasattr(torch.fx.node, "has_side_effect"):   # torch >= 2.6; older ones keep custom ops in the graph anyway
    torch.fx.node.has_side_effect(torch.ops.moex.module_weight_grads.default)


class _WeightGradOptions:
    """Transformer Engine's weight-gradient options for a module's grouped weights:

    fuse_wgrad_accumulation: the weight gradients go into each weight's .main_grad (f32, which
    the caller allocates), "+=" (or "=" with is_first_microbatch=True or a weight's
    overwrite_main_grad); a weight with the attribute grad_added_to_main_grad gets it set and a
    zero .grad (Megatron's DDP convention).
    delay_wgrad_compute: the backward queues the weight gradients for backward_dw(), one call
    per backward, in order (for overlapping them with other work). Other gradients (inputs,
    biases, probabilities) come from the backward either way."""

    def _init_weight_grads(self, fuse_wgrad_accumulation: bool, delay_wgrad_compute: bool) -> None:
        self.fuse_wgrad_accumulation, self.delay_wgrad_compute = fuse_wgrad_accumulation, delay_wgrad_compute
        self._wgrad_queue = []   # delay_wgrad_compute: one weight-gradient step per backward, FIFO
        self._register_weight_grads()

    def _register_weight_grads(self) -> None:
        """The key by which moex::module_weight_grads finds this module (a copy gets its own)."""
        self._wgrad_key = next(_WGRAD_KEYS)
        _WGRAD_MODULES[self._wgrad_key] = self

    def __setstate__(self, state):   # copy.deepcopy and unpickling: the copy's own key
        super().__setstate__(state)
        self._register_weight_grads()

    def backward_dw(self) -> None:
        """delay_wgrad_compute: runs the oldest queued weight-gradient step (one per backward)."""
        if self._wgrad_queue:
            self._wgrad_queue.pop(0)()

    def _weight_groups(self) -> List[List[Tensor]]:
        """The weights whose gradients the options handle, one list per (x, dy) pair of the
        backward: [[weight]] or [[weight0, ..]] (GroupedLinear), [[w1], [w2]] (the MLPs)."""
        return [[self.w1], [self.w2]]

    def _wgrad_args(self, first_microbatch: bool) -> Tuple:
        """The weight-gradient arguments of a forward, for its backward: (module key,
        first_microbatch, keep_copies, dummy per weight group, fp8). keep_copies: under
        torch.compile a delayed step keeps copies of its inputs (a compiled graph may reuse
        their memory once the backward is done with them); dummy: the group's autograd gradient
        is the zero tensor of Megatron's DDP convention (fuse_wgrad_accumulation and weights
        with grad_added_to_main_grad) instead of None."""
        dummy = tuple(self.fuse_wgrad_accumulation and any(hasattr(p, "grad_added_to_main_grad") for p in ps)
                      for ps in self._weight_groups())
        keep = self.delay_wgrad_compute and torch.compiler.is_compiling()
        return self._wgrad_key, bool(first_microbatch), keep, dummy, self._fp8

    def _weight_grads(self, xs: List[Tensor], dys: List[Tensor], splits: Tensor, first_microbatch: bool,
                      keep_copies: bool, fp8: Fp8) -> None:
        """dW = dys[i]^T xs[i] for the i-th weight group, now or queued for backward_dw()
        (delay_wgrad_compute; copies of the inputs kept with keep_copies); marks the weights'
        grad_added_to_main_grad with fuse_wgrad_accumulation."""
        groups = self._weight_groups()
        if keep_copies and self.delay_wgrad_compute:
            xs, dys, splits = [x.clone() for x in xs], [dy.clone() for dy in dys], splits.clone()

        def step():
            for params, x, dy in zip(groups, xs, dys):
                self._weight_grad(params, x, dy, splits, first_microbatch, fp8)

        if self.delay_wgrad_compute:
            self._wgrad_queue.append(step)
        else:
            step()
        for p in (p for ps in groups for p in ps):
            if self.fuse_wgrad_accumulation and hasattr(p, "grad_added_to_main_grad"):
                p.grad_added_to_main_grad = True

    def _weight_grad(self, params: List[Tensor], x: Tensor, dy: Tensor, splits: Tensor,
                     first_microbatch: bool, fp8: Fp8 = _FP8_OFF) -> None:
        """dW_g = dy_g^T x_g for the weights `params` (one packed [G, N, K] parameter, or G [N, K]
        ones): into main_grad with fuse_wgrad_accumulation, else into .grad (= or +=); with the
        FP8 recipe `fp8` (the operators' arguments)."""
        packed = len(params) == 1 and params[0].dim() == 3
        if self.fuse_wgrad_accumulation:
            overwrite = first_microbatch or any(getattr(p, "overwrite_main_grad", False) for p in params)
            if packed and not overwrite:
                _backward_weight_accumulate(x, dy, splits, params[0].main_grad, *fp8)
            else:
                dw = _backward_weight(x, dy, splits, _capi.DTYPE_F32, *fp8)
                for p, d in zip(params, [dw] if packed else dw):
                    p.main_grad.copy_(d) if overwrite else p.main_grad.add_(d)
            return
        dw = _backward_weight(x, dy, splits, _DTYPES[params[0].dtype], *fp8)
        for p, d in zip(params, [dw] if packed else dw):
            p.grad = d.clone() if p.grad is None else p.grad.add_(d)
