"""What convert refuses in a source and verify reports in a packed checkpoint (issue 19 items 3, 6, 7).

The value rules are one function, pack.value_problem, applied to the source at pack time and to
the packed tensors by verify:

* refused: NaN or infinite weights (e4m3: the NaN codes 0x7F / 0xFF); NaN, infinite or negative
  scales; an NVFP4 global scale that is not one element per source projection, or is 0 (the run
  time divides by a divisor and multiplies by a multiplier), or would dequantize beyond fp32;
  NVFP4 block scales not e4m3 [N, ceil(K/16)];
* accepted: a zero block scale (an all-zero block, a pruned region): it dequantizes to exact zeros.

Every bad input is made from a real tiny checkpoint (transformers, compressed-tensors, ModelOpt,
the transformers FP8 checkpoint in tests/data).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from swiglu_fused import formats
from swiglu_fused.cli import main
from swiglu_fused.weight_packing import pack
from swiglu_fused.weight_packing import safetensors_io as sio
from swiglu_fused.weight_packing.convert import convert
from swiglu_fused.weight_packing.verify import _compare, inspect, verify

from conftest import DATA, _causal_lm, make_causal_lm, make_ct_nvfp4, make_modelopt_nvfp4

GU, DN = formats.GATE_UP, formats.DOWN


# ---------------------------------------------------------------- helpers
def _hashes(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def _edit_source(f: Path, change) -> None:
    """Rewrite a source safetensors file as its producer would (safetensors.torch, same metadata)."""
    with safe_open(str(f), framework="pt") as opened:
        metadata = opened.metadata()
    tensors = {k: v.clone() for k, v in load_file(str(f)).items()}
    change(tensors)
    tmp = f.with_name("edited.tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(f)


def _edit_packed(f: Path, change) -> None:
    """Rewrite a packed file with its own metadata (swiglu-fused's writer)."""
    tensors = {k: v.clone() for k, v in sio.load_file(f).items()}
    change(tensors)
    tmp = f.with_name("edited.tmp")
    sio.write_file(tensors, tmp, sio.read_header(f).metadata)
    tmp.replace(f)


def _set(name: str, value, index=(0, 0)):
    def change(tensors):
        t = tensors[name]
        t[index if t.dim() else ()] = value
    return change


def _set_byte(name: str, byte: int, index=(0, 0)):
    """Write a raw byte into an e4m3 tensor (its NaN codes cannot be written as floats)."""
    def change(tensors):
        tensors[name].view(torch.uint8)[index] = byte
    return change


def _refused(tmp_path, src, capsys, *names, args=()):
    """convert SRC → DST through the CLI: exit 2, one line naming every string in ``names``, nothing at
    DST, no hidden leftovers, SRC byte-identical."""
    before = _hashes(src)
    dst = tmp_path / "out"
    capsys.readouterr()  # what making SRC printed
    assert main(["convert", str(src), str(dst), "--no-progress", *args]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.err + captured.out
    assert len(err.splitlines()) == 1, err
    for name in names:
        assert name in err, err
    assert not dst.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert _hashes(src) == before
    return err


def _verify_fails(dst, capsys, *needles):
    """verify without --against: FAILED naming every string in ``needles`` (CLI exit 1)."""
    report = verify(dst)
    assert not report.ok
    text = report.summary()
    for needle in needles:
        assert needle in text, text
    assert main(["verify", str(dst)]) == 1
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and needles[0] in out.out
    return report


@pytest.fixture(scope="module")
def ct_nvfp4(tmp_path_factory):
    src = tmp_path_factory.mktemp("ct") / "ct"
    torch.manual_seed(0)
    make_ct_nvfp4(src, _causal_lm("llama", 128, 384))
    return src


@pytest.fixture(scope="module")
def modelopt_nvfp4(tmp_path_factory):
    base = tmp_path_factory.mktemp("modelopt")
    make_causal_lm(base / "bf16")
    make_modelopt_nvfp4(base / "bf16", base / "modelopt")
    return base / "modelopt"


def _copy(src: Path, tmp_path: Path, name: str = "src") -> Path:
    out = tmp_path / name
    shutil.copytree(src, out)
    return out


# ---------------------------------------------------------------- source: dense weights
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("proj", ["up_proj", "down_proj"])
def test_non_finite_dense_weight_is_refused(tmp_path, tiny_llama, capsys, value, proj):
    src, _ = tiny_llama
    name = f"model.layers.1.mlp.{proj}.weight"
    _edit_source(src / "model.safetensors", _set(name, value, (3, 5)))
    err = _refused(tmp_path, src, capsys, name, "1 of 49152 values are NaN or infinite (first at [3, 5]")


def test_fp32_weights_beyond_bf16_range_are_refused_for_bf16(tmp_path, capsys):
    src = tmp_path / "fp32"
    make_causal_lm(src, dtype=torch.float32)
    name = "model.layers.0.mlp.gate_proj.weight"
    _edit_source(src / "model.safetensors", _set(name, 3.4e38))
    _refused(tmp_path, src, capsys, "model.layers.0.mlp.gate_proj", "exceed bfloat16's range", args=["--format", "bf16"])
    # the block formats scale it: converted, and the output passes verify
    dst = tmp_path / "fp8"
    assert main(["convert", str(src), str(dst), "--no-progress", "--format", "fp8_block128"]) == 0
    assert verify(dst, against=src).ok


def test_nvfp4_with_an_odd_intermediate_size_is_refused(tmp_path, capsys):
    src = tmp_path / "odd"
    model = make_causal_lm(src, inter=383)
    _refused(tmp_path, src, capsys, "model.layers.0.mlp", "383", args=["--format", "nvfp4", "--interleave", "1"])
    # pack itself refuses it too (a FormatError, not quant's ValueError), whoever calls it
    down = model.model.layers[0].mlp.down_proj.weight.detach()
    with pytest.raises(formats.FormatError, match="even number of columns; this projection has 383"):
        pack.quantize(down.float(), "nvfp4", "model.layers.0.mlp.down_proj")


# ---------------------------------------------------------------- source: transformers fine-grained FP8
FP8_SHARD = "model-00003-of-00004.safetensors"  # holds model.layers.1.mlp.*


@pytest.mark.parametrize("suffix,byte", [("weight", 0x7F), ("weight", 0xFF)])
def test_fp8_weight_nan_code_is_refused(tmp_path, capsys, suffix, byte):
    src = _copy(DATA / "tiny-llama-fp8", tmp_path)
    name = f"model.layers.1.mlp.gate_proj.{suffix}"
    _edit_source(src / FP8_SHARD, _set_byte(name, byte, (2, 7)))
    _refused(tmp_path, src, capsys, name, "1 of", "values are NaN or infinite (first at [2, 7]: nan)")


@pytest.mark.parametrize("value,shown", [(float("nan"), "nan"), (float("inf"), "inf"), (-0.5, "-0.5"), (2.0**125, str(2.0**125))])
def test_fp8_bad_block_scale_is_refused(tmp_path, capsys, value, shown):
    src = _copy(DATA / "tiny-llama-fp8", tmp_path)
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"
    _edit_source(src / FP8_SHARD, _set(name, value))
    err = _refused(tmp_path, src, capsys, name, f"first at [0, 0]: {shown}")
    assert "scales are NaN, infinite, negative or above" in err


def test_fp8_zero_block_scale_is_accepted(tmp_path):
    """A zero multiplier is an all-zero block: valid, exact zeros, repacked bit-exactly."""
    src = _copy(DATA / "tiny-llama-fp8", tmp_path)
    _edit_source(src / FP8_SHARD, _set("model.layers.1.mlp.down_proj.weight_scale_inv", 0.0))
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst), "--no-progress"]) == 0
    report = verify(dst, against=src)
    assert report.ok and all(c.mode == "bit-exact" for c in report.checks), report.summary()


