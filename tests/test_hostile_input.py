"""Hostile or broken source checkpoints (issue 19 items 5 and 6): every one gets a one-line error
naming the file and the field (CLI exit status 2, no traceback), SRC stays byte-identical and no
DST or partial directory is left; only the checkpoint itself and its known side files are copied."""

import hashlib
import json
import os
import shutil
import struct

import pytest
import torch

from swiglu_fused import formats
from swiglu_fused.cli import main
from swiglu_fused.formats import FormatError
from swiglu_fused.weight_packing import safetensors_io as sio
from swiglu_fused.weight_packing.convert import convert
from swiglu_fused.weight_packing.source import side_files

from conftest import DATA, make_causal_lm


# ---------------------------------------------------------------- helpers
def _snapshot(root):
    """Every entry under root: file contents hashed, links by target (never followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isfile(p):
                out[rel] = ("file", hashlib.sha256(open(p, "rb").read()).hexdigest())
            else:
                out[rel] = ("other", os.stat(p).st_mode & 0o170000)
    return out


def _refused(capsys, src, tmp_path, *expected, fmt="bf16", extra=()):
    """Run `swiglu-fused convert SRC DST`; it must fail with one line naming everything in expected."""
    before = _snapshot(src)
    dst = tmp_path / "dst"
    capsys.readouterr()
    rc = main(["convert", str(src), str(dst), "--format", fmt, "--no-progress", *extra])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("swiglu-fused convert: error: "), err
    for part in expected:
        assert part in err, (part, err)
    assert _snapshot(src) == before
    assert not dst.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".dst")]
    return err


def _header(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_raw(path, header_text: bytes, data: bytes):
    header_text += b" " * (-len(header_text) % 8)
    path.write_bytes(struct.pack("<Q", len(header_text)) + header_text + data)


def _edit_header(path, edit, data_edit=lambda d: d):
    header, data = _header(path)
    edit(header)
    _write_raw(path, json.dumps(header).encode(), data_edit(data))


def _by_offset(header):
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "src"
    make_causal_lm(path)
    return path


# ---------------------------------------------------------------- item 6: safetensors headers
def test_overlapping_tensors_are_refused_naming_both(src, tmp_path, capsys):
    f = src / "model.safetensors"
    header, _ = _header(f)
    first, second = _by_offset(header)[:2]

    def overlap(h):  # the second tensor claims the first one's bytes (same size: both are views of one)
        h[second]["data_offsets"] = list(h[first]["data_offsets"])
        h[second]["dtype"], h[second]["shape"] = h[first]["dtype"], h[first]["shape"]
    _edit_header(f, overlap)
    # the bytes the second tensor used to own now belong to nobody: the overlap is reported first
    err = _refused(capsys, src, tmp_path, str(f), "overlaps tensor", repr(first), repr(second))
    assert "corrupt header" in err


def test_gap_between_tensors_is_refused_naming_where(src, tmp_path, capsys):
    f = src / "model.safetensors"
    header, data = _header(f)
    names = _by_offset(header)
    cut = header[names[3]]["data_offsets"][0]

    def gap(h):  # 16 unused bytes before names[3]; every later tensor moves up by 16
        for n in names[3:]:
            h[n]["data_offsets"] = [o + 16 for o in h[n]["data_offsets"]]
    _edit_header(f, gap, lambda d: d[:cut] + b"\0" * 16 + d[cut:])
    _refused(capsys, src, tmp_path, str(f), f"bytes [{cut}, {cut + 16})", "belong to no tensor",
             f"after tensor {names[2]!r}", f"before tensor {names[3]!r}")


def test_trailing_bytes_are_refused(src, tmp_path, capsys):
    f = src / "model.safetensors"
    f.write_bytes(f.read_bytes() + b"\0" * 24)
    _refused(capsys, src, tmp_path, str(f), "24 trailing bytes after the last tensor")


@pytest.mark.parametrize("metadata, found", [({"format": 1}, "the value of 'format'"), ("pt", "str"),
                                             (["format", "pt"], "list")])
def test_metadata_must_map_strings_to_strings(src, tmp_path, capsys, metadata, found):
    f = src / "model.safetensors"
    _edit_header(f, lambda h: h.update(__metadata__=metadata))
    _refused(capsys, src, tmp_path, str(f), "__metadata__ must map strings to strings", found)


def test_a_tensor_defined_twice_is_refused(src, tmp_path, capsys):
    """json.loads (and the safetensors library) would keep the second definition silently."""
    f = src / "model.safetensors"
    header, data = _header(f)
    name = "model.layers.0.mlp.up_proj.weight"
    text = json.dumps(header)
    entry = json.dumps({name: header[name]})[1:-1]
    _write_raw(f, (text[:-1] + ", " + entry + "}").encode(), data)
    _refused(capsys, src, tmp_path, str(f), f"key {name!r} appears twice")


@pytest.mark.parametrize("field, value, message", [
    ("shape", [True, 128], "invalid shape [True, 128]"),
    ("shape", [384.0, 128], "invalid shape [384.0, 128]"),
    ("data_offsets", [False, 98304], "invalid data_offsets [False, 98304]"),
    ("dtype", ["BF16"], "unsupported dtype ['BF16']"),
])
def test_json_types_of_an_entry_are_checked(src, tmp_path, capsys, field, value, message):
    f = src / "model.safetensors"
    name = "model.layers.0.mlp.gate_proj.weight"
    _edit_header(f, lambda h: h[name].update({field: value}))
    _refused(capsys, src, tmp_path, str(f), f"tensor {name!r}", message)


def test_an_empty_tensor_with_an_overflowing_shape_is_refused(src, tmp_path, capsys):
    f = src / "model.safetensors"

    def add(h):  # zero bytes, so the byte count matches, but torch cannot build this shape
        h["extra.empty"] = {"dtype": "BF16", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}
    _edit_header(f, add)
    _refused(capsys, src, tmp_path, str(f), "'extra.empty'", "too large to address")


def test_header_json_nested_too_deeply_is_refused(src, tmp_path, capsys):
    f = src / "model.safetensors"
    _, data = _header(f)
    _write_raw(f, b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", data)
    _refused(capsys, src, tmp_path, str(f), "nested too deeply")


def test_a_lone_surrogate_in_a_tensor_name_is_refused(src, tmp_path, capsys):
    """JSON (and Python's json) allow an escaped lone surrogate; the safetensors library does not."""
    f = src / "model.safetensors"
    header, data = _header(f)
    text = json.dumps(header).replace('"lm_head.weight"', '"lm_head.weight\\udc80"')
    _write_raw(f, text.encode(), data)
    _refused(capsys, src, tmp_path, str(f), "'lm_head.weight\\udc80' holds a lone UTF-16 surrogate")


def test_load_file_names_the_file_when_the_library_refuses(src, monkeypatch):
    """Whatever the safetensors library raises past our header checks reaches the user as a
    CheckpointError naming the file (here: the library refusing a file that changed meanwhile)."""
    from safetensors import SafetensorError

    class Changed:
        def __init__(self, path, framework):
            raise SafetensorError("Error while deserializing header: incomplete metadata, file not fully covered")

    monkeypatch.setattr(sio, "safe_open", Changed)
    f = src / "model.safetensors"
    with pytest.raises(sio.CheckpointError, match=f"{f}: the safetensors library cannot read it: Error while"):
        sio.load_file(f)
    with pytest.raises(sio.CheckpointError, match=f"{f}: no tensor 'nope' in this file"):
        sio.load_file(f, ["nope"])


# ---------------------------------------------------------------- item 6: index, config, quantization
@pytest.fixture
def sharded(tmp_path):
    path = tmp_path / "src"
    make_causal_lm(path, max_shard_size="100KB")
    return path


def _edit_index(src, edit):
    index = src / formats.INDEX_FILE
    body = json.loads(index.read_text())
    edit(body)
    index.write_text(json.dumps(body))
    return index


def test_index_weight_map_that_is_a_list_is_refused(sharded, tmp_path, capsys):
    index = _edit_index(sharded, lambda b: b.update(weight_map=sorted(b["weight_map"].items())))
    _refused(capsys, sharded, tmp_path, str(index), "weight_map must be a JSON object", "found list")


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/outside.safetensors", "sub/x.safetensors",
                                   "config.json", 7])
