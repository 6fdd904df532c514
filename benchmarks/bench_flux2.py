"""Flux.2-dev's MLP work on one GPU (issue 24): a single-stream block's projection and a
double-stream block's feed-forward, ours against diffusers' own bf16 computation and an unfused fp8
pipeline, in one process on the same inputs (CUDA graphs, medians of interleaved rounds).

Single-stream (dim 6144, 48 heads × 128, mlp_hidden 18432; M = image + 512 text tokens):
    diffusers_bf16   to_qkv_mlp_proj (one Linear [Q; K; V; gate; up]), split, Flux2SwiGLU
                     (SiLU(first half) · second half), cat([attention, h]) as its processor runs them
    unfused_fp8      quant_x, cuBLAS's block-scaled GEMM of the same rows, then diffusers' split,
                     Flux2SwiGLU and cat on its bf16 output
    ours_bf16/fp8/nvfp4  (quant_x,) the split GEMM writing [QKV | h], then what our processor
                     (SplitProjectionProcessor) does instead of the cat: the attention output
                     copied over V's columns, so that to_out reads [attention | h] in place
  ``attention`` is a stand-in tensor [M, 6144]: the attention itself is the same on every side.
  Also timed: each GEMM alone (cuBLAS's bf16 F.linear, ours with quant_x), ours with the
  dispatched cluster pairs turned off (``*_cluster1``, the A/B of DISPATCH D25) and with the
  config fields of ``--ab`` replaced (``*_ab0``, ``*_ab1``, …), and the
  processor's cat alone, of our h view and of a contiguous h.
Double-stream feed-forward (Flux2FeedForward: linear_in [2 · 18432, 6144] halves [gate; up],
Flux2SwiGLU, linear_out; M = image tokens): diffusers_bf16, the unfused fp8 pipeline of
swiglu_fused.bench (cuBLAS GEMMs, separate act·quant), ours bf16, fp8 and nvfp4 (FusedSwiGLUMLP).

Whole blocks (where diffusers is importable; ``--blocks``): one Flux2SingleTransformerBlock and one
Flux2TransformerBlock of a Flux.2-dev-width Flux2Transformer2DModel (random weights), diffusers'
own modules in bf16 against copies patched by ``swiglu_fused.patch_model`` (bf16, fp8, nvfp4);
M = image + 512 text tokens, attention on torch's SDPA (diffusers' default backend); with ``--compile``
also each block under torch.compile (inductor fuses diffusers' elementwise steps on both sides).

diffusers is not installed on our GPU machine (a run carries the modules it imports, see
benchmarks/README.md), so the projection-level diffusers_bf16 is its forward written with the same
torch calls (tests/test_flux2.py checks it equal to diffusers' modules on the CPU).

    python -m benchmarks.bench_flux2 [--single-m 1536,4608] [--ff-m 1024,4096] [--blocks 4096] [--compile]
                                     [--rounds 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util

import torch
import torch.nn.functional as F

from swiglu_fused import FusedSwiGLUMLP, formats
from benchmarks.harness import parse_variant
from swiglu_fused.bench import UnfusedFP8, header, interleaved_us, parse_ms, quant_x_m_major, save_json
from swiglu_fused.interleave import deinterleave_block_scales, deinterleave_rows
from swiglu_fused.kernels import dispatch, ops
from swiglu_fused.kernels.pipeline import operands
from swiglu_fused.split_projection import FusedSplitProjection

FORMATS = ("bf16", "fp8_block128", "nvfp4")
SHORT = {"bf16": "bf16", "fp8_block128": "fp8", "nvfp4": "nvfp4"}

DIM, INNER, MLP_HIDDEN = 6144, 48 * 128, 18432
TEXT = 512  # text tokens beside the image's in a single-stream block
PREFIX = 3 * INNER


def flux2_swiglu(x: torch.Tensor) -> torch.Tensor:
    """diffusers' Flux2SwiGLU.forward."""
    half = x.shape[-1] // 2
    return F.silu(x[..., :half]) * x[..., half:]


def diffusers_single(x, weight, attention, prefix: int = PREFIX):
    """What diffusers' single-stream processor runs around its attention: (qkv, to_out's input)."""
    y = F.linear(x, weight)
    qkv, mlp = torch.split(y, [prefix, y.shape[-1] - prefix], dim=-1)
    return qkv, torch.cat([attention, flux2_swiglu(mlp)], dim=-1)


def diffusers_ff(x, w_in, w_out):
    """Flux2FeedForward.forward."""
    return F.linear(flux2_swiglu(F.linear(x, w_in)), w_out)


