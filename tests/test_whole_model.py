"""Whole-model correctness of converted quantized checkpoints (issue 21): the source's quantized
attention projections become packed linears (quantization_config.linears) that run through our
own linear op, so the converted model computes what transformers computes from the SOURCE."""

import json
import shutil

import pytest
import torch

import swiglu_fused  # noqa: F401  (registers the swiglu_fused quantization method)
from swiglu_fused import convert, verify
from swiglu_fused.cli import main
from swiglu_fused.formats import FormatError
from swiglu_fused.linear import PackedLinear
from swiglu_fused.weight_packing import safetensors_io as sio

from conftest import DATA, _causal_lm, make_ct_nvfp4
from test_transformers_integration import LOGITS_BOUND, _generate, _rel, _tokens

FP8_DATA = DATA / "tiny-llama-fp8"  # transformers' own fine-grained FP8 (attention quantized too)
ATTENTION = [f"model.layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "koqv"]


def _load(path, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **kwargs)


def _compare_with_source(dst, src, bound, tokens_equal=True):
    """Load DST (ours) and SRC (transformers' own integration for the source's quantization) and
    compare logits and greedy tokens; returns the packed model."""
    model, info = _load(dst, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"], info  # nothing dropped, nothing random
    source = _load(src)
    tokens = _tokens()
    with torch.no_grad():
        got, expected = model(tokens).logits, source(tokens).logits
    assert _rel(got, expected) < bound, _rel(got, expected)
    if tokens_equal:
        assert torch.equal(_generate(model, tokens), _generate(source, tokens))
    return model


def test_fp8_source_converts_by_default_and_runs_the_whole_model(tmp_path):
    """(a) transformers fine-grained FP8: the default format follows the source, every projection
    (MLPs and attention) moves bit-exactly, and the loaded model matches transformers loading the
    source itself (its FP8 integration dequantizes on the CPU)."""
    dst = tmp_path / "dst"
    report = convert(FP8_DATA, dst, progress=False)
    assert report.weight_format == "fp8_block128" and report.repacked == 6 and report.quantized == 0
    assert sorted(report.linears) == ATTENTION and report.linears_repacked == 8
    assert "8 quantized non-MLP linears of the source (attention, ...): 8 repacked bit-exactly" in report.summary()
    qcfg = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert sorted(qcfg["linears"]) == ATTENTION
    checked = verify(dst, against=FP8_DATA)
    assert checked.ok and all(c.mode == "bit-exact" for c in checked.checks), checked.summary()
    assert {c.module for c in checked.checks if c.projection == "linear"} == set(ATTENTION)
    model = _compare_with_source(dst, FP8_DATA, LOGITS_BOUND["fp8_block128"])
    q = model.model.layers[1].self_attn.q_proj
    assert isinstance(q, PackedLinear) and q.weight.dtype == torch.float8_e4m3fn
    assert torch.equal(q.weight.view(torch.uint8),
                       sio.load_file(FP8_DATA / "model-00004-of-00004.safetensors",
                                     ["model.layers.1.self_attn.q_proj.weight"])
                       ["model.layers.1.self_attn.q_proj.weight"].view(torch.uint8))
    assert isinstance(model.lm_head, torch.nn.Linear) and model.lm_head.weight.dtype == torch.bfloat16


def test_the_old_unlisted_layout_is_refused(tmp_path):
    """What convert used to write (the source's quantized attention tensors copied, not listed) is
    refused by verify and by the loader, naming a scale tensor, instead of loading raw e4m3 codes."""
    dst = tmp_path / "dst"
    convert(FP8_DATA, dst, progress=False)
    config = json.loads((dst / "config.json").read_text())
    del config["quantization_config"]["linears"]
    (dst / "config.json").write_text(json.dumps(config))
    checked = verify(dst)
    assert not checked.ok
    assert any(v.tensor and v.tensor.startswith("model.layers.0.self_attn.") and v.field == "linears"
               for v in checked.violations), checked.summary()
    with pytest.raises(FormatError, match=r"self_attn\.[kqvo]_proj\.weight.*quantization_config\.linears"):
        _load(dst)


def test_compressed_tensors_nvfp4_source_runs_the_whole_model(tmp_path):
    """(b) compressed-tensors NVFP4 (its own compressor quantizes attention too): the CLI's default
    format follows the source (nvfp4, bytes moved), and the model matches transformers loading the
    source through compressed-tensors' own loader (it decompresses on the CPU)."""
    src = tmp_path / "ct"
    torch.manual_seed(0)
    make_ct_nvfp4(src, _causal_lm("llama", 128, 384))
    _convert_ct_nvfp4_and_compare(src, tmp_path / "dst")


def test_committed_nvfp4_checkpoint_is_compressed_tensors_own(tmp_path):
    """tests/data/tiny-llama-nvfp4 (made by compressed-tensors' compressor, make_nvfp4_checkpoint.py;
    the GPU machine, which has no compressed-tensors, runs it on the kernels) converts and runs
    like a freshly made one."""
    _convert_ct_nvfp4_and_compare(DATA / "tiny-llama-nvfp4", tmp_path / "dst")


def _convert_ct_nvfp4_and_compare(src, dst):
    assert main(["convert", str(src), str(dst), "--no-progress"]) == 0
    qcfg = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qcfg["weight_format"] == "nvfp4" and sorted(qcfg["linears"]) == ATTENTION
    checked = verify(dst, against=src)
    assert checked.ok and len(checked.checks) == 14, checked.summary()
    assert all(c.mode == "bit-exact" for c in checked.checks), checked.summary()
    # W4A16 on both sides: the same dequantized weights, only the accumulation differs
    model = _compare_with_source(dst, src, 0.03)
    assert isinstance(model.model.layers[0].self_attn.o_proj, PackedLinear)


@pytest.mark.parametrize("fmt,bound", [("bf16", 0.001), ("nvfp4", LOGITS_BOUND["nvfp4"])])
def test_fp8_source_to_another_format_requantizes_and_runs(tmp_path, fmt, bound):
    """(c) a cross-format conversion (explicit --format) re-quantizes the attention too, says so,
    verifies within the format's bound, and runs close to the source."""
    dst = tmp_path / fmt
    report = convert(FP8_DATA, dst, weight_format=fmt, progress=False)
    assert report.quantized == 6 and len(report.linears) == 8 and report.linears_repacked == 0
    said = "dequantized to plain bf16 weights" if fmt == "bf16" else "re-quantized from the source's fp8_block128"
    assert said in report.summary()
    checked = verify(dst, against=FP8_DATA)
    assert checked.ok and all(c.mode == "within bound" for c in checked.checks), checked.summary()
    linears = json.loads((dst / "config.json").read_text())["quantization_config"].get("linears", [])
    model = _compare_with_source(dst, FP8_DATA, bound, tokens_equal=fmt == "bf16")
    q = model.model.layers[0].self_attn.q_proj
    if fmt == "bf16":  # a plain Linear with the dequantized weight: nothing for a loader to know
        assert linears == [] and type(q) is torch.nn.Linear and q.weight.dtype == torch.bfloat16
    else:
        assert sorted(linears) == ATTENTION and isinstance(q, PackedLinear) and q.weight_packed.dtype == torch.uint8


def _add_tensor(src, name, tensor):
    """Write one more tensor into the last shard of a copied checkpoint, and list it in the index."""
    shard = sio.checkpoint_files(src)[-1]
    tensors = {k: v.clone() for k, v in sio.load_file(shard).items()}  # the file is mapped: copy first
    tensors[name] = tensor
    sio.write_file(tensors, shard, {"format": "pt"})
    index = src / "model.safetensors.index.json"
    body = json.loads(index.read_text())
    body["weight_map"][name] = shard.name
    index.write_text(json.dumps(body))


@pytest.mark.parametrize("stray", ["model.layers.1.self_attn.k_proj.k_scale",  # a KV-cache scale
                                   "model.layers.0.mlp.up_proj.weight_zero_point"])
def test_a_source_tensor_without_a_home_fails_verify(tmp_path, capsys, stray):
    """(d) a tensor of the source that the packed checkpoint does not hold, copy or account for is
    a verify failure that names it; convert refuses such a source instead of dropping it."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    shutil.copytree(FP8_DATA, src)
    convert(src, dst, progress=False)
    _add_tensor(src, stray, torch.tensor(0.5))
    checked = verify(dst, against=src)
    assert not checked.ok and any(v.tensor == stray and "has no home" in v.message for v in checked.violations)
    assert main(["verify", str(dst), "--against", str(src)]) == 1
    out = capsys.readouterr().out
    assert stray in out and "has no home" in out and "Traceback" not in out
    with pytest.raises(FormatError, match=stray.replace(".", r"\.")):
        convert(src, tmp_path / "again", progress=False)
    assert not (tmp_path / "again").exists()


@pytest.mark.parametrize("stray", ["model.layers.0.self_attn.q_proj.weight_zero_point",  # beside a packed linear
                                   "model.extra_head.weight",  # a module the source never had
                                   "model.layers.1.mlp.down_proj.bias"])  # beside a packed MLP projection
def test_a_packed_tensor_the_source_never_had_fails_verify(tmp_path, capsys, stray):
    """The other direction of the test above: a tensor in the packed checkpoint that is neither a
    source tensor's home nor a packed projection's (added after the conversion, or left by another
    tool) fails verify --against, named with its file."""
    dst = tmp_path / "dst"
    convert(FP8_DATA, dst, progress=False)
    shard = sio.checkpoint_files(dst)[-1]
    tensors = {k: v.clone() for k, v in sio.load_file(shard).items()}
    tensors[stray] = torch.tensor(0.5)
    sio.write_file(tensors, shard, sio.read_header(shard).metadata)
    index = dst / "model.safetensors.index.json"
    if index.exists():
        body = json.loads(index.read_text())
        body["weight_map"][stray] = shard.name
        index.write_text(json.dumps(body))
    checked = verify(dst, against=FP8_DATA)
    assert not checked.ok and any(v.tensor == stray and "not from the source" in v.message
                                  for v in checked.violations), checked.summary()
    assert main(["verify", str(dst), "--against", str(FP8_DATA)]) == 1
    out = capsys.readouterr().out
    assert stray in out and shard.name in out and "Traceback" not in out


def test_a_copied_tensor_that_changed_fails_verify(tmp_path):
    """Tensors the source left unquantized must be bit-equal in the packed checkpoint."""
    dst = tmp_path / "dst"
    convert(FP8_DATA, dst, progress=False)
    shard = next(f for f in sio.checkpoint_files(dst) if "model.norm.weight" in sio.read_header(f).entries)
    tensors = {k: v.clone() for k, v in sio.load_file(shard).items()}
    tensors["model.norm.weight"][0] += 1
    sio.write_file(tensors, shard, sio.read_header(shard).metadata)
    checked = verify(dst, against=FP8_DATA)
    assert not checked.ok and "MISMATCH model.norm.weight" in checked.summary(), checked.summary()


def test_modelopt_nvfp4_source_runs_the_whole_model(tmp_path):
    """NVIDIA ModelOpt NVFP4 (attention quantized, per-tensor scales stored as multipliers): the
    default format follows the source, the attention moves bit-exactly (renamed to our tensor
    names), its activation scales are reported dropped, and the loaded model is within nvfp4's
    tolerance of the bf16 model ModelOpt quantized (transformers cannot run ModelOpt NVFP4 on a CPU)."""
    from conftest import make_causal_lm, make_modelopt_nvfp4

    bf16, src, dst = tmp_path / "bf16", tmp_path / "modelopt", tmp_path / "dst"
    make_causal_lm(bf16, "llama")
    make_modelopt_nvfp4(bf16, src)
    report = convert(src, dst, progress=False)
    assert report.weight_format == "nvfp4" and report.linears_repacked == 8
    assert "model.layers.0.self_attn.q_proj.input_scale" in report.dropped
    checked = verify(dst, against=src)
    assert checked.ok and all(c.mode == "bit-exact" for c in checked.checks), checked.summary()
    model, info = _load(dst, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"], info
    assert model.model.layers[0].self_attn.v_proj.global_scale_kind == "multiplier"
    with torch.no_grad():
        got, expected = model(_tokens()).logits, _load(bf16)(_tokens()).logits
    assert _rel(got, expected) < LOGITS_BOUND["nvfp4"]
