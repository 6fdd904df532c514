"""Flux.2 end to end (issue 24) on a tiny real diffusers Flux2Transformer2DModel (2 double-stream
blocks, 1 single-stream block; dim 128, mlp_hidden 384, so to_qkv_mlp_proj is [384 QKV; 384 gate;
384 up] x 128): conversion of both block kinds, the split projection's reference, patch_model,
from_pretrained / save_pretrained, and bit-exact repacking of compressed-tensors FP8 / NVFP4."""

import copy
import json
import subprocess
import sys

import pytest
import torch

import swiglu_fused
from swiglu_fused import formats, split_interleave
from swiglu_fused.integrations.diffusers import AppliedInProjection, DoubleStreamProcessor, SplitProjectionProcessor
from swiglu_fused.kernels import ops, reference
from swiglu_fused.layer import FusedSwiGLUMLP
from swiglu_fused.linear import PackedLinear
from swiglu_fused.split_projection import FusedSplitProjection
from swiglu_fused.weight_packing import safetensors_io as sio
from swiglu_fused.weight_packing.convert import convert
from swiglu_fused.weight_packing.verify import verify

from conftest import make_ct_fp8_block, make_ct_nvfp4, make_flux2

FORMATS = ["bf16", "fp8_block128", "nvfp4"]
# relative Frobenius error against the unpatched bf16 model: one block's attention module (QKV,
# attention, h, to_out: the split projection's whole consumer) and the whole transformer's output
BLOCK_BOUND = {"bf16": 0.01, "fp8_block128": 0.08, "nvfp4": 0.2}
MODEL_BOUND = {"bf16": 0.01, "fp8_block128": 0.03, "nvfp4": 0.05}
SPLIT = "single_transformer_blocks.0.attn.to_qkv_mlp_proj"
FFS = ["transformer_blocks.0.ff", "transformer_blocks.0.ff_context", "transformer_blocks.1.ff",
       "transformer_blocks.1.ff_context"]


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), torch.zeros(1),
                                         indexing="ij"), -1).reshape(-1, 4)
    txt_ids = torch.zeros(8, 4)
    txt_ids[:, 3] = torch.arange(8.0)
    return dict(hidden_states=torch.randn(1, 16, 16, generator=g).bfloat16(),
                encoder_hidden_states=torch.randn(1, 8, 32, generator=g).bfloat16(),
                timestep=torch.tensor([0.5]), img_ids=img_ids, txt_ids=txt_ids, guidance=torch.tensor([3.5]))


def _run(model, x):
    with torch.no_grad():
        return model(**x).sample


def _attn(model, h):
    with torch.no_grad():
        return model.single_transformer_blocks[0].attn(h)


@pytest.fixture(scope="module")
def flux2(tmp_path_factory):
    src = tmp_path_factory.mktemp("flux2") / "src"
    return src, make_flux2(src)


def _loaded(path):
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel.from_pretrained(path, torch_dtype=torch.bfloat16).eval()