# ---------------------------------------------------------------- source: compressed-tensors NVFP4
def test_ct_global_scale_of_two_elements_is_refused(tmp_path, ct_nvfp4, capsys):
    src = _copy(ct_nvfp4, tmp_path)
    name = "model.layers.0.mlp.up_proj.weight_global_scale"

    def two(tensors):
        tensors[name] = tensors[name].reshape(1).repeat(2)
    _edit_source(src / "model.safetensors", two)
    _refused(tmp_path, src, capsys, name, "exactly one per-tensor global scale", "shape [2] (2 elements)")


@pytest.mark.parametrize("value,says", [(0.0, "divides every weight"), (float("nan"), "NaN or infinite"),
                                        (-448.0, "negative"), (2.0**-125, "too small")])
def test_ct_bad_global_scale_is_refused(tmp_path, ct_nvfp4, capsys, value, says):
    src = _copy(ct_nvfp4, tmp_path)
    name = "model.layers.1.mlp.down_proj.weight_global_scale"
    _edit_source(src / "model.safetensors", _set(name, value, 0))
    _refused(tmp_path, src, capsys, name, f"global scale is {value}", says)


def test_ct_block_scales_of_another_group_size_are_refused(tmp_path, ct_nvfp4, capsys):
    """Wrong but self-consistent: [N, K/32] block scales (were repacked and exited 0)."""
    src = _copy(ct_nvfp4, tmp_path)
    name = "model.layers.0.mlp.gate_proj.weight_scale"

    def halve(tensors):
        tensors[name] = tensors[name][:, ::2].contiguous()
    _edit_source(src / "model.safetensors", halve)
    _refused(tmp_path, src, capsys, name, "expected float8_e4m3fn [384, 8]", "found torch.float8_e4m3fn [384, 4]")