def test_index_entries_must_name_shards_inside_src(sharded, tmp_path, capsys, shard):
    (tmp_path / "outside.safetensors").write_bytes(sorted(sharded.glob("model-*.safetensors"))[0].read_bytes())
    name = "model.layers.1.mlp.down_proj.weight"
    index = _edit_index(sharded, lambda b: b["weight_map"].update({name: shard}))
    _refused(capsys, sharded, tmp_path, str(index), f"weight_map[{name!r}]", repr(shard))


def test_a_shard_linked_from_outside_src_is_refused(sharded, tmp_path, capsys):
    shard = sorted(sharded.glob("model-*.safetensors"))[1]
    elsewhere = tmp_path / "elsewhere" / shard.name
    elsewhere.parent.mkdir()
    shutil.move(shard, elsewhere)
    shard.symlink_to(elsewhere)
    _refused(capsys, sharded, tmp_path, str(shard), "a symbolic link to", "outside the checkpoint directory")


def test_hub_cache_snapshot_whose_files_link_into_its_blobs_converts(tmp_path):
    """A Hugging Face cache snapshot is all links to ../../blobs: those are followed."""
    repo = tmp_path / "hub" / "models--org--tiny"
    made, snapshot = tmp_path / "made", repo / "snapshots" / "0123abcd"
    make_causal_lm(made, max_shard_size="100KB")
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in sorted(made.iterdir()):
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    report = convert(snapshot, tmp_path / "dst", weight_format="bf16", progress=False)
    assert len(report.modules) == 2 and report.left_out == []
    assert (tmp_path / "dst" / "tokenizer.json").read_bytes() == (made / "tokenizer.json").read_bytes()
    assert not (tmp_path / "dst" / "tokenizer.json").is_symlink()


