"""The split projection's sm_90a kernel (kernels/sm90/split.py) against reference.gate_up_split:
y and h within bf16 rounding (DESIGN §4), the output poisoned first; the prefix/pair boundary both on
the 256-row tile grid and inside a tile (P = 128 mod 256); through ops, the module, CUDA graphs and
torch.compile."""

import pytest
import torch

from swiglu_fused import formats, quant
from swiglu_fused.kernels import dispatch, ops, reference
from swiglu_fused.kernels.pipeline import operands
from swiglu_fused.split_projection import FusedSplitProjection
from .tolerance import assert_bf16_close, rel_frobenius

pytest.importorskip("cutlass")

M_ISSUE = [1, 16, 4096, 4608]  # decode-sized M (64-row tile) and Flux.2's 4096 image + 512 text tokens
# (K, P, I): P = 384 puts the boundary inside the 256-row tile grid (the last prefix tile is half
# pair rows), K = 576 ends in half a k block; 3072 × (9216 | 2 · 9216) is Flux.2-klein-sized
SHAPES = [(1024, 384, 1536), (576, 1536, 768), (3072, 9216, 9216)]


def make_operands(m, k, p, i, mainloop, seed):
    """x with per-row magnitudes over 2^±3 and a packed weight whose 128×128 blocks vary alike
    (a wrong scale row shows up), the prefix rows another 4x larger than the pairs."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    x = (x * torch.exp2(torch.randint(-3, 4, (m, 1), device="cuda", generator=g).float())).to(torch.bfloat16)
    n = p + 2 * i
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    w[:p] *= 4
    mag = torch.exp2(torch.randint(-3, 4, (quant.cdiv(n, 128), quant.cdiv(k, 128)), device="cuda", generator=g).float())
    w = w * mag.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    if mainloop == "bf16":
        return dict(x=x, weight=w.to(torch.bfloat16))
    if mainloop == "nvfp4":  # three global scales of their own (prefix, gate, up), as convert makes them
        mod = FusedSplitProjection.from_weight(w, p, weight_format="nvfp4")
        weight, scale, gs = operands(formats.NVFP4, mod.tensors(), mod.global_scale_kind)
        return dict(x=x, weight=weight, weight_scale=scale, global_scale=gs)
    xq, xs = reference.quant_x(x)
    wq, ws = quant.quantize_fp8_block(w)
    return dict(x=xq, weight=wq, weight_scale=ws, x_scale=xs)


def assert_matches_reference(out, args, p, act):
    """y and h within bf16 rounding (nvfp4: 5e-3, its decode is exact and x is bf16 on both sides)."""
    y_ref, h_ref, _ = reference.gate_up_split(**args, prefix=p, act=act, h_format="bf16")
    assert out.shape == (y_ref.shape[0], p + h_ref.shape[1]) and out.dtype == torch.bfloat16
    tol = 5e-3 if args["weight"].dtype == torch.uint8 else 1e-2
    assert_bf16_close(out[:, :p], y_ref, tol)
    assert_bf16_close(out[:, p:], h_ref, tol)


def _backend(args, p, act="silu"):
    return dispatch.split_backend(args["x"], args["weight"], args.get("weight_scale"), args.get("x_scale"),
                                  args.get("global_scale"), p, 128, act)


@pytest.mark.parametrize("mainloop", ["bf16", "fp8_block128", "nvfp4"])
@pytest.mark.parametrize("m", M_ISSUE)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_split_kernel_matches_reference(mainloop, m, shape):
    from swiglu_fused.kernels.sm90 import split

    k, p, i = shape
    if mainloop == "nvfp4" and p % 256:
        pytest.skip("nvfp4's split kernel takes P a multiple of 256 (test_nvfp4_prefix_off_the_grid_runs_the_reference)")
    args = make_operands(m, k, p, i, mainloop, seed=m * 7 + p)
    backend, cfg = _backend(args, p)
    assert backend == dispatch.SM90 and cfg.prefix == p
    assert cfg.nvfp4_weight if mainloop == "nvfp4" else cfg.mainloop == mainloop  # (nvfp4 prefill: dequantized)
    out = torch.full((m, p + i), float("nan"), dtype=torch.bfloat16, device="cuda")
    split.gate_up_split(cfg, args["x"], args["weight"], args.get("weight_scale"), args.get("x_scale"),
                        args.get("global_scale"), out=out)
    assert_matches_reference(out, args, p, "silu")
    # the op runs the same kernel (dispatch picked cfg): bit-equal
    assert torch.equal(ops.gate_up_split(**args, prefix=p), out)


@pytest.mark.parametrize("mainloop", ["bf16", "fp8_block128"])
@pytest.mark.parametrize("tile_m", [64, 128])
def test_gelu_tanh_and_both_tiles(mainloop, tile_m):
    from swiglu_fused.kernels.sm90 import split

    k, p, i = SHAPES[0]
    args = make_operands(300, k, p, i, mainloop, seed=tile_m)
    cfg = split.SplitConfig(tile_m=tile_m, mainloop=mainloop, act="gelu_tanh", h_format="bf16", prefix=p)
    out = torch.full((300, p + i), float("nan"), dtype=torch.bfloat16, device="cuda")
    split.gate_up_split(cfg, args["x"], args["weight"], args.get("weight_scale"), args.get("x_scale"), out=out)
    assert_matches_reference(out, args, p, "gelu_tanh")


def test_nvfp4_gelu_tanh_and_the_global_scales():
    """Each of the three global scales multiplies its own columns: made unequal (prefix ×2, gate ×4,
    up ×0.5), against the reference, with GELU-tanh."""
    from swiglu_fused.kernels.sm90 import split

    k, p, i = SHAPES[1]
    args = make_operands(200, k, p, i, "nvfp4", seed=5)
    args["global_scale"] = args["global_scale"] * torch.tensor([2.0, 4.0, 0.5], device="cuda")
    backend, cfg = _backend(args, p, "gelu_tanh")
    assert backend == dispatch.SM90
    out = torch.full((200, p + i), float("nan"), dtype=torch.bfloat16, device="cuda")
    split.gate_up_split(cfg, args["x"], args["weight"], args["weight_scale"], None, args["global_scale"], out=out)
    assert_matches_reference(out, args, p, "gelu_tanh")


def test_nvfp4_prefix_off_the_grid_runs_the_reference():
    k, p, i = SHAPES[0]
    args = make_operands(16, k, p, i, "nvfp4", seed=1)
    dispatch._warn_reference_once.cache_clear()
    with pytest.warns(UserWarning, match="gate_up_split: the prefix has 384 rows, not a multiple of 256"):
        assert _backend(args, p) == (dispatch.REFERENCE, None)
    assert_matches_reference(ops.gate_up_split(**args, prefix=p), args, p, "silu")


@pytest.mark.parametrize("weight_format", ["bf16", "fp8_block128", "nvfp4"])
def test_module_graph_and_compile(weight_format):
    """FusedSplitProjection on the kernel: its output equals the reference path's within bf16
    rounding, a captured CUDA graph replays it exactly, and torch.compile(fullgraph=True) runs it."""
    k, p, i = 1024, 512, 1536
    g = torch.Generator().manual_seed(3)
    w = torch.randn(p + 2 * i, k, generator=g) * 0.05
    mod = FusedSplitProjection.from_weight(w, p, weight_format=weight_format).cuda()
    assert mod.backend == dispatch.SM90
    x = torch.randn(2, 700, k, device="cuda").to(torch.bfloat16)
    out = mod(x)
    ref = mod.cpu()(x.cpu()).cuda()
    mod.cuda()
    assert out.shape == (2, 700, p + i)
    assert_bf16_close(out[..., :p], ref[..., :p])
    assert_bf16_close(out[..., p:], ref[..., p:])

    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    mod(static_x)  # compiled and warmed outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        static_out = mod(static_x)
    static_x.copy_(x.flip(1))
    graph.replay()
    assert torch.equal(static_out, mod(x.flip(1)))

    compiled = torch.compile(mod, fullgraph=True)
    if weight_format == "nvfp4":  # inductor computes 1 / stored divisor itself (not bit-equal to eager's)
        assert rel_frobenius(compiled(x), out) < 1e-3
    else:
        assert torch.equal(compiled(x), out)


def test_flux2_dev_width_uses_a_shipped_config():
    """Flux.2-dev's single-stream projection (K = 6144, P = 18432, I = 18432) at 4608 tokens runs a
    configuration CI compile-checks, and matches the reference."""
    k, p, i, m = 6144, 18432, 18432, 4608
    args = make_operands(m, k, p, i, "fp8_block128", seed=11)
    backend, cfg = dispatch.split_backend(args["x"], args["weight"], args["weight_scale"], args["x_scale"], None, p,
                                          128, "silu")
    assert backend == dispatch.SM90 and cfg in dispatch.split_shipped()
    assert_matches_reference(ops.gate_up_split(**args, prefix=p), args, p, "silu")


@pytest.mark.parametrize("weight_format", ["bf16", "fp8_block128"])
def test_modules_take_row_strided_inputs(weight_format, monkeypatch):
    """SplitProjectionProcessor hands to_out [attention | h], a view whose rows are P + I apart: a
    packed module given such a view computes what it computes on the same values made contiguous."""
    from swiglu_fused.linear import PackedLinear

    k, p, i = 1024, 512, 1536
    g = torch.Generator().manual_seed(4)
    proj = FusedSplitProjection.from_weight(torch.randn(p + 2 * i, k, generator=g) * 0.05, p,
                                            weight_format=weight_format).cuda()
    out_linear = PackedLinear.from_weight(torch.randn(k, p // 2 + i, generator=g) * 0.05,
                                          weight_format=weight_format).cuda()
    x = torch.randn(300, k, device="cuda").to(torch.bfloat16)
    y = proj(x)
    view = y[:, p // 2:]  # [half the prefix | h]
    assert not view.is_contiguous()
    seen = []
    quant_x = ops.quant_x
    monkeypatch.setattr(ops, "quant_x", lambda t: seen.append(t.is_contiguous()) or quant_x(t))
    assert torch.equal(out_linear(view), out_linear(view.contiguous()))
    if weight_format == "fp8_block128":  # quant_x read the view in place
        assert seen == [False, True]
    wide = torch.randn(300, 2 * k, device="cuda").to(torch.bfloat16)
    assert torch.equal(proj(wide[:, :k]), proj(wide[:, :k].contiguous()))


def test_a_patched_flux2_block_on_the_gpu():
    """A diffusers single-stream block patched by patch_model (fp8), on the kernels: its attention
    module with our processor against diffusers' stock processor on the same modules (only to_out's
    input layout differs), the block against the unpatched bf16 block, eager and replayed from a
    CUDA graph."""
    pytest.importorskip("diffusers")
    from benchmarks import bench_flux2
    from swiglu_fused.integrations.diffusers import SplitProjectionProcessor

    models = bench_flux2.flux2_blocks(device="cuda", dim=1024, heads=8, head_dim=128, text=256)
    single, _ = bench_flux2.block_inputs(models["diffusers_bf16"], image=256, text=64)
    block = models["ours_fp8"].single_transformer_blocks[0]
    assert isinstance(block.attn.processor, SplitProjectionProcessor)
    assert block.attn.to_qkv_mlp_proj.backend == dispatch.SM90
    from diffusers.models.transformers import transformer_flux2 as flux2_module

    h = single["hidden_states"]
    with torch.no_grad():
        ours = block.attn(h, image_rotary_emb=single["image_rotary_emb"])
        processor = block.attn.processor
        block.attn.set_processor(flux2_module.Flux2ParallelSelfAttnProcessor())
        stock = block.attn(h, image_rotary_emb=single["image_rotary_emb"])
        block.attn.set_processor(processor)
        assert rel_frobenius(ours, stock) < 2e-3  # to_out reading V instead: ~1
        want = models["diffusers_bf16"].single_transformer_blocks[0](**single)
        got = block(**single)
        assert rel_frobenius(got - h, want - h) < 0.08
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = block(**single)
        graph.replay()
        assert torch.equal(static, got)


# ---------------------------------------------------------------- Flux.2's QK norms and rotary embedding
@pytest.mark.parametrize("t, s, heads", [(4608, 4608, 48), (2 * 300, 300, 3), (7, 7, 3), (1, 1, 1)])
def test_qk_norm_rope_kernel_against_the_reference(t, s, heads):
    """kernels/sm90/qk_norm_rope.py on Q and K read out of a wide projection output (Flux.2-dev's row
    stride at 4608 tokens; two sequences one after the other; an odd count of heads in all, so a warp
    holds a dead lane) against reference.qk_norm_rope: within a bf16 rounding of the norm's output
    (its sum of squares in another order), the output poisoned first; through ops, and in a CUDA graph."""
    from swiglu_fused.kernels.sm90 import qk_norm_rope as sm90_qk

    g = torch.Generator(device="cuda").manual_seed(t + heads)
    inner = heads * 128
    y = (torch.randn(t, 3 * inner + 4 * 128, device="cuda", generator=g) * 4).to(torch.bfloat16)
    q, k = y[:, :inner], y[:, inner:2 * inner]
    wq, wk = ((torch.rand(128, device="cuda", generator=g) + 0.5).to(torch.bfloat16) for _ in range(2))
    angles = torch.rand(s, 64, device="cuda", generator=g) * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    assert sm90_qk.takes(q, k, wq, wk, cos, sin)
    want = reference.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6)
    out = torch.full((2, t, inner), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = sm90_qk.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6, out=out)
    assert got.data_ptr() == out.data_ptr() and not got.isnan().any()
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=2 ** -6)
    assert rel_frobenius(got, want) < 2e-3 and (got == want).float().mean() > 0.9
    assert torch.equal(ops.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6), got)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = ops.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6)
    graph.replay()
    assert torch.equal(static, got)


def test_a_patched_flux2_double_stream_block_on_the_gpu():
    """A diffusers double-stream block patched by patch_model (bf16): its attention with
    DoubleStreamProcessor (the QK steps on the qk_norm_rope kernel) against diffusers' stock processor
    on the same modules, the block against the unpatched one, eager and replayed from a CUDA graph."""
    pytest.importorskip("diffusers")
    from diffusers.models.transformers import transformer_flux2 as flux2_module

    from benchmarks import bench_flux2
    from swiglu_fused.integrations.diffusers import DoubleStreamProcessor

    models = bench_flux2.flux2_blocks(device="cuda", dim=1024, heads=8, head_dim=128, text=256, formats=("bf16",))
    _, double = bench_flux2.block_inputs(models["diffusers_bf16"], image=256, text=64)
    block = models["ours_bf16"].transformer_blocks[0]
    assert isinstance(block.attn.processor, DoubleStreamProcessor)
    img, txt, rotary = double["hidden_states"], double["encoder_hidden_states"], double["image_rotary_emb"]
    with torch.no_grad():
        ours = block.attn(img, txt, image_rotary_emb=rotary)
        processor = block.attn.processor
        block.attn.set_processor(flux2_module.Flux2AttnProcessor())
        stock = block.attn(img, txt, image_rotary_emb=rotary)
        block.attn.set_processor(processor)
        assert all(rel_frobenius(a, b) < 2e-3 for a, b in zip(ours, stock))
        want = models["diffusers_bf16"].transformer_blocks[0](**double)
        got = block(**double)
        assert all(rel_frobenius(a, b) < 0.02 for a, b in zip(got, want))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = block(**double)
        graph.replay()
        assert all(torch.equal(a, b) for a, b in zip(static, got))


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block128"])
def test_patched_flux2_blocks_compile_with_inductor(fmt):
    """torch.compile (inductor, fullgraph) of a patched single- and double-stream block, as diffusers
    suggests compiling a Flux transformer: our custom ops stay opaque to inductor, which fuses the
    blocks' own elementwise steps, so the outputs agree with the eager blocks to bf16 rounding."""
    pytest.importorskip("diffusers")
    from benchmarks import bench_flux2

    models = bench_flux2.flux2_blocks(device="cuda", dim=1024, heads=8, head_dim=128, text=256, formats=(fmt,))
    model = models[{"bf16": "ours_bf16", "fp8_block128": "ours_fp8"}[fmt]]
    single, double = bench_flux2.block_inputs(models["diffusers_bf16"], image=256, text=64)
    with torch.no_grad():
        for block, kwargs in ((model.single_transformer_blocks[0], single), (model.transformer_blocks[0], double)):
            want = block(**kwargs)
            torch._dynamo.reset()
            got = torch.compile(block, fullgraph=True)(**kwargs)
            want, got = (w if isinstance(w, tuple) else (w,) for w in (want, got))
            assert all(rel_frobenius(a, b) < 1e-2 for a, b in zip(got, want))
