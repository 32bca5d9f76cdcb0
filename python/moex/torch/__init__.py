"""moex.torch - moex for PyTorch: the grouped linear layer as torch.library custom operators
(CPU and CUDA implementations, fake kernels for shape inference, registered autograd), so that
torch.compile(fullgraph=True) traces them and a CUDA graph captures them; the grouped MLP
and the MoE layer likewise; the functions gmm, grouped_linear and grouped_mlp, and the modules
GroupedLinear, GroupedMLP and MoELayer.

The functions and modules take what the operators take and more: inputs [..., features] (the
leading dimensions are the rows, as Transformer Engine flattens them; outputs [..., out]),
non-contiguous tensors (made contiguous), splits as a list of ints (checked on the host: no
floats or bools, none negative, the sum at most the rows) or an int64 or int32 tensor (an int32
one converted on its device, without a host sync).

The files, by concern (each imports only those above it; importing this package registers
every operator once):
  _operators     dtype codes, calling the C library, the operator machinery (_operator: the
                 Python implementation or the compiled extension's C++ operator); the
                 operators' contract
  _checks        the operators' argument checks, the functions' argument conversions
  _fp8           the FP8 recipe's arguments and the modules' FP8 options
  _splits        splits and splits_to_offsets
  _linear        the grouped linear operators, their autograd, grouped_linear and gmm
  _weight_grads  the modules' weight-gradient options and moex::module_weight_grads
  _linear_layer  GroupedLinear
  _glu           the scaled GLU operators and scaled_glu
  _mlp           the grouped MLP operators, grouped_mlp and GroupedMLP
  _routing       router, permute and unpermute
  _moe           the MoE layer operators and MoELayer
  _ep            expert parallelism: EPContext, ep_dispatch, ep_combine, MoELayer's ep_group
The C binding is moex._capi, the compiled extension's loader moex._torch_ext.
"""
from .._capi import BIAS_ADD, BIAS_NONE, BIAS_SCALED, GRAD_ACCUMULATE, GRAD_WRITE, MoexError  # noqa: F401
from ._fp8 import Fp8  # noqa: F401
from ._glu import scaled_glu
from ._linear import gmm, grouped_linear
from ._linear_layer import GroupedLinear
from ._mlp import GroupedMLP, grouped_mlp
from ._ep import EPContext, ep_combine, ep_dispatch
from ._moe import MoELayer
from ._routing import permute, router, unpermute
from ._splits import Splits, splits_to_offsets  # noqa: F401

__all__ = ["GroupedLinear", "GroupedMLP", "MoELayer", "gmm", "grouped_linear", "grouped_mlp", "router", "permute",
           "unpermute", "scaled_glu", "splits_to_offsets", "EPContext", "ep_dispatch", "ep_combine", "MoexError"]

# the public names are moex.torch's (repr, help, pickles), wherever they are defined
for _name in __all__:
    if _name != "MoexError":
        globals()[_name].__module__ = __name__
del _name
