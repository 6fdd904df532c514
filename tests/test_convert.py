"""Converting real tiny checkpoints of every supported family into every format."""

import hashlib
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import swiglu_fused
from swiglu_fused import FusedSwiGLUMLP, formats
from swiglu_fused.weight_packing import safetensors_io as sio
from swiglu_fused.weight_packing.convert import convert
from swiglu_fused.weight_packing.packed_checkpoint import PackedCheckpoint
from swiglu_fused.weight_packing.verify import format_table, inspect, verify

from conftest import make_causal_lm, make_flux2

MLP_BOUND = {"bf16": 0.01, "fp8_block128": 0.08, "nvfp4": 0.2}  # vs the bf16 module, on random inputs


def _all_tensors(path):
    out = {}
    for f in sio.checkpoint_files(path):
        out.update(sio.load_file(f))
    return out


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma", "phi3"])
@pytest.mark.parametrize("fmt", ["bf16", "fp8_block128", "nvfp4"])
def test_causal_lm_families(tmp_path, family, fmt):
    src, dst = tmp_path / "src", tmp_path / "dst"
    model = make_causal_lm(src, family)
    report = convert(src, dst, weight_format=fmt, progress=False)
    assert report.modules == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert report.activation == ("gelu_tanh" if family == "gemma" else "silu")
    checked = verify(dst, against=src)
    assert checked.ok, checked.summary()
    ckpt = PackedCheckpoint(dst)
    x = torch.randn(3, 5, 128).to(torch.bfloat16)
    for i, module in enumerate(ckpt.config.modules):
        fused = FusedSwiGLUMLP.from_packed(ckpt, module)
        with torch.no_grad():
            expected = model.model.layers[i].mlp(x)
        assert _rel(fused(x), expected) < MLP_BOUND[fmt], module
    # everything that is not an MLP projection is carried over bit for bit
    before, after = _all_tensors(src), _all_tensors(dst)
    for name, t in before.items():
        if ".mlp." not in name:
            assert torch.equal(after[name], t), name
    assert (dst / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert (dst / "generation_config.json").is_file()


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block128", "nvfp4"])
def test_flux2_transformer(tmp_path, fmt):
    src, dst = tmp_path / "flux2", tmp_path / "dst"
    model = make_flux2(src)
    report = convert(src, dst, weight_format=fmt, progress=False)
    assert report.modules == ["transformer_blocks.0.ff", "transformer_blocks.0.ff_context",
                              "transformer_blocks.1.ff", "transformer_blocks.1.ff_context"]
    assert verify(dst, against=src).ok
    ckpt = PackedCheckpoint(dst)
    fused = FusedSwiGLUMLP.from_packed(ckpt, "transformer_blocks.1.ff_context")
    x = torch.randn(4, 128).to(torch.bfloat16)
    with torch.no_grad():
        expected = model.transformer_blocks[1].ff_context(x)
    assert _rel(fused(x), expected) < MLP_BOUND[fmt]
    # the single-stream blocks' fused QKV+MLP projection is packed as a split projection (QKV rows as
    # they are, then gate/up interleaved: tests/test_flux2.py checks its values)
    tensors = _all_tensors(dst)
    name = formats.weight_format(fmt).weight_name
    assert f"single_transformer_blocks.0.attn.to_qkv_mlp_proj.{formats.SPLIT}.{name}" in tensors
    assert "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight" not in tensors


def test_hidden_not_multiple_of_128_and_several_shards(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    model = make_causal_lm(src, "llama", hidden=192, inter=384, max_shard_size="100KB")
    assert len(sio.checkpoint_files(src)) >= 4
    report = convert(src, dst, weight_format="fp8_block128", progress=False)
    # a shard whose halves all waited for a partner is not written: the others are numbered 1..n of n
    names = [p.name for p in sio.checkpoint_files(dst)]
    assert names == [f"model-{i:05d}-of-{len(names):05d}.safetensors" for i in range(1, len(names) + 1)]
    index = json.loads((dst / formats.INDEX_FILE).read_text())
    tensors = _all_tensors(dst)
    assert set(index["weight_map"]) == set(tensors)
    scale = tensors["model.layers.0.mlp.gate_up_interleaved.weight_scale_inv"]
    assert scale.shape == (6, 2)  # ceil(768/128) x ceil(192/128): a partial last block
    assert tensors["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (2, 3)
    assert verify(dst, against=src).ok
    x = torch.randn(4, 192).to(torch.bfloat16)
    fused = FusedSwiGLUMLP.from_packed(PackedCheckpoint(dst), "model.layers.1.mlp")
    with torch.no_grad():
        assert _rel(fused(x), model.model.layers[1].mlp(x)) < MLP_BOUND["fp8_block128"]
    assert report.quantized == 6 and report.repacked == 0


def test_fp32_source_and_other_interleaves(tmp_path):
    src = tmp_path / "src"
    make_causal_lm(src, "qwen3", dtype=torch.float32)
    for g in (1, 3, 384):
        dst = tmp_path / f"g{g}"
        convert(src, dst, weight_format="bf16", interleave=g, progress=False)
        assert PackedCheckpoint(dst).config.interleave == g
        assert verify(dst, against=src).ok


def _digest(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_conversion_is_deterministic_across_processes(tmp_path):
    src = tmp_path / "src"
    make_causal_lm(src, "llama", max_shard_size="200KB")
    code = textwrap.dedent("""
        import sys
        from swiglu_fused import convert
        convert(sys.argv[1], sys.argv[2], weight_format="nvfp4", progress=False)
    """)
    for name in ("a", "b"):  # separate processes: no shared hash seeds or caches
        subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / name)], check=True)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")


def test_existing_destination_is_refused_unless_forced(tmp_path, tiny_llama):
    src, _ = tiny_llama
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="already exists and is a directory that is not"):
        convert(src, dst, progress=False)
    with pytest.raises(FileExistsError, match="force=True replaces only"):  # not a packed output: the user's
        convert(src, dst, force=True, progress=False)
    assert (dst / "keep.txt").read_text() == "mine"
    (dst / "keep.txt").unlink()  # an empty directory, then a packed output, may be replaced
    convert(src, dst, weight_format="nvfp4", force=True, progress=False)
    with pytest.raises(FileExistsError, match="already exists; pass force=True to replace it"):
        convert(src, dst, progress=False)
    convert(src, dst, weight_format="bf16", force=True, progress=False)
    assert verify(dst).ok and PackedCheckpoint(dst).config.weight_format == "bf16"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_failure_midway_leaves_nothing_behind(tmp_path, monkeypatch):
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_causal_lm(src, "llama", max_shard_size="100KB")
    real_write = sio.write_file
    calls = []

    def failing_write(tensors, path, metadata):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full")
        real_write(tensors, path, metadata)

    monkeypatch.setattr(sio, "write_file", failing_write)
    with pytest.raises(OSError, match="disk full"):
        convert(src, dst, progress=False)
    assert len(calls) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_progress_bar_reports_bytes(tmp_path, tiny_llama, capsys):
    src, _ = tiny_llama
    convert(src, tmp_path / "dst", weight_format="bf16", progress=True)
    err = capsys.readouterr().err
    assert "convert" in err and "100%" in err


