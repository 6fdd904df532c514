"""patch_model on a model that transformers loaded from a quantized checkpoint through its own
quantizers (issue 21 item 4): the quantized MLPs and attention projections move into the packed
format byte for byte, the patched model computes what the source computed, what cannot move is
left to the source's quantizer and named in the report, and save_pretrained either writes a
packed checkpoint that loads again or refuses.

The sources are made by the real producers: transformers' fine-grained FP8 (tests/data), and
compressed-tensors' own compressors (NVFP4, FP8 block, FP8 per-channel). "The source's logits"
are transformers' own on the CPU: it dequantizes FP8 at load when no GPU is present, and
compressed-tensors decompresses a model at its first forward, so the reference is always a
second load of the same checkpoint."""

import pytest
import torch

import swiglu_fused  # noqa: F401  (registers the swiglu_fused quantization method)
from swiglu_fused import FusedSwiGLUMLP, formats, interleave as il, patch_model
from swiglu_fused.formats import FormatError
from swiglu_fused.linear import PackedLinear

from conftest import make_causal_lm, make_ct_fp8_block, make_ct_nvfp4
from test_transformers_integration import LOGITS_BOUND, _generate, _rel, _tokens
from test_whole_model import ATTENTION, FP8_DATA, _load

SEED = 2  # a tiny random model whose greedy run meets no near tie (test_ct_fp8.NO_NEAR_TIE): e4m3
#           activations (ours) and bf16 ones (the source's CPU path) then choose the same tokens
MLPS = [f"model.layers.{i}.mlp" for i in range(2)]
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")

# per source: our packed format, and our tensor suffix → the source module's tensor
SOURCES = {
    "transformers-fp8": ("fp8_block128", {"weight": "weight", "weight_scale_inv": "weight_scale_inv"}),
    "ct-fp8-block": ("fp8_block128", {"weight": "weight", "weight_scale_inv": "weight_scale"}),
    "ct-nvfp4": ("nvfp4", {"weight_packed": "weight_packed", "weight_scale": "weight_scale",
                           "weight_global_scale": "weight_global_scale"}),
}


def _load_quantized(path):
    """``path`` loaded as transformers loads it on a GPU: its FP8 quantizer falls back to
    dequantizing when no GPU is present, so its check is turned off here to get the modules it
    builds on a GPU (FP8Linear holding the e4m3 bytes). compressed-tensors keeps its compressed
    modules on the CPU as it is."""
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FineGrainedFP8HfQuantizer, "validate_environment", lambda self, *a, **k: None)
        return _load(path)


def _source(kind, tmp_path):
    if kind == "transformers-fp8":
        return FP8_DATA
    src = tmp_path / kind
    make = make_ct_nvfp4 if kind == "ct-nvfp4" else make_ct_fp8_block
    make(src, make_causal_lm(tmp_path / "dense", seed=SEED))
    return src


def _raw(t):
    return t.detach().contiguous().view(torch.uint8) if t.element_size() == 1 else t.detach().float()


def _source_tensors(model, names):
    """module → its quantized tensors (copies), taken before patch_model replaces it."""
    out = {}
    for name in names:
        m = model.get_submodule(name)
        out[name] = {k: v.detach().clone() for k, v in [*m.named_parameters(recurse=False),
                                                        *m.named_buffers(recurse=False)]}
    return out


def _assert_moved(ours, theirs, mapping):
    for suffix, their_name in mapping.items():
        a, b = ours[suffix], theirs[their_name]
        assert torch.equal(_raw(a).reshape(-1), _raw(b).reshape(-1)), suffix