@pytest.mark.parametrize("config, found", [([{"architectures": ["LlamaForCausalLM"]}], "found list"),
                                           (None, "found null"), ("llama", "found str")])
def test_config_json_that_is_not_an_object_is_refused(src, tmp_path, capsys, config, found):
    (src / "config.json").write_text(json.dumps(config))
    _refused(capsys, src, tmp_path, str(src / "config.json"), "expected a JSON object", found)


@pytest.mark.parametrize("field, value, message", [
    ("quantization_config", "fp8", "quantization_config must be a JSON object"),
    ("quantization_config", ["fp8"], "quantization_config must be a JSON object"),
    ("architectures", "LlamaForCausalLM", "architectures must be a list of class names"),
    ("model_type", ["llama"], "model_type must be a string"),
    ("hidden_act", ["silu"], "hidden_act = ['silu'] is not supported"),
])
def test_config_fields_of_the_wrong_json_type_are_refused(src, tmp_path, capsys, field, value, message):
    config = json.loads((src / "config.json").read_text())
    config[field] = value
    (src / "config.json").write_text(json.dumps(config))
    _refused(capsys, src, tmp_path, "config.json", message)


@pytest.mark.parametrize("field, value, message", [
    ("weight_block_size", 128, "weight_block_size is 128"),
    ("weight_block_size", None, "weight_block_size is None"),
])
def test_fp8_quantization_config_fields_of_the_wrong_type_are_refused(tmp_path, capsys, field, value, message):
    src = tmp_path / "src"
    shutil.copytree(DATA / "tiny-llama-fp8", src)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"][field] = value
    (src / "config.json").write_text(json.dumps(config))
    _refused(capsys, src, tmp_path, str(src / "config.json"), f"quantization_config.{message}",
             fmt="fp8_block128")


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"quantization": "NVFP4"}', "quantization = str 'NVFP4'"),
    ("[]", "found list"),
    ('{"quantization": {"quant_algo": "W4A8_AWQ"}}', "quantization.quant_algo is 'W4A8_AWQ'"),
])
def test_invalid_hf_quant_config_is_refused_naming_it(src, tmp_path, capsys, text, message):
    (src / "hf_quant_config.json").write_text(text)
    _refused(capsys, src, tmp_path, str(src / "hf_quant_config.json"), message)