def _weights(seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w_single = (torch.randn(PREFIX + 2 * MLP_HIDDEN, DIM, device="cuda", generator=g) * DIM ** -0.5).to(torch.bfloat16)
    w_in = (torch.randn(2 * MLP_HIDDEN, DIM, device="cuda", generator=g) * DIM ** -0.5).to(torch.bfloat16)
    w_out = (torch.randn(DIM, MLP_HIDDEN, device="cuda", generator=g) * MLP_HIDDEN ** -0.5).to(torch.bfloat16)
    return w_single, w_in, w_out


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def single_stream(w_single, ms, rounds, iters, ab=()):
    mods = {f: FusedSplitProjection.from_weight(w_single.float(), PREFIX, weight_format=f).cuda() for f in FORMATS}
    fp8 = mods["fp8_block128"].tensors()
    quantize = torch.compile(quant_x_m_major, dynamic=False)
    # cuBLAS reads the same e4m3 rows in the source's order: the prefix, then gate and up de-interleaved
    g_q, u_q = deinterleave_rows(fp8["weight"][PREFIX:], 128)
    w_q = torch.cat([fp8["weight"][:PREFIX], g_q, u_q]).contiguous()
    g_s, u_s = deinterleave_block_scales(fp8["weight_scale_inv"][PREFIX // 128:], 128)
    w_s = torch.cat([fp8["weight_scale_inv"][:PREFIX // 128], g_s, u_s]).contiguous()

    def unfused(x, attention):
        xq, xs = quantize(x)
        y = torch._scaled_mm(xq, w_q.t(), scale_a=xs, scale_b=w_s.t(), out_dtype=torch.bfloat16)
        qkv, mlp = torch.split(y, [PREFIX, y.shape[-1] - PREFIX], dim=-1)
        return qkv, torch.cat([attention, flux2_swiglu(mlp)], dim=-1)

    def ours(fmt):
        def run(x, attention):
            out = mods[fmt](x)
            to_out_input = out[:, 2 * INNER:]  # SplitProjectionProcessor: [V | h] with V spent
            ops.copy_into(to_out_input[:, :INNER], attention)
            return out[:, :PREFIX], to_out_input
        return run

    rows = []
    for m in ms:
        x = torch.randn(m, DIM, device="cuda").to(torch.bfloat16)
        attention = torch.randn(m, INNER, device="cuda").to(torch.bfloat16)
        out = mods["bf16"](x)
        h = out[:, PREFIX:].contiguous()
        fns = {"diffusers_bf16": lambda: diffusers_single(x, w_single, attention),
               "unfused_fp8": lambda: unfused(x, attention),
               "cublas_bf16_gemm_alone": lambda: F.linear(x, w_single),
               # the processor's cat alone: of our h (a view, rows P + I apart), and of a contiguous h
               "cat_of_our_h_view": lambda: torch.cat([attention, out[:, PREFIX:]], dim=-1),
               "cat_of_contiguous_h": lambda: torch.cat([attention, h], dim=-1),
               "contiguous_of_our_h_view": lambda: out[:, PREFIX:].contiguous(),
               "cat_after_contiguous": lambda: torch.cat([attention, out[:, PREFIX:].contiguous()], dim=-1)}
        for f in FORMATS:
            fns[f"ours_{SHORT[f]}"] = (lambda f: lambda: ours(f)(x, attention))(f)
            fns[f"ours_{SHORT[f]}_proj_alone"] = (lambda f: lambda: mods[f](x))(f)
            for suffix, fields in (("cluster1", dict(cluster_m=1)), *((f"ab{i}", v) for i, v in enumerate(ab))):
                try:
                    variant = _variant(mods[f], x, fields)
                except Exception as e:  # a field this format's kernel does not take
                    print(f"  {f} {fields}: not timed ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
                    continue
                if variant:
                    fns[f"ours_{SHORT[f]}_proj_alone_{suffix}"] = variant
        ref = diffusers_single(x, w_single, attention)
        err = {name: _single_err(fns[name](), ref) for name in ("unfused_fp8", *(f"ours_{SHORT[f]}" for f in FORMATS))}
        per_round = interleaved_us(fns, iters, rounds)
        rows.append(_row("single_stream", m, per_round, err))
    return rows


def _single_err(got, ref) -> float:
    """Of Q and K (V's columns hold the attention once our processor has run) and to_out's input."""
    (qkv, to_out_input), (ref_qkv, ref_to_out_input) = got, ref
    return max(_rel(qkv[:, :2 * INNER], ref_qkv[:, :2 * INNER]), _rel(to_out_input, ref_to_out_input))


def _variant(mod, x, fields):
    """The module's projection on its dispatched config with ``fields`` replaced (None where that
    changes nothing, e.g. cluster_m = 1 where the dispatch picks no cluster pair): quant_x, then the
    split kernel called directly. Its largest difference to the dispatched config's output is
    printed first (config variants of one mainloop are bit-identical: 0)."""
    from swiglu_fused.kernels.sm90 import split

    fmt = mod.weight_format
    weight, scale, gs = operands(formats.weight_format(fmt), mod.tensors(), mod.global_scale_kind)
    xq, xs = ops.quant_x(x) if fmt == "fp8_block128" else (x, None)
    _, cfg = dispatch.split_backend(xq, weight, scale, xs, gs, PREFIX, 128, "silu")
    if cfg is None or dataclasses.replace(cfg, **fields) == cfg:
        return None
    dispatched, cfg = cfg, dataclasses.replace(cfg, **fields)
    diff = (split.gate_up_split(cfg, xq, weight, scale, xs, gs).float()
            - split.gate_up_split(dispatched, xq, weight, scale, xs, gs).float()).abs().max().item()
    print(f"  {fmt} {fields}: max |difference| to the dispatched config {diff:.3g}", flush=True)

    def run():
        q, s = ops.quant_x(x) if fmt == "fp8_block128" else (x, None)
        return split.gate_up_split(cfg, q, weight, scale, s, gs)
    return run


def feed_forward(w_in, w_out, ms, rounds, iters):
    gate, up = w_in[:MLP_HIDDEN], w_in[MLP_HIDDEN:]
    mods = {f: FusedSwiGLUMLP.from_linear(gate, up, w_out, weight_format=f).cuda() for f in FORMATS}
    unfused = UnfusedFP8().pipeline(mods["fp8_block128"])
    rows = []
    for m in ms:
        x = torch.randn(m, DIM, device="cuda").to(torch.bfloat16)
        fns = {"diffusers_bf16": lambda: diffusers_ff(x, w_in, w_out), "unfused_fp8": lambda: unfused(x)}
        fns.update({f"ours_{SHORT[f]}": (lambda f: lambda: mods[f](x))(f) for f in FORMATS})
        ref = fns["diffusers_bf16"]()
        err = {name: _rel(fns[name](), ref) for name in fns if name != "diffusers_bf16"}
        rows.append(_row("feed_forward", m, interleaved_us(fns, iters, rounds), err))
    return rows


# ---------------------------------------------------------------- whole blocks (diffusers' own modules)
def flux2_blocks(device="cuda", dim: int = DIM, heads: int = 48, head_dim: int = 128, text: int = 15360,
                 formats=FORMATS):
    """{name: a Flux2Transformer2DModel with one double- and one single-stream block}: diffusers'
    bf16 model (random weights) and copies patched to each of ``formats``."""
    import copy

    import swiglu_fused
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(0)
    with torch.device(device):
        model = Flux2Transformer2DModel(num_layers=1, num_single_layers=1, num_attention_heads=heads,
                                        attention_head_dim=head_dim, joint_attention_dim=text,
                                        axes_dims_rope=(head_dim // 4,) * 4)
    models = {"diffusers_bf16": model.to(torch.bfloat16).eval()}
    for f in formats:
        models[f"ours_{SHORT[f]}"] = patched = copy.deepcopy(models["diffusers_bf16"])
        swiglu_fused.patch_model(patched, weight_format=f)
    return models


def block_inputs(model, image: int, text: int = TEXT, seed: int = 0):
    """(single-stream kwargs, double-stream kwargs) for ``image`` + ``text`` tokens of batch 1."""
    g = torch.Generator(device=model.device).manual_seed(seed)
    dim = model.inner_dim

    def randn(*shape):
        return torch.randn(*shape, device=model.device, generator=g).to(torch.bfloat16)

    side = max(d for d in range(1, int(image ** 0.5) + 1) if image % d == 0)  # a side × image/side grid
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(float(side)), torch.arange(float(image // side)),
                                         torch.zeros(1), indexing="ij"), -1).reshape(-1, 4)
    txt_ids = torch.zeros(text, 4)
    txt_ids[:, 3] = torch.arange(float(text))
    with torch.no_grad():
        rotary = model.pos_embed(torch.cat([txt_ids, img_ids]).to(model.device))
        temb = randn(1, dim)
        single = dict(hidden_states=randn(1, text + image, dim), encoder_hidden_states=None,
                      temb_mod=model.single_stream_modulation(temb), image_rotary_emb=rotary)
        double = dict(hidden_states=randn(1, image, dim), encoder_hidden_states=randn(1, text, dim),
                      temb_mod_img=model.double_stream_modulation_img(temb),
                      temb_mod_txt=model.double_stream_modulation_txt(temb), image_rotary_emb=rotary)
    return single, double


def block_wrapper(compiled: bool):
    """How a block runs: as it is, or (``compiled``) in torch.compile(fullgraph=True), inductor, as
    diffusers suggests for Flux (whole_blocks, profile_flux2)."""
    return (lambda b: torch.compile(b, fullgraph=True)) if compiled else (lambda b: b)


def whole_blocks(images, rounds, iters, compiled=False):
    """Each block of ``flux2_blocks`` timed per format; ``compiled``: each wrapped by block_wrapper
    first, rows *_compiled."""
    models = flux2_blocks()
    wrap = block_wrapper(compiled)
    rows = []
    for image in images:
        single, double = block_inputs(models["diffusers_bf16"], image)
        for block, kwargs, pick in (("single_block", single, lambda m: m.single_transformer_blocks[0]),
                                    ("double_block", double, lambda m: m.transformer_blocks[0])):
            tokens = image + (TEXT if block == "single_block" else 0)
            block += "_compiled" if compiled else ""
            fns = {name: (lambda b: lambda: b(**kwargs))(wrap(pick(m))) for name, m in models.items()}
            with torch.no_grad():
                ref = fns["diffusers_bf16"]()
                err = {name: max(_rel(a, b) for a, b in zip(_tuple(fn()), _tuple(ref)))
                       for name, fn in fns.items() if name != "diffusers_bf16"}
                rows.append(_row(block, tokens, interleaved_us(fns, iters, rounds), err))
    return rows


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _row(block, m, per_round, err) -> dict:
    med = {f"{k}_us": sorted(v)[len(v) // 2] for k, v in per_round.items()}
    base = med["diffusers_bf16_us"]
    row = dict(block=block, m=m, **med, per_round=per_round, rel_err_vs_diffusers_bf16=err,
               **{f"speedup_{s}": base / med[f"ours_{s}_us"] for s in SHORT.values()})
    if "unfused_fp8_us" in med:
        row["fp8_over_unfused"] = med["unfused_fp8_us"] / med["ours_fp8_us"]
    print(f"{block:14s} M = {m:5d}: " + ", ".join(f"{k[:-3]} {v:.0f}" for k, v in med.items())
          + " µs; over diffusers bf16: " + ", ".join(f"ours {s} {row[f'speedup_{s}']:.3f}×" for s in SHORT.values())
          + (f"; ours fp8 over unfused fp8 {row['fp8_over_unfused']:.3f}×" if "fp8_over_unfused" in row else "")
          + "; rel err " + ", ".join(f"{k} {v:.2e}" for k, v in err.items()), flush=True)
    return row


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["diffusers_bf16", "ours_bf16", "unfused_fp8", "ours_fp8", "ours_nvfp4"]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for j, name in enumerate(names):
        ax.bar([i + 0.16 * j for i in range(len(rows))], [r.get(f"{name}_us", 0) / 1000 for r in rows], 0.16,
               label=name)
    ax.set_xticks([i + 0.32 for i in range(len(rows))], [f"{r['block']}\nM={r['m']}" for r in rows], fontsize=7)
    ax.set(ylabel="ms", title=f"Flux.2-dev MLP work ({torch.cuda.get_device_name()}, CUDA graphs)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--single-m", default="1536,4608",
                    help="tokens of a single-stream block (image + 512 text; '' to skip)")
    ap.add_argument("--ff-m", default="1024,4096", help="image tokens of a double-stream feed-forward ('' to skip)")
    ap.add_argument("--blocks", default="4096",
                    help="image tokens of the whole-block timings (diffusers' modules; '' to skip)")
    ap.add_argument("--compile", action="store_true",
                    help="time the whole blocks under torch.compile (inductor, fullgraph) too, diffusers' and ours")
    ap.add_argument("--ab", action="append", default=[], metavar="FIELD=VALUE,...",
                    help="also time each format's split projection alone on its dispatched config with these "
                         "SplitConfig fields replaced (ours_*_proj_alone_ab0, ab1, ... in the order given)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="write every number here, and the chart beside it (.png)")
    args = ap.parse_args()
    w_single, w_in, w_out = _weights(0)
    rows = single_stream(w_single, parse_ms(args.single_m), args.rounds, args.iters,
                         [parse_variant(f"ab:{v}")[1] for v in args.ab]) if args.single_m else []
    del w_single
    if args.ff_m:
        rows += feed_forward(w_in, w_out, parse_ms(args.ff_m), args.rounds, args.iters)
    del w_in, w_out
    if args.blocks and importlib.util.find_spec("diffusers") is None:
        print("whole blocks skipped: diffusers is not installed (pip install diffusers)")
    elif args.blocks:
        rows += whole_blocks(parse_ms(args.blocks), args.rounds, args.iters)
        if args.compile:
            rows += whole_blocks(parse_ms(args.blocks), args.rounds, args.iters, compiled=True)
    if args.json:
        save_json(args.json, dict(header(), rows=rows))
        plot(rows, args.json.removesuffix(".json") + ".png")


if __name__ == "__main__":
    main()