def test_peak_memory_is_bounded_by_a_shard(tmp_path):
    """A 12-shard checkpoint of ~100 MB converts with a peak far below the checkpoint's size."""
    src = tmp_path / "src"
    code = textwrap.dedent("""
        import sys, torch
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=4,
                          num_key_value_heads=1, vocab_size=256, architectures=["LlamaForCausalLM"])
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1], max_shard_size="8MB")
    """)
    subprocess.run([sys.executable, "-c", code, str(src)], check=True)
    files = sio.checkpoint_files(src)
    total = sum(f.stat().st_size for f in files)
    largest = max(f.stat().st_size for f in files)
    assert len(files) >= 10 and total > 80e6
    measure = textwrap.dedent("""
        import resource, sys
        import swiglu_fused, torch  # imports first: the baseline includes torch itself
        from swiglu_fused.weight_packing import convert as c
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        c.convert(sys.argv[1], sys.argv[2], weight_format="fp8_block128", progress=False)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
    """)
    out = subprocess.run([sys.executable, "-c", measure, str(src), str(tmp_path / "dst")], check=True,
                         capture_output=True, text=True).stdout
    peak = int(out.split()[-1])
    # one source shard, its fp32 working copies and its output, never the whole checkpoint
    assert peak < 6 * largest, (peak, largest, total)
    assert peak < total / 2, (peak, total)


def test_inspect_table(tmp_path, tiny_llama):
    src, _ = tiny_llama
    dst = tmp_path / "dst"
    convert(src, dst, weight_format="nvfp4", progress=False)
    cfg, rows = inspect(dst)
    assert [r.gate_up_shape for r in rows] == [(768, 128)] * 2 and rows[0].down_shape == (128, 384)
    table = format_table(cfg, rows)
    assert "model.layers.1.mlp" in table and "global_scale_kind=divisor" in table


def test_public_api_is_importable():
    assert swiglu_fused.convert is convert and swiglu_fused.FORMAT_VERSION == 2