@pytest.mark.parametrize("byte,shown", [(0x7F, "nan"), (0xB8, "-1.0")])
def test_ct_nan_or_negative_block_scale_is_refused(tmp_path, ct_nvfp4, capsys, byte, shown):
    src = _copy(ct_nvfp4, tmp_path)
    name = "model.layers.1.mlp.gate_proj.weight_scale"
    _edit_source(src / "model.safetensors", _set_byte(name, byte, (5, 1)))
    _refused(tmp_path, src, capsys, name, f"1 of 3072 scales are NaN or negative (first at [5, 1]: {shown})")


def test_ct_zero_block_scale_is_accepted_as_zeros(tmp_path, ct_nvfp4):
    src = _copy(ct_nvfp4, tmp_path)
    name = "model.layers.1.mlp.gate_proj.weight_scale"

    def zero(tensors):
        tensors[name][7, 3] = 0.0
        tensors["model.layers.1.mlp.gate_proj.weight_packed"][7, 24:32] = 0x11  # codes of 0.5: still zeros
    _edit_source(src / "model.safetensors", zero)
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst), "--no-progress", "--format", "nvfp4"]) == 0
    assert verify(dst, against=src).ok
    # and re-quantized: the block dequantizes to exact zeros
    dst_bf16 = tmp_path / "bf16"
    assert main(["convert", str(src), str(dst_bf16), "--no-progress", "--format", "bf16"]) == 0
    report = verify(dst_bf16, against=src)
    assert report.ok, report.summary()
    gu = sio.load_file(dst_bf16 / "model.safetensors", [f"model.layers.1.mlp.{GU}.weight"])[f"model.layers.1.mlp.{GU}.weight"]
    assert torch.all(gu[7, 48:64] == 0)  # gate row 7 sits at packed row 7 (g = 128)


# ---------------------------------------------------------------- source: ModelOpt NVFP4
def test_modelopt_weight_scale_2_of_two_elements_is_refused(tmp_path, modelopt_nvfp4, capsys):
    src = _copy(modelopt_nvfp4, tmp_path)
    name = "model.layers.1.mlp.gate_proj.weight_scale_2"
    f = next(p for p in src.glob("*.safetensors") if name in sio.read_header(p).entries)

    def two(tensors):
        tensors[name] = tensors[name].reshape(1).repeat(2)
    _edit_source(f, two)
    _refused(tmp_path, src, capsys, name, "shape [2] (2 elements)", args=["--format", "nvfp4"])


def test_modelopt_zero_weight_scale_2_is_refused(tmp_path, modelopt_nvfp4, capsys):
    src = _copy(modelopt_nvfp4, tmp_path)
    name = "model.layers.0.mlp.down_proj.weight_scale_2"
    f = next(p for p in src.glob("*.safetensors") if name in sio.read_header(p).entries)
    _edit_source(f, _set(name, 0.0))
    _refused(tmp_path, src, capsys, name, "multiplies every weight of the projection to 0")


# ---------------------------------------------------------------- verify: values in the packed output
def test_verify_catches_a_zero_nvfp4_global_scale(tmp_path, tiny_llama, capsys):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, weight_format="nvfp4", progress=False)
    assert verify(dst).ok
    name = f"model.layers.0.mlp.{GU}.weight_global_scale"
    _edit_packed(dst / "model.safetensors", _set(name, 0.0, 1))
    _verify_fails(dst, capsys, f"{dst / 'model.safetensors'} / {name} / values: global scale (up) is 0.0")


@pytest.mark.parametrize("fmt,suffix,change", [
    ("bf16", "weight", lambda name: _set(name, float("nan"), (4, 9))),
    ("bf16", "weight", lambda name: _set(name, float("-inf"), (4, 9))),
    ("fp8_block128", "weight", lambda name: _set_byte(name, 0xFF, (4, 9))),
])
def test_verify_catches_non_finite_packed_weights(tmp_path, tiny_llama, capsys, fmt, suffix, change):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, weight_format=fmt, progress=False)
    name = f"model.layers.1.mlp.{DN}.{suffix}"
    _edit_packed(dst / "model.safetensors", change(name))
    _verify_fails(dst, capsys, name, "1 of 49152 values are NaN or infinite (first at [4, 9]")