# ---------------------------------------------------------------- the reference of the split projection
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("g", [128, 64])
def test_reference_split_is_prefix_then_act_times_up(fmt, g):
    if formats.interleave_problem(g, formats.weight_format(fmt)):
        pytest.skip(f"g={g} is not a {fmt} interleave")
    torch.manual_seed(0)
    prefix, inter, k = 256, 384, 192  # K not a multiple of 128: partial fp8 column blocks
    w = torch.randn(prefix + 2 * inter, k) / k ** 0.5
    f = formats.weight_format(fmt)
    kind = formats.DIVISOR if f.global_scale_name else None
    t = split_interleave.quantize_split(w, prefix, g, f, "w", kind)
    wq = torch.cat([f.dequantize(part, kind) for part in split_interleave.unpack_split(t, prefix, g, f)])
    x = torch.randn(7, k).bfloat16()
    acc = x.float() @ wq.t()  # the quantized operands in the source's row order
    xq, x_scale = (reference.quant_x(x) if f.quantizes_x else (x, None))
    if f.quantizes_x:
        acc = reference._dequant_operand(xq, x_scale, "x") @ wq.t()
    gs = 1.0 / t["weight_global_scale"] if f.global_scale_name else None
    y, h, h_scale = reference.gate_up_split(xq, t[f.weight_name], t.get(f.scale_name), x_scale, gs,
                                            prefix=prefix, interleave=g, act="silu", h_format=f.h_format)
    assert y.dtype == torch.bfloat16 and y.shape == (7, prefix)
    torch.testing.assert_close(y, acc[:, :prefix].bfloat16(), rtol=0, atol=0)
    expected_h = torch.nn.functional.silu(acc[:, prefix:prefix + inter]) * acc[:, prefix + inter:]
    got_h = h.float() if h_scale is None else reference._dequant_operand(h, h_scale, "h")
    assert _rel(got_h, expected_h) < (0.08 if h_scale is not None else 0.01)
    assert (h_scale is not None) == (f.h_format == "fp8_group128")


def test_reference_split_refuses_a_prefix_that_breaks_the_pairs_or_a_block():
    w = torch.zeros(128 + 2 * 256, 128).bfloat16()
    with pytest.raises(ValueError, match="prefix: 200 rows"):
        reference.gate_up_split(torch.zeros(1, 128).bfloat16(), w, prefix=200, interleave=128)
    q = torch.zeros(64 + 2 * 256, 128, dtype=formats.FP8_DTYPE)
    with pytest.raises(ValueError, match="not a multiple of 128"):
        reference.gate_up_split(torch.zeros(1, 128, dtype=formats.FP8_DTYPE), q, torch.ones(5, 1),
                                torch.ones(1, 1), prefix=64, interleave=128)


def test_split_packing_round_trips_every_format():
    torch.manual_seed(1)
    w = torch.randn(384 + 2 * 256, 128)
    for fmt in FORMATS:
        f = formats.weight_format(fmt)
        t = split_interleave.quantize_split(w, 384, 128, f, "w", formats.DIVISOR if f.global_scale_name else None)
        again = split_interleave.pack_split(*split_interleave.unpack_split(t, 384, 128, f), 128, f)
        assert t.keys() == again.keys() and all(torch.equal(t[k], again[k]) for k in t), fmt
        if f.global_scale_name:
            assert t[f.global_scale_name].shape == (3,)  # prefix, gate, up: each segment its own


# ---------------------------------------------------------------- conversion
@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_packs_every_block(tmp_path, flux2, fmt):
    src, _ = flux2
    dst = tmp_path / "dst"
    report = convert(src, dst, weight_format=fmt, progress=False)
    assert report.modules == FFS and report.splits == [SPLIT]
    cfg = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert cfg[formats.K_SPLIT] == {SPLIT: 384}  # 3 · inner: Q, K, V rows
    checked = verify(dst, against=src)
    assert checked.ok, checked.summary()
    assert {c.projection for c in checked.checks if c.module == SPLIT} == {"prefix", "gate", "up"}
    names = {n for f in sio.checkpoint_files(dst) for n in sio.read_header(f).entries}
    assert f"{SPLIT}.{formats.SPLIT}.{formats.weight_format(fmt).weight_name}" in names
    assert f"{SPLIT}.weight" not in names  # not a Linear's name: an unpatched model never runs the packed rows
    assert "single_transformer_blocks.0.attn.to_out.weight" in names  # over cat([attention, h]): unchanged


def test_inspect_lists_the_split_projections(tmp_path, flux2, capsys):
    from swiglu_fused.cli import main

    dst = tmp_path / "dst"
    convert(flux2[0], dst, weight_format="fp8_block128", progress=False)
    assert main(["inspect", str(dst)]) == 0
    out = capsys.readouterr().out
    line = next(li for li in out.splitlines() if li.startswith(SPLIT))
    assert line.split()[1:5] == ["fp8_block128", "384", "384", "128"]  # format, prefix rows, I, in
    assert "1 split projections" in out and "4 MLPs" in out