def test_compressed_tensors_config_groups_of_the_wrong_type_are_refused(src, tmp_path, capsys):
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {"group_0": "nvfp4"}}
    (src / "config.json").write_text(json.dumps(config))
    _refused(capsys, src, tmp_path, "quantization_config.config_groups must be an object of group objects")


# ---------------------------------------------------------------- items 6 and 8: interleave
def test_nvfp4_with_odd_intermediate_size_suggests_no_interleave(tmp_path, capsys):
    """The tool used to suggest --interleave 33/11/3, each of which then failed for nvfp4."""
    src = tmp_path / "src"
    make_causal_lm(src, inter=66 // 2)
    for g in ("128", "33", "11"):
        err = _refused(capsys, src, tmp_path, "no interleave works for format nvfp4", "I = 33 is odd",
                       fmt="nvfp4", extra=["--interleave", g])
        assert "use --interleave" not in err
    assert formats.suggest_interleaves(33, formats.weight_format("nvfp4")) == []


def test_every_suggested_interleave_converts(tmp_path, capsys):
    src = tmp_path / "src"
    make_causal_lm(src, inter=40)
    err = _refused(capsys, src, tmp_path, "I = 40 is not a multiple of --interleave 128; use --interleave 40 or --interleave 20 or --interleave 10",
                   fmt="nvfp4")
    assert err
    for g in formats.suggest_interleaves(40, formats.weight_format("nvfp4")):
        assert main(["convert", str(src), str(tmp_path / f"g{g}"), "--format", "nvfp4", "--interleave", str(g),
                     "--no-progress"]) == 0
    for fmt in formats.WEIGHT_FORMATS.values():  # the promise, over many sizes
        for inter in range(1, 300):
            for g in formats.suggest_interleaves(inter, fmt):
                formats.check_interleave(inter, g, fmt)


@pytest.mark.parametrize("g", [True, 128.0, "128", None])
def test_interleave_that_is_not_an_int_is_refused_by_type(g):
    """bool is an int to Python: interleave=True must not pass as g = 1 (nor be written as true)."""
    for fmt in formats.WEIGHT_FORMATS.values():
        with pytest.raises(FormatError, match=f"interleave must be a positive integer .* got {type(g).__name__}"):
            formats.check_interleave(384, g, fmt, "model.layers.0.mlp")


# ---------------------------------------------------------------- item 5: only the checkpoint is copied
def _nan_copy_of_shards(src, dest):
    """A stale single-file checkpoint beside the index: every floating tensor NaN."""
    tensors = {}
    for f in sio.checkpoint_files(src):
        for name, t in sio.load_file(f).items():
            tensors[name] = torch.full_like(t, float("nan")) if t.is_floating_point() else t
    sio.write_file(tensors, dest, {"format": "pt"})


def test_stale_model_safetensors_beside_an_index_is_left_out(tmp_path, capsys):
    """transformers prefers model.safetensors to an index: copied into DST, the stale file would be
    what loads (NaN logits) while verify, which reads the index, says OK."""
    from transformers import AutoModelForCausalLM

    import swiglu_fused  # noqa: F401  (registers the packed format with transformers)

    src, dst = tmp_path / "src", tmp_path / "dst"
    make_causal_lm(src, max_shard_size="100KB")
    _nan_copy_of_shards(src, src / "model.safetensors")
    shutil.copyfile(src / "model.safetensors", src / "consolidated.safetensors")
    before = _snapshot(src)
    assert main(["convert", str(src), str(dst), "--format", "bf16", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert ("left out 2 files of the source: consolidated.safetensors (a weight file not named by the index "
            "model.safetensors.index.json), model.safetensors (a weight file not named by the index") in out
    assert _snapshot(src) == before
    assert not (dst / "model.safetensors").exists() and not (dst / "consolidated.safetensors").exists()
    assert (dst / "tokenizer.json").exists() and (dst / formats.INDEX_FILE).exists()

    tokens = torch.arange(1, 17).reshape(2, 8)
    (src / "model.safetensors").unlink()  # the source as its index describes it
    (src / "consolidated.safetensors").unlink()
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)(tokens).logits
        got = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.bfloat16)(tokens).logits
    assert torch.isfinite(got).all()
    assert torch.allclose(got.float(), expected.float(), rtol=0.02, atol=0.02)


def test_side_files_are_copied_and_everything_else_is_listed(src, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of the model")
    (src / "tokenizer_config.json").write_text("{}")
    (src / "chat_template.jinja").write_text("{{ messages }}")
    (src / "README.md").write_text("# tiny")
    (src / "special_tokens_map.json").symlink_to("tokenizer_config.json")  # inside SRC: copied as a file
    (src / "vocab.txt").symlink_to(secret)  # outside SRC: left out
    (src / "merges.txt").symlink_to(tmp_path / "missing.txt")  # broken
    (src / "pytorch_model.bin").write_bytes(b"stale pickled weights")
    (src / "pytorch_model.bin.index.json").write_text("{}")
    (src / "consolidated.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    (src / "original").mkdir()
    (src / "original" / "consolidated.00.pth").write_bytes(b"weights")
    (src / "linked_dir").symlink_to(tmp_path, target_is_directory=True)
    (src / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    os.mkfifo(src / "a_fifo")  # copying it would hang
    before = _snapshot(src)

    report = convert(src, tmp_path / "dst", weight_format="bf16", progress=False)
    dst = tmp_path / "dst"
    assert _snapshot(src) == before
    assert sorted(p.name for p in dst.iterdir()) == [
        "README.md", "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert not (dst / "special_tokens_map.json").is_symlink()
    assert (dst / "special_tokens_map.json").read_text() == "{}"
    reasons = dict(report.left_out)
    assert sorted(reasons) == [".gitattributes", "a_fifo", "consolidated.safetensors", "linked_dir", "merges.txt",
                               "original", "pytorch_model.bin", "pytorch_model.bin.index.json", "vocab.txt"]
    assert reasons["vocab.txt"] == f"a symbolic link to {secret.resolve()}, outside the checkpoint directory"
    assert reasons["merges.txt"].startswith("a broken symbolic link")
    assert reasons["a_fifo"] == "not a regular file"
    assert reasons["linked_dir"] == "a symbolic link to a directory"
    assert "another copy of the weights" in reasons["original"]
    assert reasons["consolidated.safetensors"] == "a weight file; the checkpoint is model.safetensors"
    assert "weight file in another format" in reasons["pytorch_model.bin"]
    assert "left out 9 files of the source: .gitattributes (hidden: its name starts with a dot)" in report.summary()
    assert report.summary().endswith(", and 4 more")


def test_side_files_leaves_the_checkpoint_itself_to_the_converter(sharded):
    index = sharded / formats.INDEX_FILE
    copy, left_out = side_files(sharded, sio.checkpoint_files(sharded), index)
    assert [p.name for p in copy] == ["generation_config.json", "tokenizer.json"]
    assert left_out == []