@pytest.mark.parametrize("kind", list(SOURCES))
def test_patch_moves_the_bytes_and_the_model_computes_what_the_source_computed(kind, tmp_path):
    fmt_name, mapping = SOURCES[kind]
    fmt = formats.weight_format(fmt_name)
    src = _source(kind, tmp_path)
    reference = _load(src)  # transformers' own computation of the source (see the module docstring)
    tokens = _tokens()
    with torch.no_grad():
        expected = reference(tokens).logits
    expected_tokens = _generate(reference, tokens)

    model = _load_quantized(src)
    assert type(model.model.layers[0].mlp.gate_proj).__name__ == (
        "FP8Linear" if kind == "transformers-fp8" else "Linear")
    source = _source_tensors(model, [*ATTENTION, *(f"{m}.{p}" for m in MLPS for p in PROJECTIONS)])
    report = patch_model(model)  # the default follows the model's quantization

    assert report.weight_format == fmt_name and report.swapped == MLPS
    assert sorted(report.linears) == ATTENTION and not report.left and not report.skipped
    assert report.moved == 14 and report.requantized == 0
    text = str(report)
    assert "14 repacked bit-exactly, 0 re-quantized" in text
    assert "8 quantized non-MLP linears became PackedLinear" in text and "left to" not in text
    for mlp in MLPS:
        fused = model.get_submodule(mlp)
        assert isinstance(fused, FusedSwiGLUMLP) and fused.weight_format == fmt_name
        gate, up = il.unpack_gate_up(fused.gate_up_interleaved.tensors(), fused.interleave, fmt)
        _assert_moved(gate, source[f"{mlp}.gate_proj"], mapping)
        _assert_moved(up, source[f"{mlp}.up_proj"], mapping)
        _assert_moved(fused.down_proj.tensors(), source[f"{mlp}.down_proj"], mapping)
    for name in ATTENTION:
        linear = model.get_submodule(name)
        assert isinstance(linear, PackedLinear) and linear.weight_format == fmt_name
        _assert_moved(linear.tensors(), source[name], mapping)

    with torch.no_grad():
        got = model(tokens).logits
    assert _rel(got, expected) < LOGITS_BOUND[fmt_name], _rel(got, expected)
    assert torch.equal(_generate(model, tokens), expected_tokens)

    model.save_pretrained(tmp_path / "packed")
    assert swiglu_fused.verify(tmp_path / "packed").ok
    loaded, info = _load(tmp_path / "packed", output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"], info
    assert sorted(loaded.config.quantization_config.packed.linears) == ATTENTION
    assert isinstance(loaded.model.layers[1].self_attn.o_proj, PackedLinear)
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, got)


def test_an_explicit_other_format_requantizes_and_says_so(tmp_path):
    """FP8 source, weight_format nvfp4: nothing can move, everything is dequantized and quantized
    again, the report says so, and the result still computes the source's model."""
    reference = _load(FP8_DATA)
    tokens = _tokens()
    with torch.no_grad():
        expected = reference(tokens).logits
    model = _load_quantized(FP8_DATA)
    report = patch_model(model, weight_format="nvfp4")
    assert report.moved == 0 and report.requantized == 14 and sorted(report.linears) == ATTENTION
    assert "0 repacked bit-exactly, 14 re-quantized (dequantized, then quantized to nvfp4)" in str(report)
    assert model.model.layers[0].self_attn.q_proj.weight_format == "nvfp4"
    with torch.no_grad():
        got = model(tokens).logits
    assert _rel(got, expected) < LOGITS_BOUND["nvfp4"], _rel(got, expected)
    model.save_pretrained(tmp_path / "packed")
    with torch.no_grad():
        assert torch.equal(_load(tmp_path / "packed")(tokens).logits, got)


