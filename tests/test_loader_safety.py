"""What is loaded is what was verified (issue 19, items 4 and 8): from_pretrained and
FusedSwiGLUMLP.from_packed check the facts `verify` checks, refuse format version 1, and a packed
checkpoint loaded without swiglu_fused cannot run interleaved rows as a Linear's [gate; up].
Every bad input is edited from a real packed checkpoint (swiglu_fused.convert of a tiny
transformers model)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import swiglu_fused  # noqa: F401  (registers the swiglu_fused quantization method)
from swiglu_fused import FusedSwiGLUMLP, convert, formats, patch_model, verify
from swiglu_fused.formats import FormatError
from swiglu_fused.weight_packing import safetensors_io as sio
from swiglu_fused.weight_packing.packed_checkpoint import PackedCheckpoint

from conftest import make_causal_lm

MLP = "model.layers.0.mlp"


@pytest.fixture(scope="module")
def packed_fp8(tmp_path_factory):
    """A real packed fp8_block128 checkpoint of a tiny LLaMA (I = 384), made once; copy it to mutate."""
    root = tmp_path_factory.mktemp("fp8")
    make_causal_lm(root / "src", "llama")
    convert(root / "src", root / "packed", weight_format="fp8_block128", progress=False)
    return root / "packed"


def _copy(packed, tmp_path):
    dst = tmp_path / "packed"
    shutil.copytree(packed, dst)
    return dst


def _hashes(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def _edit_config(dst, **changes):
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if key in ("intermediate_size", "hidden_size"):
            cfg[key] = value
        else:
            cfg["quantization_config"][key] = value
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))


def _edit_metadata(dst, rename=None, **changes):
    """Rewrite every shard's __metadata__ blob (and optionally rename tensors), as a forger would."""
    for f in sio.checkpoint_files(dst):
        metadata = dict(sio.read_header(f).metadata)
        blob = json.loads(metadata[formats.METADATA_KEY])
        blob.update(changes)
        metadata[formats.METADATA_KEY] = json.dumps(blob, sort_keys=True)
        tensors = {(rename(k) if rename else k): v.clone() for k, v in sio.load_file(f).items()}
        sio.write_file(tensors, f, metadata)


def _load_both(dst):
    """The two loaders' errors: (from_pretrained's, FusedSwiGLUMLP.from_packed's)."""
    from transformers import AutoModelForCausalLM

    errors = []
    with pytest.raises(FormatError) as e:
        AutoModelForCausalLM.from_pretrained(dst)
    errors.append(str(e.value))
    with pytest.raises(FormatError) as e:
        FusedSwiGLUMLP.from_packed(PackedCheckpoint(dst), MLP)
    errors.append(str(e.value))
    return errors


@pytest.mark.parametrize("key,value,stored", [
    ("interleave", 256, "128"),
    ("activation", "gelu_tanh", "'silu'"),
    ("weight_format", "bf16", "'fp8_block128'"),  # a bf16 label on e4m3 data
])
def test_config_json_edit_disagrees_with_the_shards(tmp_path, packed_fp8, key, value, stored):
    """Before: interleave 128 → 256 or another activation in config.json loaded silently with wrong
    output (logits error 0.62 to NaN). Now both loaders refuse, naming config.json, the shard and
    both values."""
    dst = _copy(packed_fp8, tmp_path)
    _edit_config(dst, **{key: value})
    before = _hashes(dst)
    for err in _load_both(dst):
        assert str(dst / "config.json") in err and str(dst / "model.safetensors") in err
        assert f"{key}: file says {stored} but config.json says {value!r}" in err
        assert "swiglu-fused convert" in err
    assert _hashes(dst) == before  # a failed load changes nothing


def test_bf16_label_on_fp8_data_fails_instead_of_casting(tmp_path, packed_fp8):
    """config.json and every shard's metadata say bf16 but the tensors are e4m3: transformers'
    weight loader would cast them into the bf16 buffers (measured: it does). Refused, naming the
    tensor, the file and both dtypes."""
    dst = _copy(packed_fp8, tmp_path)
    _edit_config(dst, weight_format="bf16")
    _edit_metadata(dst, weight_format="bf16", h_format="bf16")
    for err in _load_both(dst):
        assert f"{dst / 'model.safetensors'} / {MLP}.{formats.GATE_UP}.weight / dtype: expected torch.bfloat16, " \
               "found torch.float8_e4m3fn" in err
        assert "the packed tensors are not those of format bf16" in err