def test_verify_reads_values_of_every_shard(tmp_path, capsys):
    src, dst = tmp_path / "src", tmp_path / "packed"
    make_causal_lm(src, max_shard_size="100KB")
    convert(src, dst, weight_format="fp8_block128", progress=False)
    index = json.loads((dst / formats.INDEX_FILE).read_text())["weight_map"]
    name = f"model.layers.1.mlp.{GU}.weight_scale_inv"
    _edit_packed(dst / index[name], _set(name, -1.0))
    _verify_fails(dst, capsys, f"{dst / index[name]} / {name} / values", "first at [0, 0]: -1.0")


# ---------------------------------------------------------------- verify: index and modules
@pytest.fixture
def sharded(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "packed"
    make_causal_lm(src, max_shard_size="100KB")
    convert(src, dst, weight_format="bf16", progress=False)
    assert verify(dst).ok
    return dst


def _edit_index(dst: Path, change) -> Path:
    index = dst / formats.INDEX_FILE
    body = json.loads(index.read_text())
    change(body["weight_map"])
    index.write_text(json.dumps(body))
    return index


def test_verify_catches_an_index_entry_no_file_holds(sharded, capsys):
    first = json.loads((sharded / formats.INDEX_FILE).read_text())["weight_map"]["lm_head.weight"]
    index = _edit_index(sharded, lambda m: m.update({"model.layers.0.mlp.extra.weight": first}))
    _verify_fails(sharded, capsys, f"{index} / model.layers.0.mlp.extra.weight / weight_map: listed in {first}, "
                                   "but no file holds this tensor")


def test_verify_catches_a_stored_tensor_the_index_omits(sharded, capsys):
    name = f"model.layers.1.mlp.{DN}.weight"
    index = _edit_index(sharded, lambda m: m.pop(name))
    _verify_fails(sharded, capsys, f"{index} / {name} / weight_map: stored in", "but not listed")


def test_verify_catches_an_index_naming_the_wrong_shard(sharded, capsys):
    name = f"model.layers.0.mlp.{GU}.weight"
    weight_map = json.loads((sharded / formats.INDEX_FILE).read_text())["weight_map"]
    other = next(f for f in sorted(set(weight_map.values())) if f != weight_map[name])
    _edit_index(sharded, lambda m: m.update({name: other}))
    _verify_fails(sharded, capsys, f"{name} / weight_map: listed in {other} but stored in {weight_map[name]}")


def test_a_safetensors_file_the_index_does_not_name_is_left_alone(tmp_path, capsys):
    """Mistral repos ship consolidated.safetensors beside the sharded index: loaders ignore it, so do
    convert (it is a side file) and verify."""
    src, dst = tmp_path / "src", tmp_path / "packed"
    model = make_causal_lm(src, family="mistral", max_shard_size="100KB")
    assert (src / formats.INDEX_FILE).is_file()
    save_file({f"layers.{i}.feed_forward.w1.weight": layer.mlp.gate_proj.weight.detach().contiguous()
               for i, layer in enumerate(model.model.layers)}, str(src / "consolidated.safetensors"),
              metadata={"format": "pt"})
    assert main(["convert", str(src), str(dst), "--no-progress", "--format", "bf16"]) == 0
    assert verify(dst).ok
    shutil.copyfile(src / "consolidated.safetensors", dst / "consolidated.safetensors")
    report = verify(dst)
    assert report.ok, report.summary()


def test_verify_catches_a_stale_single_file_beside_the_index(tmp_path, capsys):
    """transformers loads model.safetensors when it exists, whatever the index says: a stale one
    beside a sharded packed checkpoint would be what runs."""
    src, dst = tmp_path / "src", tmp_path / "packed"
    make_causal_lm(src, max_shard_size="100KB")
    convert(src, dst, weight_format="bf16", progress=False)
    shard = sorted(dst.glob("model-*.safetensors"))[0]
    shutil.copyfile(shard, dst / formats.SINGLE_FILE)
    _verify_fails(dst, capsys, formats.SINGLE_FILE, "transformers loads this file instead of the index")


def _edit_modules(dst: Path, change) -> None:
    config = json.loads((dst / formats.CONFIG_FILE).read_text())
    change(config["quantization_config"][formats.K_MODULES])
    (dst / formats.CONFIG_FILE).write_text(json.dumps(config))


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_verify_catches_a_module_dropped_from_modules(tmp_path, tiny_llama, capsys, fmt):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, weight_format=fmt, progress=False)
    _edit_modules(dst, lambda modules: modules.remove("model.layers.1.mlp"))
    _verify_fails(dst, capsys, f"model.layers.1.mlp.{GU}.", "packed MLP 'model.layers.1.mlp' is not listed in "
                                                           "quantization_config.modules")


