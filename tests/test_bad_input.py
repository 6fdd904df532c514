"""Bad input gets an error that names the file, tensor or argument, and leaves nothing behind."""

import json
import struct

import pytest
import torch

from swiglu_fused import formats
from swiglu_fused.formats import FormatError
from swiglu_fused.weight_packing import safetensors_io as sio
from swiglu_fused.weight_packing.convert import convert
from swiglu_fused.weight_packing.packed_checkpoint import PackedCheckpoint
from swiglu_fused.weight_packing.verify import validate, verify

from conftest import DATA, make_causal_lm


def _convert_fails(src, tmp_path, exc, match, **kw):
    dst = tmp_path / "dst"
    with pytest.raises(exc, match=match):
        convert(src, dst, progress=False, **kw)
    leftovers = [p.name for p in dst.parent.iterdir() if p.name.startswith(".dst") or p.name == "dst"]
    assert leftovers == [], leftovers


def _one_file(src):
    return src / "model.safetensors"


def _rewrite_header(path, edit):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edit(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def test_missing_config(tmp_path):
    (tmp_path / "src").mkdir()
    _convert_fails(tmp_path / "src", tmp_path, FormatError, "config.json: missing")


def test_truncated_file(tmp_path, tiny_llama):
    src, _ = tiny_llama
    f = _one_file(src)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    _convert_fails(src, tmp_path, sio.CheckpointError, r"model\.safetensors: tensor .* run past the data section")


def test_verify_of_a_truncated_packed_file_names_it_once(tmp_path, tiny_llama):
    """verify on a packed checkpoint whose shard lost its tail: one violation, naming the file once,
    and not its tensors as "missing" (they are in the header; the file is the problem)."""
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, weight_format="bf16", progress=False)
    f = _one_file(dst)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    lines = [str(v) for v in verify(dst).violations]
    assert len(lines) == 1 and lines[0].count(str(f)) == 1 and "truncated or corrupt" in lines[0], lines


def test_file_too_short_for_a_header(tmp_path, tiny_llama):
    src, _ = tiny_llama
    _one_file(src).write_bytes(b"\x01\x02")
    _convert_fails(src, tmp_path, sio.CheckpointError, "too short to hold a safetensors header")


def test_header_length_past_the_end(tmp_path, tiny_llama):
    src, _ = tiny_llama
    f = _one_file(src)
    raw = f.read_bytes()
    f.write_bytes(struct.pack("<Q", len(raw) * 4) + raw[8:])
    _convert_fails(src, tmp_path, sio.CheckpointError, "header length .* runs past the end")


def test_header_not_json(tmp_path, tiny_llama):
    src, _ = tiny_llama
    f = _one_file(src)
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    f.write_bytes(raw[:8] + b"{" * n + raw[8 + n:])
    _convert_fails(src, tmp_path, sio.CheckpointError, "not valid JSON")


def test_offsets_out_of_range(tmp_path, tiny_llama):
    src, _ = tiny_llama
    name = "model.layers.1.mlp.up_proj.weight"

    def edit(h):
        b, e = h[name]["data_offsets"]
        h[name]["data_offsets"] = [b + 10**9, e + 10**9]
    _rewrite_header(_one_file(src), edit)
    _convert_fails(src, tmp_path, sio.CheckpointError, rf"tensor '{name}': data_offsets .* past the data section")


def test_dtype_disagreeing_with_byte_size(tmp_path, tiny_llama):
    src, _ = tiny_llama
    name = "model.layers.0.mlp.gate_proj.weight"
    _rewrite_header(_one_file(src), lambda h: h[name].update(dtype="F32"))
    _convert_fails(src, tmp_path, sio.CheckpointError, rf"'{name}': dtype F32 and shape \[384, 128\] need")


def test_shape_disagreeing_with_byte_size(tmp_path, tiny_llama):
    src, _ = tiny_llama
    name = "model.layers.0.mlp.down_proj.weight"
    _rewrite_header(_one_file(src), lambda h: h[name].update(shape=[128, 385]))
    _convert_fails(src, tmp_path, sio.CheckpointError, "need .* bytes but data_offsets span")