def test_model_config_of_another_size_is_refused_before_loading(tmp_path, packed_fp8):
    """config.json's intermediate_size edited (384 → 256): the modules from_pretrained would build
    do not fit the packed tensors."""
    from transformers import AutoModelForCausalLM

    dst = _copy(packed_fp8, tmp_path)
    _edit_config(dst, intermediate_size=256)
    with pytest.raises(FormatError, match=rf"model\.safetensors / {MLP}\.{formats.GATE_UP}\.weight / shape: "
                                          r"\[768, 128\], but the model that config.json describes needs \[512, 128\] "
                                          r"\(hidden_size 128, intermediate_size 256\)"):
        AutoModelForCausalLM.from_pretrained(dst)


def test_version_1_checkpoint_is_refused(tmp_path, packed_fp8):
    """A version-1 checkpoint (named the interleaved projection gate_up_proj) is refused by both
    loaders and by verify, naming the file, the field and the fix."""
    dst = _copy(packed_fp8, tmp_path)
    _edit_config(dst, format_version=1)
    _edit_metadata(dst, rename=lambda n: n.replace(formats.GATE_UP, "gate_up_proj"), format_version=1)
    fix = "re-run `swiglu-fused convert` on the source checkpoint to write version 2"
    from_pretrained, from_packed = _load_both(dst)
    assert "config.json: quantization_config / format_version: format version 1 is no longer read" in from_pretrained
    assert f"{dst / 'config.json'} / format_version: format version 1 is no longer read" in from_packed
    assert fix in from_pretrained and fix in from_packed
    report = verify(dst)
    assert not report.ok
    assert [v.field for v in report.violations] == ["format_version"]
    assert fix in str(report.violations[0]) and str(dst / "config.json") in str(report.violations[0])


@pytest.mark.parametrize("text,found", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object (a model config), found list"),
    ("null", "expected a JSON object (a model config), found NoneType"),
    ('{"model_type": "llama", "quantization_config": "swiglu_fused"}',
     "quantization_config is a str ('swiglu_fused'), not an object"),
    ('{"model_type": "llama"}', "quantization_config is missing; not a packed checkpoint"),
])
def test_packed_checkpoint_config_json_that_is_not_a_config(tmp_path, packed_fp8, text, found):
    dst = _copy(packed_fp8, tmp_path)
    (dst / "config.json").write_text(text)
    with pytest.raises(FormatError) as e:
        PackedCheckpoint(dst)
    assert str(e.value).startswith(f"{dst / 'config.json'}: ") and found in str(e.value)


def test_state_dict_keys_are_the_packed_names(tmp_path, packed_fp8):
    """FusedSwiGLUMLP's child for gate_up is named formats.GATE_UP, so its state_dict keys are the
    checkpoint's tensor names."""
    ckpt = PackedCheckpoint(packed_fp8)
    mlp = FusedSwiGLUMLP.from_packed(ckpt, MLP)
    assert formats.GATE_UP == "gate_up_interleaved"
    assert {f"{MLP}.{k}" for k in mlp.state_dict()} == {n for n in ckpt.file_of if n.startswith(MLP + ".")}


UNPATCHED = r"""
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.utils import logging as tf_logging
tf_logging.set_verbosity_warning()
model, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)
packed = load_file(sys.argv[1] + "/model.safetensors")["model.layers.0.mlp.gate_up_interleaved.weight"]
used = model.model.layers[0].mlp.gate_up_proj.weight
print(json.dumps({"imported": "swiglu_fused" in sys.modules, "mlp": type(model.model.layers[0].mlp).__name__,
                  "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
                  "packed_rows_used": bool(torch.equal(used, packed))}))
"""


