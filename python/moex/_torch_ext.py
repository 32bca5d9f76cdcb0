"""_torch_ext.py - the compiled PyTorch extension of moex (python/csrc, libmoex_torch.so in this
package): moex:: operators, their CPU and CUDA kernels over the C API and their autograd in C++,
built by `pip install ./python` when torch is importable at build time.

moex.torch imports this module before it defines its operators: each operator the extension
defines (OPS) is then the C++ one, the others are defined in Python over the ctypes binding as
without the extension. PATH names the loaded library (None: not loaded, the reason in
LOAD_ERROR). MOEX_TORCH_EXTENSION in the environment: "0" never loads it (the Python path
everywhere), a file path loads that library instead of the package's.

A moex failure inside a C++ kernel raises TorchMoexError, a moex.MoexError (python/csrc/errors.cpp).
"""
import os
import warnings

import torch

from ._capi import MoexError

__all__ = ["PATH", "OPS", "LOAD_ERROR", "TorchMoexError"]


class TorchMoexError(MoexError):
    """moex.MoexError raised by the C++ operators, made from their message "<status>: <moex_last_error>"
    (so .status and str() are those of the ctypes path's MoexError)."""

    def __init__(self, message: str):
        status, _, text = message.partition(": ")
        super().__init__(status, text)


def _package_library():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "libmoex_torch.so")
    return path if os.path.exists(path) else None


def _load():
    """(path, ops, error): the loaded library and the names of the moex:: operators it defines, or
    (None, frozenset(), reason)."""
    setting = os.environ.get("MOEX_TORCH_EXTENSION", "")
    if setting == "0":
        return None, frozenset(), "disabled by MOEX_TORCH_EXTENSION=0"
    path = setting or _package_library()
    if path is None:
        return None, frozenset(), "not built (pip install ./python builds it when torch is importable)"
    try:
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as e:   # e.g. built for another torch than this one
        warnings.warn(f"moex: the PyTorch extension {path} could not be loaded ({e}); moex.torch runs its "
                      "operators through the ctypes binding instead (reinstall moex to rebuild it)")
        return None, frozenset(), str(e)
    # moex.torch defines its Python operators after this: every moex:: operator now is the extension's
    ops = frozenset(name[len("moex::"):] for name in torch._C._dispatch_get_all_op_names() if name.startswith("moex::"))
    return path, ops, None


PATH, OPS, LOAD_ERROR = _load()