def test_convert_refuses_an_fp8_prefix_off_the_128_row_blocks(tmp_path):
    from diffusers import Flux2Transformer2DModel

    src = tmp_path / "src"  # heads 1 x 64: Q, K, V = 192 rows, 1.5 fp8 blocks
    Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=64,
                            num_attention_heads=1, joint_attention_dim=32, timestep_guidance_channels=32,
                            mlp_ratio=2.0, axes_dims_rope=(16, 16, 16, 16)).save_pretrained(src)
    with pytest.raises(formats.FormatError, match=r"to_qkv_mlp_proj .*prefix of 192 rows is not a multiple of 128"):
        convert(src, tmp_path / "dst", weight_format="fp8_block128", progress=False)
    assert not (tmp_path / "dst").exists()
    assert verify(convert(src, tmp_path / "bf16", weight_format="bf16", progress=False).dst, against=src).ok


@pytest.mark.parametrize("make", [make_ct_fp8_block, make_ct_nvfp4], ids=["ct-fp8-block", "ct-nvfp4"])
def test_compressed_tensors_sources_repack_bit_exactly_and_run(tmp_path, make):
    """compressed-tensors' own compressor applied to the diffusers model: every Linear quantized
    (the single-stream to_qkv_mlp_proj with one global scale for [Q; K; V; gate; up])."""
    reference_model = make_flux2(tmp_path / "bf16")
    src = tmp_path / "src"
    make(src, make_flux2(tmp_path / "bf16-again"))
    report = convert(src, tmp_path / "dst", progress=False)
    assert report.splits == [SPLIT] and report.quantized == 0 and report.repacked == 15
    checked = verify(tmp_path / "dst", against=src)
    assert checked.ok and all(c.mode == "bit-exact" for c in checked.checks), checked.summary()
    model = _loaded(tmp_path / "dst")
    assert isinstance(model.single_transformer_blocks[0].attn.to_out, PackedLinear)
    fmt = report.weight_format
    x = _inputs()
    # every Linear of the model is quantized here (embedders, modulation, proj_out too): the format's bound
    assert _rel(_run(model, x), _run(reference_model, x)) < BLOCK_BOUND[fmt]


# ---------------------------------------------------------------- diffusers runtime
@pytest.mark.parametrize("fmt", FORMATS)
def test_patch_save_load_and_convert_agree(tmp_path, flux2, fmt):
    src, model = flux2
    x = _inputs()
    h = torch.randn(2, 24, 128).bfloat16()
    expected, expected_attn = _run(model, x), _attn(model, h)
    patched = copy.deepcopy(model)
    report = swiglu_fused.patch_model(patched, weight_format=fmt)
    assert report.swapped == FFS and report.split_projections == [SPLIT] and not report.skipped
    attn = patched.single_transformer_blocks[0].attn
    assert isinstance(attn.to_qkv_mlp_proj, FusedSplitProjection) and isinstance(attn.mlp_act_fn, AppliedInProjection)
    assert isinstance(attn.processor, SplitProjectionProcessor)
    assert report.processors == ["transformer_blocks.0.attn", "transformer_blocks.1.attn"]
    assert isinstance(patched.transformer_blocks[1].attn.processor, DoubleStreamProcessor)
    assert isinstance(patched.transformer_blocks[1].ff_context, FusedSwiGLUMLP)
    got, got_attn = _run(patched, x), _attn(patched, h)
    assert _rel(got_attn, expected_attn) < BLOCK_BOUND[fmt]
    assert _rel(got, expected) < MODEL_BOUND[fmt]

    patched.save_pretrained(tmp_path / "saved")
    assert verify(tmp_path / "saved").ok
    assert torch.equal(_run(_loaded(tmp_path / "saved"), x), got)
    convert(src, tmp_path / "converted", weight_format=fmt, progress=False)
    loaded = _loaded(tmp_path / "converted")
    assert isinstance(loaded.single_transformer_blocks[0].attn.processor, SplitProjectionProcessor)
    assert all(isinstance(b.attn.processor, DoubleStreamProcessor) for b in loaded.transformer_blocks)
    assert torch.equal(_run(loaded, x), got)  # convert and patch_model quantize alike
    # loaded again and saved again: the same checkpoint
    loaded.save_pretrained(tmp_path / "resaved")
    assert torch.equal(_run(_loaded(tmp_path / "resaved"), x), got)


