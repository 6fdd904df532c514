"""Compiled-kernel cache, keyed by (kernel family, frozen config).

In-process: a dict, so each (kernel, config) compiles once per process (0.4–0.8 s per gate_up
config, 0.1 s for quant_x on a 2-core CPU). On disk: nothing of ours yet; CuTe DSL keeps its own
file cache (``CUTE_DSL_CACHE_DIR``, default ``$TMPDIR/<user>/cutlass_python_cache``), whose effect
on a second process's start-up has not been measured. DESIGN §5's "second start compiles
nothing" is therefore not established.

All kernels take raw device pointers and Int32 sizes (no DLPack round trip per call), so one
compilation serves every M, K and I a config supports.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import make_ptr

GPU_ARCH = "sm_90a"
COMPILE_OPTIONS = f"--gpu-arch {GPU_ARCH}"

_lock = threading.Lock()
_compiled: dict[tuple[str, Hashable], Any] = {}


def fake_ptr(dtype: type[cutlass.Numeric], align: int = 16):
    """A null device pointer: enough to compile (compilation never dereferences it)."""
    return make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=align)


def ptr(dtype: type[cutlass.Numeric], tensor, align: int = 16):
    return make_ptr(dtype, tensor.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)


def null_stream() -> cuda.CUstream:
    return cuda.CUstream(0)


def get(family: str, config: Hashable, build: Callable[[], Any]) -> Any:
    """The compiled kernel for (family, config), compiling it with ``build()`` on first use."""
    key = (family, config)
    fn = _compiled.get(key)
    if fn is None:
        with _lock:
            fn = _compiled.get(key)
            if fn is None:
                fn = build()
                _compiled[key] = fn
    return fn


def clear() -> None:
    with _lock:
        _compiled.clear()