def test_index_naming_a_missing_shard(tmp_path):
    src = tmp_path / "src"
    make_causal_lm(src, max_shard_size="100KB")
    sorted(src.glob("model-*.safetensors"))[1].unlink()
    _convert_fails(src, tmp_path, sio.CheckpointError, "lists shard.* that do not exist")


def test_unknown_architecture(tmp_path, tiny_llama):
    src, _ = tiny_llama
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (src / "config.json").write_text(json.dumps(cfg))
    _convert_fails(src, tmp_path, FormatError, r"unknown architecture \['GPT2LMHeadModel'\]; swiglu-fused converts")


def _drop_tensor(src, name):
    f = _one_file(src)
    tensors = {k: v.clone() for k, v in sio.load_file(f).items() if k != name}
    sio.write_file(tensors, f, {"format": "pt"})


def test_missing_up_projection(tmp_path, tiny_llama):
    src, _ = tiny_llama
    _drop_tensor(src, "model.layers.1.mlp.up_proj.weight")
    _convert_fails(src, tmp_path, FormatError, r"model\.layers\.1\.mlp\.up_proj\.weight: missing")


def test_missing_gate_projection(tmp_path, tiny_llama):
    src, _ = tiny_llama
    _drop_tensor(src, "model.layers.0.mlp.gate_proj.weight")
    _convert_fails(src, tmp_path, FormatError, r"model\.layers\.0\.mlp\.gate_proj\.weight: missing")


def test_mismatched_gate_and_up_shapes(tmp_path, tiny_llama):
    src, _ = tiny_llama
    f = _one_file(src)
    tensors = {k: v.clone() for k, v in sio.load_file(f).items()}
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.randn(256, 128).bfloat16()
    sio.write_file(tensors, f, {"format": "pt"})
    _convert_fails(src, tmp_path, FormatError, r"gate_proj \(in model\.safetensors\) is \[384, 128\] but "
                                                r".*up_proj \(in model\.safetensors\) is \[256, 128\]")


def test_a_shape_error_names_the_shard_that_holds_the_tensor(tmp_path):
    """In a checkpoint of many shards the message says which one to look in."""
    from conftest import _causal_lm

    src = tmp_path / "src"
    torch.manual_seed(0)
    _causal_lm("llama", 128, 384).save_pretrained(src, max_shard_size="200KB")
    name = "model.layers.1.mlp.down_proj.weight"
    shard = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = {k: v.clone() for k, v in sio.load_file(src / shard).items()}
    tensors[name] = tensors[name][:, :256].contiguous()
    sio.write_file(tensors, src / shard, {"format": "pt"})
    _convert_fails(src, tmp_path, FormatError,
                   rf"model\.layers\.1\.mlp\.down_proj \(in {shard.replace('.', '[.]')}\) is \[128, 256\]; "
                   r"expected \[128, 384\]")


def test_an_mlp_with_a_bias_is_refused_naming_the_tensor_and_its_shard(tmp_path, tiny_llama):
    """A problem found while packing a shard's tensors (here an MLP bias, which the packed format
    has no place for) names the tensor and the shard it came in."""
    src, _ = tiny_llama
    f = _one_file(src)
    tensors = {k: v.clone() for k, v in sio.load_file(f).items()}
    tensors["model.layers.0.mlp.up_proj.bias"] = torch.zeros(384).bfloat16()
    sio.write_file(tensors, f, {"format": "pt"})
    _convert_fails(src, tmp_path, FormatError,
                   r"^model\.layers\.0\.mlp\.up_proj\.bias: gated MLPs with a bias are not supported .* \(in model\.safetensors\)$")


def test_intermediate_not_a_multiple_of_g_names_a_g_that_works(tmp_path):
    src = tmp_path / "src"
    make_causal_lm(src, inter=320)  # 320 = 2.5 x 128
    _convert_fails(src, tmp_path, FormatError, "I = 320 is not a multiple of interleave=128; use interleave=160 or interleave=80 or interleave=64",
                   weight_format="bf16")
    _convert_fails(src, tmp_path, FormatError, "no interleave works for format fp8_block128",
                   weight_format="fp8_block128")
    convert(src, tmp_path / "ok", weight_format="bf16", interleave=64, progress=False)