def test_the_split_projection_is_what_the_block_computes(flux2):
    """The test can fail: packed rows read as diffusers' [gate; up] halves (no interleave) or with
    gate and up swapped change the block's output far beyond the bound."""
    _, model = flux2
    h = torch.randn(2, 24, 128).bfloat16()
    expected = _attn(model, h)
    patched = copy.deepcopy(model)
    swiglu_fused.patch_model(patched, weight_format="bf16", interleave=64)
    assert _rel(_attn(patched, h), expected) < BLOCK_BOUND["bf16"]
    proj = patched.single_transformer_blocks[0].attn.to_qkv_mlp_proj
    proj.interleave = 128  # rows packed at g = 64 read as g = 128
    assert _rel(_attn(patched, h), expected) > 0.1


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_single_stream_processor_skips_the_concatenation_and_changes_nothing(flux2, fmt):
    """SplitProjectionProcessor writes the attention output over V's columns and hands to_out that
    view: bit for bit what diffusers' stock processor (which concatenates) and its KV-cache twin
    compute on the same patched modules; the backend set_attention_backend names reaches it."""
    from diffusers.models.transformers import transformer_flux2 as flux2_module

    _, model = flux2
    patched = copy.deepcopy(model)
    swiglu_fused.patch_model(patched, weight_format=fmt)
    attn = patched.single_transformer_blocks[0].attn
    ours = attn.processor
    h = torch.randn(2, 24, 128).bfloat16()
    rotary = patched.pos_embed(torch.zeros(24, 4))
    results = []
    for processor in (ours, flux2_module.Flux2ParallelSelfAttnProcessor(), flux2_module.Flux2KVParallelSelfAttnProcessor()):
        attn.set_processor(processor)
        with torch.no_grad():
            results.append(attn(h, image_rotary_emb=rotary))
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    attn.set_processor(ours)
    patched.set_attention_backend("_native_math")
    assert ours._attention_backend == "_native_math"
    stock = flux2_module.Flux2ParallelSelfAttnProcessor()
    stock._attention_backend = ours._attention_backend
    with torch.no_grad():
        got = attn(h, image_rotary_emb=rotary)
        attn.set_processor(stock)
        assert torch.equal(got, attn(h, image_rotary_emb=rotary))


