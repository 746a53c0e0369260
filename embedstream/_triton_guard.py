"""Keep triton out of CPU-only processes.

transformers imports ``torch._dynamo`` (its masking utilities), which imports triton when it is installed
(it comes with the CUDA torch wheels). Nothing here runs a triton kernel on a CPU, but once loaded its
nanobind bindings outlive the interpreter's module teardown and print ~40 lines of "nanobind: leaked
instance/type/function" at every exit (the test command's last screen). So, where torch sees no CUDA
device, ``import triton`` fails as if it were not installed, and torch takes its no-triton paths; with a
CUDA device nothing changes.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder


class _NoTritonWithoutCuda(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "triton" and not fullname.startswith("triton."):
            return None
        torch = sys.modules.get("torch")
        if torch is None or not hasattr(torch, "cuda"):
            return None  # asked before torch (someone's own use): leave it to the other finders
        if torch.cuda.is_available():
            return None
        raise ModuleNotFoundError(f"No module named {fullname!r} (not loaded: no CUDA device)", name=fullname)


def install() -> None:
    if not any(isinstance(finder, _NoTritonWithoutCuda) for finder in sys.meta_path):
        sys.meta_path.insert(0, _NoTritonWithoutCuda())