def test_a_format_that_cannot_hold_i_names_whole_flags_that_convert(tmp_path, capsys):
    """fp8_block128 cannot hold I = 320: the refusal names each other format with the interleave it
    needs, and each suggestion converts in one run (it used to name the formats only, and the run
    with one of them was refused again for the interleave)."""
    import re

    from swiglu_fused.cli import main

    src = tmp_path / "src"
    make_causal_lm(src, inter=320)
    assert main(["convert", str(src), str(tmp_path / "dst"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "choose --format bf16 --interleave 160 or --format nvfp4 --interleave 160" in err, err
    for i, flags in enumerate(re.search(r"choose (.*)$", err.strip()).group(1).split(" or ")):
        assert main(["convert", str(src), str(tmp_path / f"ok{i}"), "--no-progress", *flags.split()]) == 0


def test_fp8_source_with_other_block_size(tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(DATA / "tiny-llama-fp8", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [64, 64]
    (src / "config.json").write_text(json.dumps(cfg))
    _convert_fails(src, tmp_path, FormatError, r"weight_block_size is \[64, 64\]; only fine-grained FP8 with \[128, 128\]")


def test_source_format_disagreeing_with_the_checkpoint(tmp_path, tiny_llama):
    src, _ = tiny_llama
    _convert_fails(src, tmp_path, FormatError, "source_format='nvfp4' but .* describes a dense checkpoint",
                   source_format="nvfp4")


def test_packed_file_of_a_newer_format_version_is_refused(tmp_path, tiny_llama):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, weight_format="bf16", progress=False)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"]["format_version"] = formats.FORMAT_VERSION + 1
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=r"config\.json.*format_version: format version 3 is newer than this"):
        PackedCheckpoint(dst)
    report = verify(dst)
    assert not report.ok and any(v.field == "format_version" for v in report.violations)


def test_packed_file_whose_metadata_disagrees_with_config(tmp_path, tiny_llama):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, weight_format="bf16", progress=False)
    f = dst / "model.safetensors"
    meta = json.loads(sio.read_header(f).metadata[formats.METADATA_KEY])
    meta[formats.K_INTERLEAVE] = 64
    _rewrite_header(f, lambda h: h["__metadata__"].update({formats.METADATA_KEY: json.dumps(meta)}))
    with pytest.raises(FormatError, match=r"model\.safetensors / interleave: file says 64 but config.json says 128"):
        PackedCheckpoint(dst)


def test_validator_reports_every_violation_with_file_tensor_and_field(tmp_path, tiny_llama):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, weight_format="fp8_block128", progress=False)
    f = dst / "model.safetensors"
    tensors = {k: v.clone() for k, v in sio.load_file(f).items()}
    del tensors["model.layers.0.mlp.down_proj.weight_scale_inv"]
    tensors["model.layers.1.mlp.gate_up_interleaved.weight_scale_inv"] = torch.ones(6, 2)
    tensors["model.layers.1.mlp.down_proj.weight"] = tensors["model.layers.1.mlp.down_proj.weight"].float()
    sio.write_file(tensors, f, sio.read_header(dst / "model.safetensors").metadata)
    problems = [str(v) for v in validate(dst)]
    assert "model.layers.0.mlp.down_proj.weight_scale_inv: missing" in problems
    assert any("model.layers.1.mlp.gate_up_interleaved.weight_scale_inv / shape: expected [6, 1], found [6, 2]" in p
               for p in problems)
    assert any("model.layers.1.mlp.down_proj.weight / dtype: expected torch.float8_e4m3fn, found torch.float32" in p
               for p in problems)
    assert all(str(f) in p for p in problems if "missing" not in p)
    assert not verify(dst).ok


def test_unknown_format_and_bad_interleave_arguments(tmp_path, tiny_llama):
    src, _ = tiny_llama
    _convert_fails(src, tmp_path, FormatError, "unknown weight format 'int4'", weight_format="int4")
    _convert_fails(src, tmp_path, FormatError, "interleave 64 is not a multiple of 128", weight_format="fp8_block128",
                   interleave=64)
    _convert_fails(src, tmp_path, FormatError, "interleave must be a positive integer", weight_format="bf16",
                   interleave=0)