def _stock_qk(q, k, norm_q, norm_k, rotary, s):
    """diffusers' steps: torch.nn.RMSNorm per head, then apply_rotary_emb (sequence dim 1)."""
    from diffusers.models.embeddings import apply_rotary_emb

    d = norm_q.weight.numel()
    with torch.no_grad():
        out = [apply_rotary_emb(norm(x.reshape(-1, s, x.shape[1] // d, d)), rotary, sequence_dim=1)
               for x, norm in ((q, norm_q), (k, norm_k))]
    return torch.stack([o.reshape(q.shape[0], -1) for o in out])


@pytest.mark.parametrize("d, heads, batch", [(128, 3, 2), (64, 2, 1)])
def test_the_qk_norm_rope_reference_is_diffusers_steps(d, heads, batch):
    """reference.qk_norm_rope (the sm90 kernel's twin) is bit for bit torch.nn.RMSNorm then diffusers'
    apply_rotary_emb, on Q and K read out of a wide projection output (row stride 5·inner), two
    sequences one after the other; the weights and tables matter (the test can fail)."""
    g = torch.Generator().manual_seed(d)
    s, inner = 40, heads * d
    y = (torch.randn(batch * s, 5 * inner, generator=g) * 3).bfloat16()
    norms = [torch.nn.RMSNorm(d, eps=1e-6).bfloat16() for _ in range(2)]
    with torch.no_grad():
        for n in norms:
            n.weight.copy_(torch.rand(d, generator=g) + 0.5)
    angles = torch.rand(s, d // 2, generator=g) * 6
    rotary = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))
    q, k = y[:, :inner], y[:, inner:2 * inner]
    want = _stock_qk(q, k, *norms, rotary, s)
    got = reference.qk_norm_rope(q, k, norms[0].weight, norms[1].weight, *rotary, 1e-6)
    assert torch.equal(got, want)
    assert torch.equal(ops.qk_norm_rope(q, k, norms[0].weight, norms[1].weight, *rotary, 1e-6), want)
    swapped = reference.qk_norm_rope(q, k, norms[0].weight, norms[1].weight, rotary[1], rotary[0], 1e-6)
    assert _rel(swapped, want) > 0.3


def test_qk_norm_rope_names_a_bad_argument():
    q = torch.zeros(8, 256, dtype=torch.bfloat16)
    w, t = torch.ones(128, dtype=torch.bfloat16), torch.zeros(4, 128)
    for args, match in [((q.float(), q, w, w, t, t, 1e-6), "q: dtype"),
                        ((q, q[:, :128], w, w, t, t, 1e-6), "k: expected shape"),
                        ((q, q, w[:96], w, t, t, 1e-6), "weight_q: expected a 1-D head dim"),
                        ((q, q, w, w[:64], t, t, 1e-6), "weight_k: expected shape"),
                        ((q, q, w, w, t[:3], t, 1e-6), "cos: expected"),
                        ((q, q, w, w, t, t[:, :64], 1e-6), "sin: expected"),
                        ((q, q, w, w, t, t, -1.0), "eps: expected")]:
        with pytest.raises((ValueError, TypeError), match=match):
            ops.qk_norm_rope(*args)


def test_the_single_stream_processor_norms_and_rotates_in_one_op(flux2, monkeypatch):
    """Without a gradient wanted, our processor runs Q's and K's norms and rotary embedding as one
    ops.qk_norm_rope (the sm90 kernel on a GPU), with the block's own weights, eps and tables; with
    one wanted (grad mode and the norms' trainable weights) the stock steps, which have a backward."""
    from swiglu_fused.integrations import diffusers as integration

    _, model = flux2
    patched = copy.deepcopy(model)
    swiglu_fused.patch_model(patched, weight_format="bf16")
    attn = patched.single_transformer_blocks[0].attn
    calls = []
    real = ops.qk_norm_rope

    def counting(q, k, weight_q, weight_k, cos, sin, eps):
        calls.append((weight_q is attn.norm_q.weight, weight_k is attn.norm_k.weight, eps == attn.norm_q.eps))
        return real(q, k, weight_q, weight_k, cos, sin, eps)

    monkeypatch.setattr(integration.ops, "qk_norm_rope", counting)
    h = torch.randn(2, 24, 128).bfloat16()
    rotary = patched.pos_embed(torch.zeros(24, 4))
    with torch.no_grad():
        attn(h, image_rotary_emb=rotary)
    assert calls == [(True, True, True)]
    attn(h, image_rotary_emb=rotary)  # grad mode, trainable norm weights
    assert len(calls) == 1


def test_the_single_stream_processor_concatenates_where_autograd_keeps_v(flux2):
    """With grad enabled the QK norms' trainable weights make the attention keep V for its backward:
    the processor then concatenates as the stock one does, and the backward runs to the same
    gradients (the in-place write would fail it: "modified by an inplace operation")."""
    from diffusers.models.transformers import transformer_flux2 as flux2_module

    _, model = flux2
    patched = copy.deepcopy(model)
    swiglu_fused.patch_model(patched, weight_format="bf16")
    attn = patched.single_transformer_blocks[0].attn
    ours = attn.processor
    h = torch.randn(2, 24, 128).bfloat16()
    grads = []
    for processor in (ours, flux2_module.Flux2ParallelSelfAttnProcessor()):
        attn.set_processor(processor)
        attn.norm_q.weight.grad = None
        out = attn(h)
        out.float().square().sum().backward()
        grads.append((out.detach(), attn.norm_q.weight.grad.clone()))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_the_double_stream_processor_changes_nothing_and_fuses_the_qk_steps(flux2, monkeypatch):
    """DoubleStreamProcessor (patch_model puts it on every double-stream attention): bit for bit
    diffusers' Flux2AttnProcessor on the same modules, text and image outputs, with the four QK norms
    and the rotary embedding as two ops.qk_norm_rope calls (text then image tokens, each with its own
    norms and table rows); with a gradient wanted it runs the stock processor, whose backward it keeps."""
    from diffusers.models.transformers import transformer_flux2 as flux2_module

    from swiglu_fused.integrations import diffusers as integration

    _, model = flux2
    patched = copy.deepcopy(model)
    swiglu_fused.patch_model(patched, weight_format="bf16")
    attn = patched.transformer_blocks[0].attn
    ours = attn.processor
    assert isinstance(ours, DoubleStreamProcessor)
    g = torch.Generator().manual_seed(3)
    img, txt = torch.randn(2, 24, 128, generator=g).bfloat16(), torch.randn(2, 8, 128, generator=g).bfloat16()
    rotary = patched.pos_embed(torch.randint(0, 16, (32, 4), generator=g).float())
    calls = []
    real = ops.qk_norm_rope

    def counting(q, k, weight_q, weight_k, cos, sin, eps):
        calls.append((weight_q, weight_k, cos.shape[0]))
        return real(q, k, weight_q, weight_k, cos, sin, eps)

    monkeypatch.setattr(integration.ops, "qk_norm_rope", counting)
    results = []
    for processor in (ours, flux2_module.Flux2AttnProcessor()):
        attn.set_processor(processor)
        with torch.no_grad():
            results.append(attn(img, txt, image_rotary_emb=rotary))
    assert all(torch.equal(a, b) for a, b in zip(*results))
    assert [(wq is attn.norm_added_q.weight, wk is attn.norm_added_k.weight, s) for wq, wk, s in calls[:1]] == \
        [(True, True, 8)]
    assert [(wq is attn.norm_q.weight, wk is attn.norm_k.weight, s) for wq, wk, s in calls[1:]] == [(True, True, 24)]
    rolled = (rotary[0].roll(1, 0), rotary[1].roll(1, 0))  # the tables' rows matter (the test can fail)
    attn.set_processor(ours)
    with torch.no_grad():
        assert _rel(attn(img, txt, image_rotary_emb=rolled)[1], results[0][1]) > 0.05
    calls.clear()
    grads = []
    for processor in (ours, flux2_module.Flux2AttnProcessor()):
        attn.set_processor(processor)
        attn.norm_q.weight.grad = None
        out = attn(img, txt, image_rotary_emb=rotary)
        sum(o.float().square().sum() for o in out).backward()
        grads.append((out[0].detach(), attn.norm_q.weight.grad.clone()))
    assert not calls and torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_patched_transformer_traces_whole_under_torch_compile(flux2, fmt):
    """fullgraph=True over the whole patched transformer: both processors, the custom ops (their fake
    implementations: qk_norm_rope's [2, T, inner] included) and the fused modules trace without a
    graph break, to the eager output; the eager backend keeps this a tracing test, cheap enough for CI."""
    _, model = flux2
    patched = copy.deepcopy(model)
    swiglu_fused.patch_model(patched, weight_format=fmt)
    x = _inputs()
    torch._dynamo.reset()
    assert torch.equal(_run(torch.compile(patched, fullgraph=True, backend="eager"), x), _run(patched, x))


def _write_columns(buf, src, cols):
    ops.copy_into(buf[:, cols], src)
    return buf


@pytest.mark.parametrize("cols", [slice(8, 24), slice(3, 19)], ids=["words", "off-word"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
def test_copy_into_writes_the_view_and_nothing_else(cols, compiled):
    """ops.copy_into: dst's elements become src's bit for bit and the rest of dst's buffer is untouched,
    on columns that are whole 8-byte words (copied as words) and off them (the plain copy), eagerly
    and under inductor (the op mutates the view, not a functionalized copy of the whole buffer)."""
    src = torch.randn(6, 16).bfloat16()
    buf = torch.full((6, 40), float("nan"), dtype=torch.bfloat16)
    write = torch.compile(_write_columns, fullgraph=True) if compiled else _write_columns
    torch._dynamo.reset()
    out = write(buf, src, cols)
    assert out is buf and torch.equal(buf[:, cols], src)
    rest = torch.ones_like(buf, dtype=torch.bool)
    rest[:, cols] = False
    assert buf[rest].isnan().all()
    with pytest.raises(ValueError, match="src must have dst's shape"):
        ops.copy_into(buf[:, cols], src[:, :8])


def test_the_single_stream_block_under_inductor_writes_the_attention_in_place(flux2):
    """Compiled by inductor (fullgraph), the patched single-stream block runs copy_into on a view of
    the projection's output buffer (in place: no rewrite of the whole [Q | K | V | h], which cost 171
    µs at Flux.2-dev width on the H200) and gives the eager output within bf16 rounding (inductor
    fuses the norms and modulation in its own order)."""
    from torch._inductor.utils import run_and_get_code

    _, model = flux2
    patched = copy.deepcopy(model)
    swiglu_fused.patch_model(patched, weight_format="bf16")
    block = patched.single_transformer_blocks[0]
    hidden = torch.randn(1, 24, 128).bfloat16()
    kwargs = dict(hidden_states=hidden, encoder_hidden_states=None, image_rotary_emb=patched.pos_embed(torch.zeros(24, 4)),
                  temb_mod=patched.single_stream_modulation(torch.randn(1, 128).bfloat16()))
    torch._dynamo.reset()
    with torch.no_grad():
        want = block(**kwargs)
        got, code = run_and_get_code(torch.compile(block, fullgraph=True), **kwargs)
    calls = [line for c in code for line in c.splitlines() if "swiglu_fused.copy_into.default(" in line]
    assert len(calls) == 1 and "copy_into.default(reinterpret_tensor(buf" in calls[0]
    assert _rel(got, want) < BLOCK_BOUND["bf16"]


def test_patch_reports_what_it_leaves(flux2):
    _, model = flux2
    patched = copy.deepcopy(model)
    with pytest.raises(formats.FormatError, match="interleave"):
        swiglu_fused.patch_model(patched, weight_format="fp8_block128", interleave=64)
    report = swiglu_fused.patch_model(patched, weight_format="bf16", interleave=384)
    assert report.swapped == FFS and report.split_projections == [SPLIT]
    again = swiglu_fused.patch_model(patched, weight_format="bf16")
    assert not again.swapped and not again.split_projections
    assert f"{SPLIT}" in again.skipped and "already packed" in again.skipped[SPLIT]


def test_from_pretrained_without_the_import_fails_loudly(tmp_path, flux2):
    src, _ = flux2
    convert(src, tmp_path / "dst", weight_format="bf16", progress=False)
    code = ("import sys, torch\nfrom diffusers import Flux2Transformer2DModel\n"
            "Flux2Transformer2DModel.from_pretrained(sys.argv[1])\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dst")], capture_output=True, text=True,
                          env={"HF_HUB_OFFLINE": "1", "PATH": ""})
    assert proc.returncode != 0 and "swiglu_fused" in proc.stderr, proc.stderr[-2000:]


def test_a_denoising_step_with_the_packed_transformer(tmp_path, flux2):
    """One flow-matching Euler step of the scheduler diffusers' Flux.2 pipeline uses, with the
    transformer the pipeline would load from a converted folder (fp8)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    src, model = flux2
    convert(src, tmp_path / "dst", weight_format="fp8_block128", progress=False)
    packed = _loaded(tmp_path / "dst")
    latents = []
    for transformer in (model, packed):
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
        scheduler.set_timesteps(4)
        x = _inputs()
        t = scheduler.timesteps[0]
        x["timestep"] = (t / 1000).expand(1)
        noise_pred = _run(transformer, x)
        latents.append(scheduler.step(noise_pred, t, x["hidden_states"]).prev_sample)
    assert latents[1].shape == latents[0].shape and torch.isfinite(latents[1].float()).all()
    assert _rel(latents[1], latents[0]) < MODEL_BOUND["fp8_block128"]


def test_the_benchmark_baseline_is_diffusers_computation(flux2):
    """benchmarks/bench_flux2.py times diffusers' bf16 work written with the same torch calls (the
    GPU machine has no diffusers): its single-stream part equals the block's own to_qkv_mlp_proj,
    split and mlp_act_fn, and its feed-forward equals Flux2FeedForward, bit for bit."""
    from benchmarks import bench_flux2

    _, model = flux2
    attn = model.single_transformer_blocks[0].attn
    x, attention = torch.randn(6, 128).bfloat16(), torch.randn(6, attn.inner_dim).bfloat16()
    p = 3 * attn.inner_dim
    with torch.no_grad():
        qkv, to_out_input = bench_flux2.diffusers_single(x, attn.to_qkv_mlp_proj.weight, attention, prefix=p)
        y = attn.to_qkv_mlp_proj(x)
        assert torch.equal(qkv, y[:, :p])
        assert torch.equal(to_out_input, torch.cat([attention, attn.mlp_act_fn(y[:, p:])], dim=-1))
        ff = model.transformer_blocks[0].ff
        assert torch.equal(bench_flux2.diffusers_ff(x, ff.linear_in.weight, ff.linear_out.weight), ff(x))


def test_the_benchmark_blocks_are_diffusers_blocks_patched():
    """bench_flux2's whole-block timings run diffusers' own blocks and patch_model's copies of them,
    which compute the same block (within the format's bound) with the fused modules in place."""
    from benchmarks import bench_flux2

    models = bench_flux2.flux2_blocks(device="cpu", dim=128, heads=2, head_dim=64, text=32)
    single, double = bench_flux2.block_inputs(models["diffusers_bf16"], image=16, text=8)
    with torch.no_grad():
        want = (models["diffusers_bf16"].single_transformer_blocks[0](**single),
                models["diffusers_bf16"].transformer_blocks[0](**double))
        for name, model in models.items():
            if name == "diffusers_bf16":
                continue
            fmt = {"ours_bf16": "bf16", "ours_fp8": "fp8_block128", "ours_nvfp4": "nvfp4"}[name]
            assert isinstance(model.single_transformer_blocks[0].attn.processor, SplitProjectionProcessor)
            assert isinstance(model.transformer_blocks[0].ff, FusedSwiGLUMLP)
            assert _rel(model.single_transformer_blocks[0](**single), want[0]) < BLOCK_BOUND[fmt]
            for got, ref in zip(model.transformer_blocks[0](**double), want[1]):
                assert _rel(got, ref) < BLOCK_BOUND[fmt]