def test_inspect_of_a_listed_module_without_tensors_is_a_clear_error(tmp_path, tiny_llama, capsys):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, progress=False)
    _edit_modules(dst, lambda modules: modules.append("model.layers.9.mlp"))
    assert main(["inspect", str(dst)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"model.layers.9.mlp.{GU}.weight: missing" in err and "swiglu-fused verify" in err
    with pytest.raises(formats.FormatError, match="not a valid packed checkpoint"):
        inspect(dst)
    _verify_fails(dst, capsys, f"model.layers.9.mlp.{GU}.weight: missing")


@pytest.mark.parametrize("change,field", [
    (lambda q: q.update({formats.K_MODULES: "model.layers.0.mlp"}), "modules: must be a list of module names"),
    (lambda q: q.update({formats.K_INTERLEAVE: True}), "interleave: must be a positive integer, found True"),
])
def test_malformed_quantization_config_fields_are_violations(tmp_path, tiny_llama, capsys, change, field):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, progress=False)
    config = json.loads((dst / formats.CONFIG_FILE).read_text())
    change(config["quantization_config"])
    (dst / formats.CONFIG_FILE).write_text(json.dumps(config))
    capsys.readouterr()
    _verify_fails(dst, capsys, field)
    assert main(["inspect", str(dst)]) == 2 and field in capsys.readouterr().err


@pytest.mark.parametrize("text", ["[1, 2]", "\"fp8\""])
def test_file_metadata_that_is_not_an_object_is_a_violation(tmp_path, tiny_llama, capsys, text):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, progress=False)
    f = dst / "model.safetensors"
    tensors = sio.load_file(f)
    sio.write_file(tensors, tmp_path / "edited", {"format": "pt", formats.METADATA_KEY: text})
    (tmp_path / "edited").replace(f)
    _verify_fails(dst, capsys, f"{f} / __metadata__.{formats.METADATA_KEY}: expected a JSON object")


# ---------------------------------------------------------------- verify --against: numerics
@pytest.mark.parametrize("fmt", ["fp8_block128", "nvfp4"])
@pytest.mark.parametrize("scale", [1e30, 1e-30])
def test_verify_against_is_right_for_huge_and_tiny_weights(tmp_path, fmt, scale):
    """fp32 squares of 1e30 overflow (relative error nan: a false FAIL) and of 1e-30 underflow."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_causal_lm(src)

    def rescale(tensors):
        for k in tensors:
            if ".mlp." in k:
                tensors[k] = (tensors[k].float() * scale).to(torch.bfloat16)
    _edit_source(src / "model.safetensors", rescale)
    convert(src, dst, weight_format=fmt, progress=False)
    report = verify(dst, against=src)
    assert report.ok, report.summary()
    errors = [c.error for c in report.checks]
    assert all(0.001 < e <= formats.ROUNDTRIP_BOUND[fmt] for e in errors), errors
    # the same relative errors as the unscaled model's, to rounding
    plain_src, plain_dst = tmp_path / "plain", tmp_path / "plain_dst"
    make_causal_lm(plain_src)
    convert(plain_src, plain_dst, weight_format=fmt, progress=False)
    plain = [c.error for c in verify(plain_dst, against=plain_src).checks]
    assert errors == pytest.approx(plain, rel=0.05)


def test_verify_against_says_nan_rather_than_a_nan_error(tmp_path, tiny_llama):
    src, _ = tiny_llama
    dst = tmp_path / "dst"
    convert(src, dst, weight_format="fp8_block128", progress=False)
    down = sio.load_file(dst / "model.safetensors", [f"model.layers.0.mlp.{DN}.weight",
                                                    f"model.layers.0.mlp.{DN}.weight_scale_inv"])
    tensors = {k.rsplit(".", 1)[1]: v.clone() for k, v in down.items()}
    source = pack.read_projection(load_file(str(src / "model.safetensors")).get, "model.layers.0.mlp.down_proj")
    assert _compare("m", "down", pack.Projection("fp8_block128", tensors, "down"), source, "fp8_block128").ok
    tensors["weight"].view(torch.uint8)[1, 2] = 0x7F
    check = _compare("m", "down", pack.Projection("fp8_block128", tensors, "down"), source, "fp8_block128")
    assert not check.ok and check.mode == "non-finite"
    assert check.problem() == "the packed weight dequantizes to 1 NaN and 0 infinite values (of 49152)"