def test_unpatched_phi3_does_not_run_the_interleaved_rows(tmp_path):
    """Format v1 named the packed projection gate_up_proj, so a packed Phi-3 bf16 checkpoint loaded
    without `import swiglu_fused` filled Phi3MLP.gate_up_proj with interleaved rows and ran them as
    [gate; up], without a word. Under v2 transformers (which skips the unknown quant_method with a
    warning) reports gate_up_proj.weight MISSING and gate_up_interleaved.weight UNEXPECTED, and the
    packed rows are not used."""
    src, dst = tmp_path / "src", tmp_path / "packed"
    make_causal_lm(src, "phi3")
    convert(src, dst, weight_format="bf16", progress=False)
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"}  # conftest silences it
    out = subprocess.run([sys.executable, "-c", UNPATCHED, str(dst)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert not got["imported"] and got["mlp"] == "Phi3MLP"
    assert [f"model.layers.{i}.mlp.gate_up_proj.weight" for i in (0, 1)] == got["missing"]
    assert [f"model.layers.{i}.mlp.gate_up_interleaved.weight" for i in (0, 1)] == got["unexpected"]
    assert not got["packed_rows_used"]
    assert "Unknown quantization type, got swiglu_fused" in out.stderr
    assert "LOAD REPORT" in out.stderr and "MISSING" in out.stderr and "UNEXPECTED" in out.stderr


# ---------------------------------------------------------------- item 8: API edges
def test_patch_model_with_an_interleave_no_mlp_can_use_raises(tmp_path):
    model = make_causal_lm(tmp_path / "m", "llama", inter=320)
    with pytest.raises(FormatError, match=r"interleave: 128 divides the intermediate size of none of the 2 MLPs "
                                          r"\(I = 320\).*nothing was changed"):
        patch_model(model, weight_format="fp8_block128")
    with pytest.raises(FormatError, match=r"interleave: 256 .*\(I = 320\): .*use interleave=160 or interleave=80 or interleave=64; nothing"):
        patch_model(model, weight_format="bf16", interleave=256)
    assert not any(isinstance(m, FusedSwiGLUMLP) for m in model.modules())
    assert not hasattr(model.config, "quantization_config")


def test_repatching_with_another_format_says_why_nothing_was_swapped(tmp_path):
    model = make_causal_lm(tmp_path / "m", "llama")
    assert len(patch_model(model, weight_format="fp8_block128").swapped) == 2
    before = {n: b.clone() for n, b in model.model.layers[0].mlp.state_dict().items()}
    report = patch_model(model, weight_format="nvfp4")
    assert report.swapped == []
    why = "already packed as fp8_block128 (g=128); load the original model to pack it again"
    assert report.skipped == {"model.layers.0.mlp": why, "model.layers.1.mlp": why}
    assert str(report).splitlines()[1:] == [f"  left as is: model.layers.{i}.mlp: {why}" for i in (0, 1)]
    mlp = model.model.layers[0].mlp
    assert mlp.weight_format == "fp8_block128"
    assert all(torch.equal(b.view(torch.uint8), before[n].view(torch.uint8)) for n, b in mlp.state_dict().items())
    assert model.config.quantization_config.packed.weight_format == "fp8_block128"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float8_e4m3fn])
def test_input_dtype_error_names_the_input(dtype):
    torch.manual_seed(0)
    mlp = FusedSwiGLUMLP.from_linear(torch.randn(128, 64), torch.randn(128, 64), torch.randn(64, 128),
                                     weight_format="bf16")
    x = torch.randn(3, 64).to(dtype)
    with pytest.raises(TypeError) as e:
        mlp(x)
    msg = str(e.value)
    assert msg.startswith("x: ") and str(dtype) in msg and "torch.bfloat16" in msg and "torch.float32" in msg
    assert "out_dtype" not in msg
    assert mlp(x.float()).dtype == torch.float32  # the fix the message gives works


def test_quantizer_checks_the_directory_when_transformers_names_no_files(tmp_path, packed_fp8):
    """transformers 4.x calls the quantizer without checkpoint_files: the checks then read the
    directory from_pretrained was given, and refuse (rather than skip) when there is none."""
    from swiglu_fused.integrations.transformers import _classes

    config_cls, quantizer_cls = _classes()
    cfg = json.loads((packed_fp8 / "config.json").read_text())["quantization_config"]
    quantizer = quantizer_cls(config_cls(**cfg), pre_quantized=True)
    stored = quantizer._check_checkpoint(None, str(packed_fp8))
    assert stored[f"{MLP}.{formats.GATE_UP}.weight"] == (packed_fp8 / "model.safetensors", (768, 128))
    dst = _copy(packed_fp8, tmp_path)
    _edit_config(dst, interleave=256)
    cfg = json.loads((dst / "config.json").read_text())["quantization_config"]
    with pytest.raises(FormatError, match=r"interleave: file says 128 but config.json says 256"):
        quantizer_cls(config_cls(**cfg), pre_quantized=True)._check_checkpoint(None, str(dst))
    with pytest.raises(FormatError, match=r"from_pretrained\('org/model'\): .* pass its local directory"):
        quantizer._check_checkpoint(None, "org/model")
