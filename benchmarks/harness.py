"""The one module the benchmark scripts share (run them from the repository root as modules:
``python -m benchmarks.bench_mlp ...``; benchmarks/README.md lists them).

Timing, L2 rotation, the peers (transformers' MLP, the unfused fp8 pipeline, the separate act·quant
kernels), result JSON and charts live in the package, ``swiglu_fused/bench.py``, because
``swiglu-fused bench`` needs them from a normal install; they are re-exported here so that a script
imports one module. What only the scripts need is defined here: the gate_up operand sets, the cuBLAS
block-scaled GEMM peer at the gate_up level, roofline rates, config A/B specs, accuracy helpers and
the JSON writer that draws with ``benchmarks/plot.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path
from unittest import mock

import torch

from swiglu_fused import quant
from swiglu_fused.bench import (  # noqa: F401 (re-exported for the scripts)
    DEEPGEMM, L2_BYTES, REPS, UnfusedFP8, act_mul_bf16, act_quant, act_quant_bytes, act_quant_triton, best_act_quant,
    capture, check_act_quant_same, compact, cycling, deep_gemm, deep_gemm_block_gemm, fused, graph_time_us, header,
    hf_mlp, interleaved_us,
    layer_count, quant_x_m_major, replay_us, rotating, rotation, save_json,
)
from swiglu_fused.kernels import reference

FP8 = torch.float8_e4m3fn
# roofline rates measured on the lent H100 (DESIGN §6); no script times a copy or a square GEMM itself
COPY_BPS = 2.96e12
PEAK_TFLOPS = {"fp8_block128": 1257, "bf16": 775}  # cuBLAS 8192³; fp8 with 1×128/128×128 block scales
# one compiled graph per (M, shape): allow more than dynamo's default 8 recompilations, or the
# separate epilogue silently falls back to eager for the later shapes
for _name in ("recompile_limit", "cache_size_limit"):
    if hasattr(torch._dynamo.config, _name):
        setattr(torch._dynamo.config, _name, 1024)


# ---------------------------------------------------------------------------------------------
# kernel configurations (where dispatch picks them)


def gate_up_config(x, weight, weight_scale, x_scale, *, act: str, h_format: str):
    """The GateUpConfig the ops dispatch for these operands (None: the reference would run)."""
    try:
        from swiglu_fused.kernels import dispatch
    except ImportError:  # before kernels/dispatch.py: each kernel module picked its own
        from swiglu_fused.kernels.sm90 import gate_up

        return gate_up.select_config(x, weight, weight_scale, x_scale, act=act, h_format=h_format)
    return dispatch.gate_up_config(x, weight, weight_scale, x_scale, act=act, h_format=h_format)


def down_config(h, weight, weight_scale, h_scale, residual, out_dtype):
    """The DownConfig the ops dispatch for these operands (None: cuBLAS or the reference would run)."""
    try:
        from swiglu_fused.kernels import dispatch
    except ImportError:
        from swiglu_fused.kernels.sm90 import down

        return down.select_config(h, weight, weight_scale, h_scale, residual, out_dtype)
    return dispatch.down_config(h, weight, weight_scale, h_scale, residual, out_dtype)


def parse_variant(text: str) -> tuple[str, dict]:
    """'name:field=value,field=value' → (name, {field: value}); values are Python literals, else
    strings (a bare gelu_tanh)."""
    name, _, fields = text.partition(":")
    out = {}
    for item in filter(None, fields.split(",")):
        key, _, value = item.partition("=")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return name, out


def in_weight_order(config, sets: list, w_index: int) -> list:
    """``sets`` with their weight (item ``w_index``) in the order ``config`` reads: tile-major copies
    (kernels/fp8_layout.py) for an fp8 config with tile_major, else the sets as they are. Pass
    ``tile_major=config.tile_major`` to the kernel with them."""
    if not (config.fp8 and config.tile_major):
        return sets
    from swiglu_fused.kernels import fp8_layout

    return [s[:w_index] + (fp8_layout.to_tile_major(s[w_index]),) + s[w_index + 1:] for s in sets]


FAMILIES = ("gate_up", "down", "quant_x", "warp_mma_gate_up", "warp_mma_down")


def parse_ab(spec: str) -> dict:
    """"gate_up:l2_hint=w_first,down:pdl=True" → {"gate_up": {"l2_hint": "w_first"}, "down": {"pdl": True}}
    (kernel families gate_up, down, quant_x, and warp_mma_gate_up / warp_mma_down for nvfp4's
    warp-MMA kernels at decode sizes; values as Python literals, else strings). The field
    "down:kernel=True" is not a config field: it runs the sm90 down kernel where cuBLAS would run."""
    out = {}
    for item in filter(None, spec.split(",")):
        family, _, assignment = item.partition(":")
        field, _, value = assignment.partition("=")
        if family not in FAMILIES or not field or not value:
            raise SystemExit(f"--ab: expected FAMILY:FIELD=VALUE items (FAMILY one of {', '.join(FAMILIES)}), "
                             f"got {item!r}")
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        out.setdefault(family, {})[field] = value
    return out


def with_configs(mlp, fields: dict):
    """mlp's forward with the sm90 kernels' configs changed (``fields``: parse_ab's form; each
    family's picked config goes through dataclasses.replace), for bench_mlp's --ab and --pdl-ab. Use
    a module of its own: its eager CUDA graphs are captured with these kernels.

    It patches the functions that pick the configs where the ops look them up: kernels/dispatch.py's
    gate_up_config / down_config and beats_cublas where that module exists, else each kernel
    module's select_config (and down.beats_cublas); quant_x's select_config either way."""
    try:
        from swiglu_fused.kernels import dispatch, dispatch_nvfp4
    except ImportError:
        dispatch = None
    from swiglu_fused.kernels.sm90 import down as kd, gate_up as kg, quant_x as kq

    def changed(select, family):
        @functools.wraps(select)
        def pick(*a, **kw):
            c = select(*a, **kw)
            fam = family if family != "warp_mma" else f"warp_mma_{a[0]}"  # warp_mma_config(op, ...)
            return c and dataclasses.replace(c, **fields.get(fam, {}))
        return pick

    fields = {fam: dict(f) for fam, f in fields.items()}
    force_down = fields.get("down", {}).pop("kernel", False)
    if dispatch is not None:
        targets = [(dispatch, "gate_up_config", "gate_up"), (dispatch, "down_config", "down"),
                   (kq, "select_config", "quant_x"), (dispatch_nvfp4, "warp_mma_config", "warp_mma")]
        beats = (dispatch, "beats_cublas")
    else:
        targets = [(mod, "select_config", fam) for mod, fam in ((kg, "gate_up"), (kd, "down"), (kq, "quant_x"))]
        beats = (kd, "beats_cublas")
    patches = [mock.patch.object(mod, name, changed(getattr(mod, name), fam)) for mod, name, fam in targets]
    if force_down:
        patches.append(mock.patch.object(*beats, lambda *a: True))

    def run(x):
        for patch in patches:
            patch.start()
        try:
            return mlp(x)
        finally:
            for patch in patches:
                patch.stop()
    return run


ALL_PDL = {"gate_up": {"pdl": True}, "down": {"pdl": True}, "quant_x": {"pdl": True},
           "warp_mma_gate_up": {"pdl": True}, "warp_mma_down": {"pdl": True}}


# ---------------------------------------------------------------------------------------------
# gate_up operands and the cuBLAS peer


def operands(m, hidden, inter, seed=0):
    """One fp8 gate_up operand set (xq, xs, wq, ws): random x quantized per 128 columns, random
    packed weight [2I, H] in 128×128 blocks."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, hidden, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(2 * inter, hidden, device="cuda", generator=g) * 0.05
    xq, xs = reference.quant_x(x)
    wq, ws = quant.quantize_fp8_block(w)
    return xq, xs, wq, ws


def bf16_operands(m, hidden, inter, seed=0):
    """operands() of the bf16 mainloop: bf16 x and packed weight, no scales."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, hidden, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(2 * inter, hidden, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    return x, None, w, None


def spread_operands(m, hidden, inter, mainloop, seed):
    """Random normal x and packed weight whose per-row and per-block magnitudes vary over 2^±3 (so
    that a wrong scale index shows up), as ops keyword arguments (x, weight[, weight_scale, x_scale])."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, hidden, device="cuda", generator=g)
    x = x * torch.exp2(torch.randint(-3, 4, (m, 1), device="cuda", generator=g).float())
    w = torch.randn(2 * inter, hidden, device="cuda", generator=g) * 0.05
    nb, kb = quant.cdiv(2 * inter, 128), quant.cdiv(hidden, 128)
    block_mag = torch.exp2(torch.randint(-3, 4, (nb, kb), device="cuda", generator=g).float())
    w = w * block_mag.repeat_interleave(128, 0).repeat_interleave(128, 1)[: 2 * inter, :hidden]
    x = x.to(torch.bfloat16)
    if mainloop == "bf16":
        return dict(x=x, weight=w.to(torch.bfloat16))
    xq, xs = reference.quant_x(x)
    wq, ws = quant.quantize_fp8_block(w)
    return dict(x=xq, weight=wq, weight_scale=ws, x_scale=xs)


def rel_frobenius(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def e4m3_ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|code(a) - code(b)| on the ordered e4m3 code line (sign-magnitude → monotone integer)."""
    def ordered(t):
        c = t.view(torch.uint8).to(torch.int32)
        mag = c & 0x7F
        return torch.where(c & 0x80 != 0, -mag, mag)

    return (ordered(a) - ordered(b)).abs()


def _scaled_mm_candidates(xq, xs, wq, ws, out_dtype):
    """torch._scaled_mm with the x scales M-major (quant.m_major); the weight-scale layouts torch versions accept."""
    yield lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=out_dtype)
    yield lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=out_dtype)


def block_gemm_reference(xq, xs, wq, ws):
    """fp32 x @ w^T of the block-scaled operands, dequantized: what a peer's GEMM is checked against."""
    return reference._dequant_operand(xq, xs, "x") @ reference.dequant_weight(wq, ws).t()


def cublas_gemm(xq, xs, wq, ws, out_dtype=torch.bfloat16):
    """A callable (xq, xs, wq, ws) → the packed [M, 2I] GEMM with cuBLAS block scales, where xs is
    M-major (``peer_sets``), with the weight-scale layout this torch accepts (checked once, on these
    operands), and its relative error."""
    xs = quant.m_major(xs)
    ref = block_gemm_reference(xq, xs, wq, ws)
    errors = []
    for i, fn in enumerate(_scaled_mm_candidates(xq, xs, wq, ws, out_dtype)):
        try:
            y = fn()
        except Exception as e:  # layout not accepted by this torch
            errors.append(str(e).splitlines()[0][:160])
            continue
        err = ((y.float() - ref).norm() / ref.norm()).item()
        if err < 1e-2:
            return (lambda *ops, i=i: list(_scaled_mm_candidates(*ops, out_dtype))[i]()), err
        errors.append(f"wrong result (rel err {err:.2e})")
    raise RuntimeError("torch._scaled_mm block-scaled: no layout worked: " + " | ".join(errors))


def peer_sets(sets):
    """Operand sets (xq, xs, wq, ws) with xs M-major (quant.m_major), as cublas_gemm's callable takes
    them. A quantization kernel writes that layout at no cost (vLLM's per-token-group quant has the
    option; our gate_up writes h_scale so), so the cuBLAS peers get it before timing, and no
    transpose copy is charged to them."""
    return [(xq, quant.m_major(xs), wq, ws) for xq, xs, wq, ws in sets]


def unfused_fp8(module, _shared=[]):
    """The unfused fp8 pipeline on ``module``'s packed fp8 weights (swiglu_fused.bench.UnfusedFP8),
    its compiled pieces shared by every call of this function in the process."""
    if not _shared:
        _shared.append(UnfusedFP8())
    return _shared[0].pipeline(module)


# ---------------------------------------------------------------------------------------------
# results


def write_json(path, chart=False, **results):
    """Results with when (UTC, ISO), on which GPU and with which torch they were measured, compact
    (4 significant digits, no spaces); nothing if no path. ``chart``: also NAME.png beside NAME.json
    (benchmarks/plot.py; a note instead where matplotlib is missing, and plot.py draws it later)."""
    if not path:
        return
    save_json(path, {**header(), **results})
    if chart:
        try:
            from benchmarks import plot
        except ImportError as e:
            print(f"no chart ({e}); later: python -m benchmarks.plot {path}")
            return
        print("wrote", plot.plot(Path(path)))