def _make_ct_mixed(path, model):
    """compressed-tensors' own compressor on two schemes, as llm-compressor writes a recipe with
    two groups: the MLPs as FP8 blocks (which fp8_block128 holds), the attention projections per
    channel with per-token activations (FP8_DYNAMIC, which it does not)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    groups = {"mlp": preset_name_to_scheme("FP8_BLOCK", targets=[r"re:.*mlp\.(gate|up|down)_proj$"]),
              "attention": preset_name_to_scheme("FP8_DYNAMIC", targets=[r"re:.*self_attn\.[qkvo]_proj$"])}
    apply_quantization_config(model, QuantizationConfig(config_groups=groups, ignore=["lm_head"]))
    with torch.no_grad():
        for _, m in model.named_modules():
            if not hasattr(m, "quantization_scheme"):
                continue
            w = m.weight.float()
            if m.quantization_scheme.weights.strategy == "block":
                padded = torch.nn.functional.pad(w.abs(), (0, -w.shape[1] % 128, 0, -w.shape[0] % 128))
                amax = padded.unflatten(0, (-1, 128)).unflatten(-1, (-1, 128)).amax(dim=(1, 3))
            else:
                amax = w.abs().amax(dim=-1, keepdim=True)
            scale, _ = calculate_qparams(-amax, amax, m.quantization_scheme.weights)
            m.weight_scale.data = scale.to(m.weight_scale.dtype)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(path)


def test_what_cannot_move_is_left_to_the_source_quantizer_and_saving_refuses(tmp_path):
    src = tmp_path / "mixed"
    _make_ct_mixed(src, make_causal_lm(tmp_path / "dense", seed=SEED))
    reference = _load(src)
    tokens = _tokens()
    with torch.no_grad():
        expected = reference(tokens).logits
    model = _load(src)
    report = patch_model(model)
    assert report.weight_format == "fp8_block128" and report.swapped == MLPS and report.moved == 6
    assert report.linears == [] and sorted(report.left) == ATTENTION
    assert all("strategy 'channel'" in why for why in report.left.values())
    assert "left to compressed-tensors quantizer: model.layers.0.self_attn.q_proj: FP8 weights with strategy " \
           "'channel'" in str(report)
    # the attention stays compressed-tensors' (decompressed by its hook at the first forward)
    with torch.no_grad():
        got = model(tokens).logits
    assert _rel(got, expected) < LOGITS_BOUND["fp8_block128"], _rel(got, expected)
    assert torch.equal(_generate(model, tokens), _generate(reference, tokens))
    with pytest.raises(FormatError, match=r"(?s)8 quantized modules .* were left to compressed-tensors quantizer"
                                          r".*no checkpoint is written.*swiglu-fused convert"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_model_already_decompressed_by_a_forward_is_left_with_the_fix(tmp_path):
    """compressed-tensors decompresses at the first forward: the quantized bytes are gone, so
    nothing is moved (nor re-quantized behind the user's back); the report says what to do."""
    src = tmp_path / "nvfp4"
    make_ct_nvfp4(src, make_causal_lm(tmp_path / "dense"))
    model = _load(src)
    with torch.no_grad():
        expected = model(_tokens()).logits
    report = patch_model(model)
    assert report.swapped == [] and report.linears == [] and len(report.left) == 14
    assert all("patch a freshly loaded model" in why for why in report.left.values())
    with torch.no_grad():
        assert torch.equal(model(_tokens()).logits, expected)


@pytest.mark.parametrize("make", [make_ct_nvfp4, make_ct_fp8_block], ids=["ct-nvfp4", "ct-fp8-block"])
def test_phi3_fused_gate_up_is_cut_and_moved(make, tmp_path):
    """Phi-3's quantized [gate; up] projection is cut in two (bytes kept: whole 128-row scale
    blocks for fp8) and interleaved; qkv_proj and o_proj become PackedLinears."""
    src = tmp_path / "phi3"
    make(src, make_causal_lm(tmp_path / "dense", family="phi3", hidden=128, inter=256, seed=SEED))
    reference = _load(src)
    with torch.no_grad():
        expected = reference(_tokens()).logits
    model = _load(src)
    report = patch_model(model)
    assert report.swapped == MLPS and report.moved == 10 and report.requantized == 0 and not report.left
    attention = [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("o_proj", "qkv_proj")]
    assert sorted(report.linears) == attention
    with torch.no_grad():
        got = model(_tokens()).logits
    assert _rel(got, expected) < LOGITS_BOUND[report.weight_format], _rel(got, expected)
