"""Existing FP8 and NVFP4 checkpoints, written by the real producers, repack by moving bytes."""

import json
import shutil
import types

import torch

from swiglu_fused.weight_packing import pack
from swiglu_fused.weight_packing import safetensors_io as sio
from swiglu_fused.weight_packing.convert import convert
from swiglu_fused.weight_packing.packed_checkpoint import PackedCheckpoint
from swiglu_fused.weight_packing.verify import verify

from conftest import DATA, _causal_lm, make_causal_lm, make_ct_nvfp4, make_modelopt_nvfp4

FP8_DATA = DATA / "tiny-llama-fp8"  # written by transformers 5.17 FineGrainedFP8 on an H100


def _source(path):
    out = {}
    for f in sio.checkpoint_files(path):
        out.update(sio.load_file(f))
    return out


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def _check_bit_exact(dst, src_tensors, layers, fmt, names):
    """De-interleave every packed MLP and compare each value and scale byte with the source."""
    ckpt = PackedCheckpoint(dst)
    for i in range(layers):
        module = f"model.layers.{i}.mlp"
        gu, dn = ckpt.module(module)
        gate, up = pack.unpack_gate_up(gu, fmt, ckpt.config.interleave, ckpt.config.global_scale_kind)
        for proj, got in (("gate_proj", gate.tensors), ("up_proj", up.tensors), ("down_proj", dn)):
            for ours, theirs in names.items():
                expected = src_tensors[f"{module}.{proj}.{theirs}"]
                assert torch.equal(_bytes(got[ours].reshape(expected.shape)), _bytes(expected)), (module, proj, ours)


def test_transformers_fp8_checkpoint_repacks_bit_exactly(tmp_path):
    dst = tmp_path / "dst"
    report = convert(FP8_DATA, dst, weight_format="fp8_block128", progress=False)
    assert report.source_format == "fp8_block128" and report.repacked == 6 and report.quantized == 0
    _check_bit_exact(dst, _source(FP8_DATA), 2, "fp8_block128",
                     {"weight": "weight", "weight_scale_inv": "weight_scale_inv"})
    checked = verify(dst, against=FP8_DATA)
    assert checked.ok and all(c.mode == "bit-exact" for c in checked.checks), checked.summary()
    qcfg = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qcfg["source"]["quantization_config"]["quant_method"] == "fp8"
    # attention projections stay in transformers' FP8 form, untouched
    src = _source(FP8_DATA)
    out = _source(dst)
    assert torch.equal(_bytes(out["model.layers.1.self_attn.q_proj.weight"]),
                       _bytes(src["model.layers.1.self_attn.q_proj.weight"]))


def test_fp8_packed_weights_agree_with_transformers_own_dequantization(tmp_path):
    """transformers loads the FP8 checkpoint on the CPU by dequantizing it; our packed weights,
    dequantized and de-interleaved, must be the same numbers."""
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    dst = tmp_path / "dst"
    convert(FP8_DATA, dst, weight_format="fp8_block128", progress=False)
    model = AutoModelForCausalLM.from_pretrained(
        FP8_DATA, quantization_config=FineGrainedFP8Config(weight_block_size=[128, 128], dequantize=True),
        dtype=torch.float32)
    ckpt = PackedCheckpoint(dst)
    for i, layer in enumerate(model.model.layers):
        gu, dn = ckpt.module(f"model.layers.{i}.mlp")
        gate, up = pack.unpack_gate_up(gu, "fp8_block128", 128)
        for ours, theirs in ((gate, layer.mlp.gate_proj), (up, layer.mlp.up_proj),
                             (pack.Projection("fp8_block128", dn, "down"), layer.mlp.down_proj)):
            assert torch.equal(pack.dequantize(ours), theirs.weight.float())


def test_fp8_to_other_formats_requantizes(tmp_path):
    for fmt in ("bf16", "nvfp4"):
        report = convert(FP8_DATA, tmp_path / fmt, weight_format=fmt, progress=False)
        assert report.quantized == 6
        assert verify(tmp_path / fmt, against=FP8_DATA).ok


def test_fp8_e8m0_scales_are_accepted(tmp_path):
    """transformers 5 can store weight_scale_inv as float8_e8m0fnu (scale_fmt "ue8m0"): its quantizer
    is run on the CPU to make such a checkpoint; conversion turns the scales into exact fp32."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    src = tmp_path / "src"
    shutil.copytree(FP8_DATA, src)
    cfg = FineGrainedFP8Config(weight_block_size=[128, 128], scale_fmt="ue8m0")
    quantizer = Fp8Quantize(types.SimpleNamespace(quantization_config=cfg))
    torch.manual_seed(3)
    dense = _causal_lm("llama", 128, 384)
    for f in sio.checkpoint_files(src):
        tensors = {k: v.clone() for k, v in sio.load_file(f).items()}  # the file is mapped: copy first
        for name in list(tensors):
            if ".mlp." in name and name.endswith(".weight"):
                tensors.update(quantizer._quantize_one(name, dense.get_parameter(name).detach()))
        sio.write_file(tensors, f, {"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["scale_fmt"] = "ue8m0"
    (src / "config.json").write_text(json.dumps(config))
    assert _source(src)["model.layers.0.mlp.up_proj.weight_scale_inv"].dtype == torch.float8_e8m0fnu
    dst = tmp_path / "dst"
    report = convert(src, dst, weight_format="fp8_block128", progress=False)
    assert report.repacked == 6
    checked = verify(dst, against=src)
    assert checked.ok, checked.summary()
    scale = _source(dst)["model.layers.0.mlp.gate_up_interleaved.weight_scale_inv"]
    assert scale.dtype == torch.float32 and torch.all(torch.log2(scale) == torch.log2(scale).round())


def test_compressed_tensors_nvfp4_repacks_bit_exactly(tmp_path):
    src, dst = tmp_path / "ct", tmp_path / "dst"
    torch.manual_seed(0)
    make_ct_nvfp4(src, _causal_lm("qwen3", 128, 384))
    report = convert(src, dst, weight_format="nvfp4", progress=False)
    assert report.source_format == "nvfp4" and report.repacked == 6
    ckpt = PackedCheckpoint(dst)
    assert ckpt.config.global_scale_kind == "divisor"
    _check_bit_exact(dst, _source(src), 2, "nvfp4", {
        "weight_packed": "weight_packed", "weight_scale": "weight_scale", "weight_global_scale": "weight_global_scale"})
    assert verify(dst, against=src).ok


def test_modelopt_nvfp4_repacks_bit_exactly(tmp_path):
    bf16, src, dst = tmp_path / "bf16", tmp_path / "modelopt", tmp_path / "dst"
    make_causal_lm(bf16, "llama")
    make_modelopt_nvfp4(bf16, src)
    assert json.loads((src / "config.json").read_text())["quantization_config"]["quant_algo"] == "NVFP4"
    report = convert(src, dst, weight_format="nvfp4", progress=False)
    assert report.repacked == 6 and report.dropped  # input_scale: not used by the weight-only format
    ckpt = PackedCheckpoint(dst)
    assert ckpt.config.global_scale_kind == "multiplier"
    _check_bit_exact(dst, _source(src), 2, "nvfp4", {
        "weight_packed": "weight", "weight_scale": "weight_scale", "weight_global_scale": "weight_scale_2"})
    checked = verify(dst, against=src)
    assert checked.ok, checked.summary()
