"""Compiling the sm_90a GEMM (gemm.py) for a configuration: which kernel class builds it, and
the compile with fake pointers. Both kernel modules are imported here, so neither imports the
other's subclass (swap_ab.SwapABKernel derives from gemm.GemmKernel; gemm knows nothing
of it). gate_up.py and down.py compile through compile_kernel and run through gemm.launch.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .gemm import GemmKernel, operand_dtypes
from .swap_ab import SwapABKernel
from .tile_config import TileConfig


def kernel_class(config: TileConfig) -> type[GemmKernel]:
    """GemmKernel, or its swap-AB subclass for config.swap_ab (the decode tiles)."""
    return SwapABKernel if config.swap_ab else GemmKernel


def compile_kernel(config: TileConfig, out_dtype, aux_dtype, aux_align: int, kernel_cls: type | None = None):
    """Compile for sm_90a (no GPU needed: fake pointers, runtime Int32 sizes). ``out`` / ``aux`` are
    the epilogue's pointers: h and h_scale for gate_up, y and the residual for down. The arguments
    are GemmKernel.__call__'s, in the order gemm.launch passes the real ones. ``kernel_cls``: a
    GemmKernel subclass of a module that imports this one (split.SplitKernel), else kernel_class's."""
    from .compile_cache import COMPILE_OPTIONS, fake_ptr, null_stream

    a_t, w_t, as_t, ws_t = operand_dtypes(config)
    return cute.compile(
        (kernel_cls or kernel_class(config))(config),
        fake_ptr(a_t, 16), fake_ptr(w_t, 16),
        fake_ptr(as_t, 4), fake_ptr(ws_t, 4),
        fake_ptr(out_dtype, 16), fake_ptr(aux_dtype, aux_align),
        fake_ptr(Float32, 4), fake_ptr(Int32, 4),
        Int32(1), Int32(1), Int32(1), Int32(1), Int32(0),
        null_stream(),
        options=COMPILE_OPTIONS,
    )
