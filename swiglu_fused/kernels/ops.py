"""torch.library custom ops and dispatch: the sm_90a kernel where it applies, else the reference.

    swiglu_fused::quant_x(x)                                   → (xq, x_scale)
    swiglu_fused::gate_up(x, weight, weight_scale, x_scale, global_scale, interleave, act, h_format, tile_major,
                          h_order)                             → (h, h_scale)
    swiglu_fused::down(h, weight, weight_scale, h_scale, global_scale, residual, out_dtype, tile_major,
                       h_order)                                → y
    swiglu_fused::gate_up_split(x, weight, weight_scale, x_scale, global_scale, prefix, interleave, act)
                                                               → [y | h] (Flux.2's single-stream projection)
    swiglu_fused::qk_norm_rope(q, k, weight_q, weight_k, cos, sin, eps)
                                                               → [Q', K'] (Flux.2's QK norms and rotary embedding)
    swiglu_fused::copy_into(dst, src)                          dst ← src in place (Flux.2's [attention | h])

The Python wrappers below (``quant_x``, ``gate_up``, ``gate_up_split``, ``down``) take exactly the arguments of
``reference.py`` (STYLE §1) and validate them with errors that name the argument. Each op has a
fake (meta) implementation, so torch.compile and CUDA graphs see shapes without running anything.
gate_up returns h_scale M-major (strides (1, M), on every backend): the layout both down GEMMs
read, the sm90 kernel and cuBLAS's block-scaled one, so no transpose copy runs between them;
down takes h_scale in any layout.

Which backend runs a call (the sm90 kernel with which config, cuBLAS for down, or the reference)
is kernels/dispatch.py's choice; this module validates, runs what it chose and registers the ops.
Plain eager calls skip the torch.library dispatcher (``runs_directly``); the registered ops run
under torch.compile, fake-tensor modes and for inputs that require grad.

``mlp`` is the forward of FusedSwiGLUMLP: pipeline.mlp over these three ops.
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from .. import formats, quant
from . import cublas, deepgemm, dispatch, fp8_layout, nvfp4_layout, pipeline, reference

FP8 = torch.float8_e4m3fn
GROUP = formats.FP8_BLOCK
cdiv = quant.cdiv


# ---------------------------------------------------------------- validation helpers
def _check_2d(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor [rows, cols], got shape {tuple(t.shape)}")


def _check_same_device(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name}: is on {t.device} but {ref_name} is on {ref.device}; move both to one device")


def _check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise TypeError(f"{name}: dtype {t.dtype} is not supported; expected one of {[str(d) for d in allowed]}")


def _check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...], why: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} ({why}), got {tuple(t.shape)}")


def _check_block_scales(weight_scale, n: int, k: int, grid: str) -> None:
    """The 128x128 block-scale grid of an e4m3 weight [n, k]."""
    if weight_scale is None:
        raise ValueError(f"weight_scale: an e4m3 weight needs its {grid} block scale grid")
    _check_dtype("weight_scale", weight_scale, (torch.float32, torch.float8_e8m0fnu))
    _check_shape("weight_scale", weight_scale, (cdiv(n, GROUP), cdiv(k, GROUP)),
                 "one multiplier per 128x128 weight block")


def _check_group_scales(name: str, a: torch.Tensor, scale, k: int, how: str, what: str) -> None:
    """The per-row per-128-column scales of an e4m3 activation ``name`` [M, k]."""
    if scale is None:
        raise ValueError(f"{name}_scale: an e4m3 {name} needs its {what}; {how}")
    _check_dtype(f"{name}_scale", scale, (torch.float32,))
    _check_shape(f"{name}_scale", scale, (a.shape[0], cdiv(k, GROUP)),
                 f"one scale per row per 128 columns of {name}")


def _check_nvfp4_scales(weight_scale, global_scale, n: int, k: int, split: bool = False) -> None:
    """An nvfp4 weight [n, k]'s e4m3 scales per 16 columns and its fp32 per-tensor multipliers
    ([1] or [2]; a split projection's [3]: prefix, gate, up)."""
    counts, which = ((3,), "[3]: prefix, gate and up") if split else ((1, 2), "[1], or [2] for gate and up")
    if weight_scale is None or global_scale is None:
        raise ValueError("weight_scale, global_scale: an nvfp4 weight needs its e4m3 scales per 16 columns "
                         f"and its fp32 global scale ({which})")
    _check_dtype("weight_scale", weight_scale, (FP8,))
    _check_shape("weight_scale", weight_scale, (n, cdiv(k, formats.NVFP4_GROUP)),
                 f"one e4m3 scale per row per {formats.NVFP4_GROUP} columns")
    _check_dtype("global_scale", global_scale, (torch.float32,))
    if global_scale.numel() not in counts:
        raise ValueError(f"global_scale: expected {' or '.join(map(str, counts))} elements ({which}), got shape "
                         f"{tuple(global_scale.shape)}")


def _check_tile_major(tile_major, weight: torch.Tensor, k: int, fp8: bool = False) -> None:
    """``tile_major`` (nvfp4_layout): a bool, True only for an nvfp4 weight of whole tiles, or with
    ``fp8`` (gate_up: every backend that runs it reads that order) an fp8 one (fp8_layout)."""
    if not isinstance(tile_major, bool):
        raise TypeError(f"tile_major: expected a bool, got {tile_major!r}")
    if tile_major and fp8 and weight.dtype == torch.float8_e4m3fn:
        if not fp8_layout.fits(weight.shape[0], k):
            raise ValueError(f"tile_major: only an fp8 weight with N a multiple of {fp8_layout.ROWS} and K of "
                             f"{fp8_layout.K_TILE} has a tile-major layout; got {list(weight.shape)}; pass "
                             "tile_major=False for the packed order")
        return
    if tile_major and (weight.dtype != torch.uint8 or not nvfp4_layout.fits(weight.shape[0], k)):
        raise ValueError(f"tile_major: only an nvfp4 weight with N a multiple of {nvfp4_layout.ROWS} and K of "
                         f"{nvfp4_layout.K_TILE} has a tile-major layout; got a {weight.dtype} weight "
                         f"{list(weight.shape)} (K = {k}); pass tile_major=False for the packed order")


def _check_interleave(interleave) -> None:
    if formats.interleave_problem(interleave):
        raise ValueError(f"interleave: expected a positive integer number of rows (default "
                         f"{formats.DEFAULT_INTERLEAVE}), got {interleave!r}")


def _kernel_operands_ok(operands: dict, scales: dict) -> None:
    """The sm90 kernels' layout constraints, raised only on the kernel path: matrix operands with
    16-byte rows (``_kernel_layout_ok``), contiguous scales; None entries are absent operands."""
    for name, t in operands.items():
        if t is not None:
            _kernel_layout_ok(name, t, 16 // t.element_size())
    for name, t in scales.items():
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name}: the sm90 kernel needs a contiguous tensor; call .contiguous()")


def _kernel_layout_ok(name: str, t: torch.Tensor, k_multiple: int, row_stride: bool = False) -> None:
    """Constraints of the sm90 kernels' 16-byte accesses, raised only on the kernel path;
    ``row_stride``: rows may lie further apart than their length (quant_x), in whole 16 bytes."""
    if not (t.is_contiguous() or (row_stride and dispatch.rows_in_place(t, k_multiple))):
        raise ValueError(f"{name}: the sm90 kernel needs a contiguous tensor (row stride = cols"
                         + (f", or a multiple of {k_multiple} with unit column stride" if row_stride else "")
                         + "); call .contiguous()")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: the sm90 kernel needs a 16-byte aligned data pointer, got address % 16 = {t.data_ptr() % 16}")
    if t.shape[-1] % k_multiple:
        raise ValueError(
            f"{name}: the sm90 kernel needs the last dimension to be a multiple of {k_multiple} "
            f"(16-byte rows), got {t.shape[-1]}; pad it with zeros to {cdiv(t.shape[-1], k_multiple) * k_multiple}"
        )


# ---------------------------------------------------------------- eager fast path
def runs_directly(*tensors: torch.Tensor | None) -> bool:
    """Whether the wrappers may call the op's implementation directly rather than through
    torch.library's dispatcher: the same function runs either way, but the dispatcher costs host
    time per op, and eager decode is host-bound (DISPATCH D21). Only for plain eager calls: under
    torch.compile, inside a dispatch mode (FakeTensorMode, ...), with tensor subclasses or with
    inputs that require grad (the ops have no autograd formula, and the dispatcher says so) the
    registered op runs."""
    if torch.compiler.is_compiling():  # first: dynamo cannot trace the dispatch-mode query
        return False
    mode = getattr(getattr(torch.utils, "_python_dispatch", None), "_get_current_dispatch_mode", None)  # private
    if mode is None or mode() is not None:
        return False
    return all(t is None or (type(t) is torch.Tensor and not t.requires_grad) for t in tensors)


# ---------------------------------------------------------------- quant_x
def _quant_x_impl(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if dispatch.quant_x_backend(x) == dispatch.SM90:
        _kernel_layout_ok("x", x, 8, row_stride=True)
        from .sm90 import quant_x as sm90_quant_x

        with torch.cuda.device(x.device):
            return sm90_quant_x.quant_x(x)
    return reference.quant_x(x)


_quant_x_op = torch.library.custom_op("swiglu_fused::quant_x", mutates_args=())(_quant_x_impl)


@_quant_x_op.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    return x.new_empty((m, k), dtype=FP8), x.new_empty((m, cdiv(k, GROUP)), dtype=torch.float32)


def quant_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16/fp16/fp32 x [M, K] → (e4m3 [M, K], x_scale fp32 [M, ceil(K/128)]), s = amax/448."""
    _check_2d("x", x)
    _check_dtype("x", x, (torch.bfloat16, torch.float16, torch.float32))
    return (_quant_x_impl if runs_directly(x) else _quant_x_op)(x)


# ---------------------------------------------------------------- gate_up
def _gate_up_impl(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None,
    x_scale: torch.Tensor | None,
    global_scale: torch.Tensor | None,
    interleave: int,
    act: str,
    h_format: str,
    tile_major: bool = False,
    h_order: str = "natural",
) -> tuple[torch.Tensor, torch.Tensor]:
    h_rs_order = dispatch.gate_up_h_in_rs_order(h_order, x, weight)
    backend, cfg = dispatch.gate_up_backend(x, weight, weight_scale, x_scale, global_scale, interleave, act, h_format,
                                            tile_major)
    if backend == dispatch.CUBLAS:
        _kernel_operands_ok(dict(weight=weight), dict(weight_scale=weight_scale, global_scale=global_scale))
        h, h_scale = _cublas_gate_up(x, weight, weight_scale, global_scale, act, tile_major), None
        if h_rs_order:
            h = _rs_reorder(h)
    elif backend == dispatch.SM90:
        _kernel_operands_ok(dict(x=x, weight=weight), dict(weight_scale=weight_scale, x_scale=x_scale,
                                                           global_scale=global_scale))
        from .sm90 import gate_up as sm90_gate_up, warp_mma

        with torch.cuda.device(x.device):
            if isinstance(cfg, warp_mma.WarpMmaConfig):
                h, h_scale = warp_mma.gate_up(cfg, x, weight, weight_scale, global_scale), None
            else:
                if h_rs_order and cfg.writes_h_rs_order:  # (else reordered below)
                    cfg, h_rs_order = dataclasses.replace(cfg, h_rs_order=True), False
                h, h_scale = sm90_gate_up.gate_up(cfg, x, weight, weight_scale, x_scale, global_scale,
                                                  tile_major=tile_major)
        if h_rs_order:
            h = _rs_reorder(h)
    else:
        h, h_scale = reference.gate_up(x, weight, weight_scale, x_scale, global_scale, interleave=interleave, act=act,
                                       h_format=h_format, tile_major=tile_major,
                                       h_order="rs" if h_rs_order else "natural")
    if h_scale is None:
        h_scale = h.new_empty((h.shape[0], 0), dtype=torch.float32)
    # M-major on every backend: what both down GEMMs read (the sm90 kernel and cuBLAS) without a copy
    return h.contiguous(), quant.m_major(h_scale)


def _cublas_gate_up(x, weight, weight_scale, global_scale, act: str, tile_major: bool) -> torch.Tensor:
    """bf16 h as cuBLAS's GEMM, then the sm90 act·mul kernel (DISPATCH D53); an nvfp4 weight is first
    dequantized for the call (nvfp4_dequant.py, as the dequantized prefill's kernels read it) and the
    act·mul applies its global scales. The reference's epilogue where y is too large for the kernel's
    32-bit offsets."""
    from .sm90 import act_mul

    with torch.cuda.device(x.device):
        multipliers = None
        if weight.dtype == torch.uint8:
            from .sm90 import gemm, nvfp4_dequant

            weight = nvfp4_dequant.dequantize(weight, weight_scale, tile_major=tile_major)
            multipliers = gemm.nvfp4_global_scales(global_scale, 2)
        y = cublas.gate_up_gemm(x, weight)
        if act_mul.takes(y):
            return act_mul.act_mul(y, act, multipliers=multipliers)
        if multipliers is not None:  # (per half of each 2g chunk)
            y = y.float().view(y.shape[0], -1, 2, GROUP) * (multipliers * 2.0 ** act_mul.UNSHIFT).view(2, 1)
            y = y.flatten(1)
        return reference.gate_up_epilogue(y, act=act)[0]


def _rs_reorder(t: torch.Tensor) -> torch.Tensor:
    """nvfp4_layout.rs_k_order (its own inverse): by the sm90 kernel where it runs, else the torch copy."""
    if dispatch.sm90_kernels_usable(t.device):
        from .sm90 import k_order

        with torch.cuda.device(t.device):
            return k_order.rs_order(t)
    return nvfp4_layout.rs_k_order(t)


_gate_up_op = torch.library.custom_op("swiglu_fused::gate_up", mutates_args=())(_gate_up_impl)


@_gate_up_op.register_fake
def _(x, weight, weight_scale, x_scale, global_scale, interleave, act, h_format, tile_major=False, h_order="natural"):
    m, i = x.shape[0], weight.shape[0] // 2
    hf = formats.H_FORMATS[h_format]
    if hf.scaled:
        return x.new_empty((m, i), dtype=hf.dtype), x.new_empty((cdiv(i, hf.scale_group), m), dtype=torch.float32).t()
    return x.new_empty((m, i), dtype=hf.dtype), x.new_empty((m, 0), dtype=torch.float32)


def _validate_gate_up(x, weight, weight_scale, x_scale, global_scale, interleave, act, h_format, tile_major,
                      h_order="natural"):
    formats.implementation(formats.H_FORMATS, h_format, "h_format", "")  # raises naming h_format
    _validate_packed_operands(x, weight, weight_scale, x_scale, global_scale, act, interleave, "2I")
    _check_tile_major(tile_major, weight, x.shape[1], fp8=True)
    n = weight.shape[0]
    _check_h_order(h_order, n // 2)
    if n % (2 * interleave):
        raise ValueError(
            f"weight: {n} rows is not a multiple of 2 * interleave = {2 * interleave}; a packed gate_up "
            f"weight has 2I rows in chunks of 2g (check the interleave it was packed with)"
        )


def _check_h_order(h_order, i: int) -> None:
    """``h_order`` (dispatch.H_ORDERS; "rs": nvfp4_layout.rs_k_order of each 64 columns of h, so I % 64 == 0)."""
    if h_order not in dispatch.H_ORDERS:
        raise ValueError(f"h_order: expected one of {dispatch.H_ORDERS}, got {h_order!r}")
    if h_order == "rs" and i % nvfp4_layout.K_TILE:
        raise ValueError(f"h_order: 'rs' reorders h in {nvfp4_layout.K_TILE}-column tiles, and I = {i} is not a "
                         f"multiple of {nvfp4_layout.K_TILE}; pass h_order='natural'")


def _validate_packed_operands(x, weight, weight_scale, x_scale, global_scale, act, interleave, rows: str,
                              split: bool = False) -> None:
    """What gate_up and gate_up_split check alike: x [M, K] against the packed weight [rows, K] of
    any format, its scales (and x's for fp8), the activation and the interleave."""
    _check_2d("x", x)
    _check_2d("weight", weight)
    _check_same_device("x", x, weight=weight, weight_scale=weight_scale, x_scale=x_scale, global_scale=global_scale)
    reference.activation(act)  # raises naming act
    _check_interleave(interleave)
    n, k_w = weight.shape
    fmt = formats.format_of_weight(weight)
    if fmt is not None:
        k_w = fmt.cols_of(weight)
    if x.shape[1] != k_w:
        raise ValueError(f"x: has {x.shape[1]} columns but weight has K = {k_w}; x must be [M, K] for weight "
                         f"[{rows}, K]")
    if weight.dtype == FP8:
        _check_block_scales(weight_scale, n, k_w, f"[ceil({rows if rows.isalnum() else f'({rows})'}/128), ceil(K/128)]")
        if x.dtype == FP8:
            _check_group_scales("x", x, x_scale, k_w, "get both from quant_x(x)", "per-token-group-128 scales")
    else:
        _check_dtype("weight", weight, (torch.bfloat16, torch.uint8))
        _check_dtype("x", x, (torch.bfloat16, torch.float16, torch.float32))
        if weight.dtype == torch.uint8:
            _check_nvfp4_scales(weight_scale, global_scale, n, k_w, split)


def gate_up(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
    *,
    interleave: int = formats.DEFAULT_INTERLEAVE,
    act: str = "silu",
    h_format: str = "bf16",
    tile_major: bool = False,
    h_order: str = "natural",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """h = act(x @ gate^T) · (x @ up^T) from the interleaved packed weight [2I, K] (see reference.gate_up);
    an fp8 h's scales come M-major (strides (1, M), module docstring). ``tile_major``: an nvfp4
    weight and its scales in nvfp4_layout's tile-major order, or an fp8 weight in fp8_layout's.
    ``h_order``: "natural", "rs" (h's columns in nvfp4_layout.rs_k_order, for a down(..., h_order="rs"))
    or "auto" (rs where an nvfp4 down of these shapes reads it: dispatch.h_in_rs_order; the MLP's)."""
    _validate_gate_up(x, weight, weight_scale, x_scale, global_scale, interleave, act, h_format, tile_major,
                      h_order)
    op = _gate_up_impl if runs_directly(x, weight, weight_scale, x_scale, global_scale) else _gate_up_op
    h, h_scale = op(x, weight, weight_scale, x_scale, global_scale, interleave, act, h_format, tile_major, h_order)
    return h, (h_scale if formats.H_FORMATS[h_format].scaled else None)


# ---------------------------------------------------------------- gate_up_split (Flux.2's single-stream projection)
def _gate_up_split_impl(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None,
    x_scale: torch.Tensor | None,
    global_scale: torch.Tensor | None,
    prefix: int,
    interleave: int,
    act: str,
) -> torch.Tensor:
    backend, cfg = dispatch.split_backend(x, weight, weight_scale, x_scale, global_scale, prefix, interleave, act)
    if backend == dispatch.SM90:
        _kernel_operands_ok(dict(x=x, weight=weight), dict(weight_scale=weight_scale, x_scale=x_scale))
        from .sm90 import split as sm90_split

        with torch.cuda.device(x.device):
            return sm90_split.gate_up_split(cfg, x, weight, weight_scale, x_scale, global_scale)
    y, h, _ = reference.gate_up_split(x, weight, weight_scale, x_scale, global_scale, prefix=prefix,
                                      interleave=interleave, act=act, h_format="bf16")
    return torch.cat([y, h], dim=-1)


_gate_up_split_op = torch.library.custom_op("swiglu_fused::gate_up_split", mutates_args=())(_gate_up_split_impl)


@_gate_up_split_op.register_fake
def _(x, weight, weight_scale, x_scale, global_scale, prefix, interleave, act):
    return x.new_empty((x.shape[0], prefix + (weight.shape[0] - prefix) // 2), dtype=torch.bfloat16)


def _validate_gate_up_split(x, weight, weight_scale, x_scale, global_scale, prefix, interleave, act):
    _validate_packed_operands(x, weight, weight_scale, x_scale, global_scale, act, interleave, "P + 2I", split=True)
    reference.check_split_prefix(prefix, weight.shape[0], interleave, weight.dtype == FP8)


def gate_up_split(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
    *,
    prefix: int,
    interleave: int = formats.DEFAULT_INTERLEAVE,
    act: str = "silu",
) -> torch.Tensor:
    """The split projection (see reference.gate_up_split) as one bf16 tensor [M, P + I] = [y | h]:
    the layout the sm90 split epilogue writes (no concatenation; split it at P with views)."""
    _validate_gate_up_split(x, weight, weight_scale, x_scale, global_scale, prefix, interleave, act)
    op = _gate_up_split_impl if runs_directly(x, weight, weight_scale, x_scale, global_scale) else _gate_up_split_op
    return op(x, weight, weight_scale, x_scale, global_scale, prefix, interleave, act)


# ---------------------------------------------------------------- qk_norm_rope (Flux.2's attention inputs)
def _qk_norm_rope_impl(q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor,
                       cos: torch.Tensor, sin: torch.Tensor, eps: float) -> torch.Tensor:
    if dispatch.sm90_kernels_usable(q.device):
        from .sm90 import qk_norm_rope as sm90_qk

        if sm90_qk.takes(q, k, weight_q, weight_k, cos, sin):
            with torch.cuda.device(q.device):
                return sm90_qk.qk_norm_rope(q, k, weight_q, weight_k, cos, sin, eps)
    return reference.qk_norm_rope(q, k, weight_q, weight_k, cos, sin, eps)


_qk_norm_rope_op = torch.library.custom_op("swiglu_fused::qk_norm_rope", mutates_args=())(_qk_norm_rope_impl)


@_qk_norm_rope_op.register_fake
def _(q, k, weight_q, weight_k, cos, sin, eps):
    return q.new_empty((2, *q.shape), dtype=torch.bfloat16)


def _validate_qk_norm_rope(q, k, weight_q, weight_k, cos, sin, eps):
    _check_2d("q", q)
    _check_dtype("q", q, (torch.bfloat16,))
    _check_same_device("q", q, k=k, weight_q=weight_q, weight_k=weight_k, cos=cos, sin=sin)
    _check_shape("k", k, tuple(q.shape), "the same tokens and heads as q")
    _check_dtype("k", k, (torch.bfloat16,))
    d = weight_q.numel()
    if weight_q.dim() != 1 or d % 2 or q.shape[1] % d:
        raise ValueError(f"weight_q: expected a 1-D head dim D, even and dividing q's width {q.shape[1]}, "
                         f"got shape {tuple(weight_q.shape)}")
    _check_shape("weight_k", weight_k, (d,), "one weight a column of a head, as weight_q")
    for name, t in (("cos", cos), ("sin", sin)):
        _check_2d(name, t)
        if t.shape[1] != d or t.shape[0] == 0 or q.shape[0] % t.shape[0]:
            raise ValueError(f"{name}: expected [S, {d}] with S dividing the {q.shape[0]} tokens (batch · S), "
                             f"got shape {tuple(t.shape)}")
    if not eps >= 0:
        raise ValueError(f"eps: expected a non-negative float, got {eps}")


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float) -> torch.Tensor:
    """Flux.2's per-head RMS norms of Q and K, then its rotary embedding (see reference.qk_norm_rope),
    as one bf16 tensor [2, T, inner]: Q' and K', each contiguous."""
    _validate_qk_norm_rope(q, k, weight_q, weight_k, cos, sin, eps)
    op = _qk_norm_rope_impl if runs_directly(q, k, weight_q, weight_k, cos, sin) else _qk_norm_rope_op
    return op(q, k, weight_q, weight_k, cos, sin, float(eps))


# ---------------------------------------------------------------- copy_into (Flux.2's [attention | h] in place)
def _words(t: torch.Tensor) -> torch.Tensor | None:
    """t's bytes as int64 words, row for row, where its last dim and strides allow (else None)."""
    if t.dim() == 0 or t.stride(-1) != 1 or t.shape[-1] * t.element_size() % 8:
        return None
    try:
        return t.view(torch.int64)
    except RuntimeError:  # (a stride or the storage offset not a whole number of words)
        return None


def _copy_into_impl(dst: torch.Tensor, src: torch.Tensor) -> None:
    # torch's copy into a row-strided view moves one element a thread (72 µs for Flux.2-dev's attention
    # output at 4608 tokens on the H200); as words, the same bytes in fewer, wider accesses
    dst_words, src_words = _words(dst), _words(src)
    if dst_words is not None and src_words is not None:
        dst_words.copy_(src_words)
    else:
        dst.copy_(src)


_copy_into_op = torch.library.custom_op("swiglu_fused::copy_into", mutates_args=("dst",))(_copy_into_impl)


@_copy_into_op.register_fake
def _(dst, src):
    return None


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for a ``dst`` that is a view of a larger buffer (the single-stream processor
    writes the attention output over V's columns of the projection's output), bit for bit. An op of
    its own because under torch.compile a ``copy_`` into a slice is functionalized into a rewrite of
    the whole buffer (inductor read and wrote all of [Q | K | V | h], 340 MB at Flux.2-dev's 4608
    tokens: 171 µs against the slice's 72), while an op that mutates ``dst`` runs on the view."""
    if dst.shape != src.shape or dst.dtype != src.dtype or dst.device != src.device:
        raise ValueError(f"copy_into: src must have dst's shape, dtype and device; got dst {tuple(dst.shape)} "
                         f"{dst.dtype} on {dst.device}, src {tuple(src.shape)} {src.dtype} on {src.device}")
    if runs_directly(dst, src):
        _copy_into_impl(dst, src)
    else:
        _copy_into_op(dst, src)


# ---------------------------------------------------------------- down
def _down_impl(
    h: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None,
    h_scale: torch.Tensor | None,
    global_scale: torch.Tensor | None,
    residual: torch.Tensor | None,
    out_dtype: torch.dtype,
    tile_major: bool = False,
    h_order: str = "natural",
) -> torch.Tensor:
    h_rs_order = dispatch.down_h_in_rs_order(h_order, h, weight)
    backend, cfg = dispatch.down_backend(h, weight, weight_scale, h_scale, global_scale, residual, out_dtype,
                                         tile_major)
    if h_rs_order and not (backend == dispatch.SM90 and hasattr(cfg, "rs_decode")):  # (sm90_down.down reorders)
        h, h_rs_order = _rs_reorder(h), False  # the natural order for every other reader
    if backend == dispatch.DEEPGEMM:
        y = deepgemm.down(h, weight, weight_scale, h_scale)
        if y is not None:
            return y
        backend, cfg = dispatch.down_backend(h, weight, weight_scale, h_scale, global_scale, residual, out_dtype,
                                             tile_major)  # (deepgemm.supports_down now says no)
    if backend == dispatch.SM90:  # (sm90_down.down takes h_scale in any layout; gate_up's, M-major, without a copy)
        _kernel_operands_ok(dict(h=h, weight=weight, residual=residual), dict(weight_scale=weight_scale,
                                                                              global_scale=global_scale))
        from .sm90 import down as sm90_down, warp_mma

        with torch.cuda.device(h.device):
            if isinstance(cfg, warp_mma.WarpMmaConfig):
                return warp_mma.down(cfg, h, weight, weight_scale, global_scale, residual)
            return sm90_down.down(cfg, h, weight, weight_scale, h_scale, residual, global_scale, tile_major=tile_major,
                                  h_rs_order=h_rs_order)
    if backend == dispatch.CUBLAS:
        return cublas.down(h, weight, weight_scale, h_scale, residual, out_dtype)
    return reference.down(h, weight, weight_scale, h_scale, global_scale, residual=residual, out_dtype=out_dtype,
                          tile_major=tile_major)


_down_op = torch.library.custom_op("swiglu_fused::down", mutates_args=())(_down_impl)


@_down_op.register_fake
def _(h, weight, weight_scale, h_scale, global_scale, residual, out_dtype, tile_major=False, h_order="natural"):
    return h.new_empty((h.shape[0], weight.shape[0]), dtype=out_dtype)


OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # down's y (and residual)


def _validate_down(h, weight, weight_scale, h_scale, global_scale, residual, out_dtype, tile_major, h_order="natural"):
    _check_2d("h", h)
    _check_2d("weight", weight)
    _check_same_device("h", h, weight=weight, weight_scale=weight_scale, h_scale=h_scale,
                       global_scale=global_scale, residual=residual)
    _check_dtype("h", h, (FP8, torch.bfloat16, torch.float16, torch.float32))
    _check_dtype("weight", weight, (FP8, torch.bfloat16, torch.uint8))
    n, k_w = weight.shape[0], formats.format_of_weight(weight).cols_of(weight)
    if h.shape[1] != k_w:
        raise ValueError(f"h: has {h.shape[1]} columns but weight has K = {k_w}; h must be [M, I] for weight [H, I]")
    if weight.dtype == FP8:
        _check_block_scales(weight_scale, n, k_w, "[ceil(H/128), ceil(I/128)]")
    if weight.dtype == torch.uint8:
        _check_nvfp4_scales(weight_scale, global_scale, n, k_w)
    if h.dtype == FP8:
        _check_group_scales("h", h, h_scale, k_w, "gate_up(..., h_format='fp8_group128') returns both",
                            "per-row per-128-column scales")
    if residual is not None:
        _check_shape("residual", residual, (h.shape[0], n), "the output's shape [M, H]")
        _check_dtype("residual", residual, OUT_DTYPES)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {[str(d) for d in OUT_DTYPES]} (a torch.dtype), got {out_dtype!r}")
    _check_tile_major(tile_major, weight, k_w)
    _check_h_order(h_order, k_w)



def down(
    h: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor | None = None,
    h_scale: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
    *,
    residual: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    tile_major: bool = False,
    h_order: str = "natural",
) -> torch.Tensor:
    """y = h @ down^T (+ residual) (see reference.down): the sm90 kernel, cuBLAS or the reference,
    as dispatch.down_backend picks. ``tile_major``: as for gate_up; ``h_order``: the order h comes in,
    as gate_up's h_order gave it."""
    _validate_down(h, weight, weight_scale, h_scale, global_scale, residual, out_dtype, tile_major, h_order)
    op = _down_impl if runs_directly(h, weight, weight_scale, h_scale, global_scale, residual) else _down_op
    return op(h, weight, weight_scale, h_scale, global_scale, residual, out_dtype, tile_major, h_order)


# ---------------------------------------------------------------- the MLP
def mlp(
    x: torch.Tensor,
    gate_up_tensors,
    down_tensors,
    *,
    weight_format: str,
    interleave: int = formats.DEFAULT_INTERLEAVE,
    act: str = "silu",
    global_scale_kind: str | None = formats.DIVISOR,
    residual: torch.Tensor | None = None,
    tile_major: tuple[bool, bool] = (False, False),
) -> torch.Tensor:
    """The whole gated MLP on packed tensors, x [..., H] → y [..., H], through these ops (the
    forward of FusedSwiGLUMLP; reference.mlp is its twin on the reference ops)."""
    return pipeline.mlp(sys.modules[__name__], x, gate_up_tensors, down_tensors, weight_format=weight_format,
                        interleave=interleave, act=act, global_scale_kind=global_scale_kind, residual=residual,
                        tile_major=tile_major)


# ---------------------------------------------------------------- autograd
def _no_backward(op_name: str):
    def backward(ctx, *grads):
        raise RuntimeError(f"swiglu_fused::{op_name} has no gradient: FusedSwiGLUMLP and its ops are "
                           "inference-only (quantized, packed weights); keep them out of the backward pass "
                           "(torch.no_grad() / torch.inference_mode(), or detach their output)")
    return backward


# A clear error at .backward() instead of the dispatcher's "no autograd formula was registered".
for _op, _name in ((_quant_x_op, "quant_x"), (_gate_up_op, "gate_up"), (_gate_up_split_op, "gate_up_split"),
                   (_down_op, "down"), (_qk_norm_rope_op, "qk_norm_rope")):
    _op.register_autograd(_no_backward(_name), setup_context=lambda ctx, inputs, output: None)
