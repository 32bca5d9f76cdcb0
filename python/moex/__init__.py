"""moex: expert layers of Mixture-of-Experts models (grouped linear, grouped MLP, routing).

`import moex` loads libmoex (the C library, through ctypes: moex._capi) and needs nothing
else; `import moex.torch` adds the PyTorch operators and modules.
"""
from ._capi import MoexError, version

__version__ = "0.1.0"
__all__ = ["MoexError", "version", "__version__"]
