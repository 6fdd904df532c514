"""What a user meets when a path, an output directory or an argument is wrong: a message that names
it (CLI exit status 2, no traceback), and nothing left behind."""

import errno

import pytest
import torch

from swiglu_fused.cli import main
from swiglu_fused.demo import run_demo
from swiglu_fused.formats import FormatError
from swiglu_fused.integrations.transformers import patch_model
from swiglu_fused.weight_packing import convert as convert_mod
from swiglu_fused.weight_packing import safetensors_io as sio
from swiglu_fused.weight_packing.convert import convert
from swiglu_fused.weight_packing.verify import verify

from conftest import make_causal_lm


def _names(path):
    return sorted(p.name for p in path.iterdir())


def test_missing_source_directory_is_named(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "nope: no such directory" in err and "Traceback" not in err
    assert _names(tmp_path) == []


def test_diffusers_pipeline_root_points_at_its_transformer_folder(tmp_path):
    (tmp_path / "pipe" / "transformer").mkdir(parents=True)
    (tmp_path / "pipe" / "model_index.json").write_text("{}")
    with pytest.raises(FormatError, match="pass its .*transformer folder"):
        convert(tmp_path / "pipe", tmp_path / "out", progress=False)


def test_unwritable_output_names_dst_and_leaves_nothing(tmp_path, tiny_llama, monkeypatch, capsys):
    """A full disk (or no permission) while writing: the error names DST, not the hidden partial
    directory, and the partial directory and the parents made for it are gone."""
    src, _ = tiny_llama

    def full_disk(tensors, path, metadata=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(sio, "write_file", full_disk)
    dst = tmp_path / "new" / "deeper" / "out"
    assert main(["convert", str(src), str(dst), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {dst}: No space left on device" in err and ".partial" not in err
    assert _names(tmp_path) == ["llama"]  # new/deeper removed with the partial output
    with pytest.raises(convert_mod.OutputError):
        convert(src, dst, progress=False)


def test_source_read_errors_are_not_blamed_on_the_output(tmp_path, tiny_llama, monkeypatch):
    src, _ = tiny_llama

    def unreadable(path, names=None):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(sio, "load_file", unreadable)
    with pytest.raises(PermissionError, match="model.safetensors") as e:
        convert(src, tmp_path / "out", progress=False)
    assert not isinstance(e.value, convert_mod.OutputError)


def test_force_refuses_to_replace_a_file_and_leaves_no_leftovers(tmp_path, tiny_llama):
    """--force replaces only a previous packed output or an empty directory (issue 19 item 1)."""
    src, _ = tiny_llama
    (tmp_path / "out").write_text("an old file")
    with pytest.raises(FileExistsError, match="out is a file, not a directory; force=True replaces only"):
        convert(src, tmp_path / "out", force=True, progress=False)
    assert (tmp_path / "out").read_text() == "an old file"
    assert _names(tmp_path) == ["llama", "out"]
    report = convert(src, tmp_path / "new", progress=False)
    assert str(report) == report.summary() and str(report).startswith(f"wrote {tmp_path / 'new'}")


def test_output_inside_the_source_is_refused(tmp_path, tiny_llama):
    src, _ = tiny_llama
    with pytest.raises(FormatError, match="inside the source directory"):
        convert(src, src / "packed", progress=False)
    assert not (src / "packed").exists()


def test_verify_missing_directory_exits_2(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "nope")]) == 2
    assert "nope: no such directory" in capsys.readouterr().err


def test_verify_against_a_model_of_other_shapes_reports_a_mismatch(tmp_path, tiny_llama, capsys):
    src, _ = tiny_llama
    other = tmp_path / "other"
    make_causal_lm(other, inter=256)
    convert(src, tmp_path / "packed", progress=False)
    assert main(["verify", str(tmp_path / "packed"), "--against", str(other)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH model.layers.0.mlp gate: shape differs: packed [384, 128], source [256, 128]" in out


def test_verify_mismatch_says_what_failed(tmp_path, tiny_llama):
    src, _ = tiny_llama
    other = tmp_path / "other"
    make_causal_lm(other, seed=1)  # same shapes, other weights
    convert(src, tmp_path / "packed", progress=False)
    report = verify(tmp_path / "packed", against=other)
    assert not report.ok and str(report) == report.summary()
    assert "exceeds the format's bound" in report.summary() and "within bound" not in report.summary()


@pytest.mark.parametrize("fmt,name", [("fp8_block128", "gate_up_interleaved.weight_scale_inv"),
                                      ("nvfp4", "down_proj.weight_global_scale")])
def test_verify_catches_a_nan_scale(tmp_path, tiny_llama, fmt, name):
    src, _ = tiny_llama
    dst = tmp_path / "packed"
    convert(src, dst, weight_format=fmt, progress=False)
    assert verify(dst).ok
    f = dst / "model.safetensors"
    tensors = sio.load_file(f)
    key = f"model.layers.1.mlp.{name}"
    tensors[key] = tensors[key].clone().reshape(-1).index_fill(0, torch.tensor([0]), float("nan")).view_as(tensors[key])
    sio.write_file(tensors, tmp_path / "edited.safetensors", sio.read_header(f).metadata)
    (tmp_path / "edited.safetensors").replace(f)  # not over the file its tensors are mapped from
    report = verify(dst)
    assert not report.ok
    assert any(v.tensor == key and "NaN" in v.message for v in report.violations), report.summary()


@pytest.mark.parametrize("g", [0, -128, 64, 100])
def test_patch_model_refuses_an_interleave_no_mlp_could_use(tiny_llama, g):
    _, model = tiny_llama
    with pytest.raises(FormatError, match=f"interleave: {g} is not a positive multiple of 128"):
        patch_model(model, weight_format="fp8_block128", interleave=g)


def test_demo_compares_against_the_model_of_its_own_seed():
    """The non-MLP weights of the model under test come from the same seed as the reference's."""
    rows = run_demo(("bf16",), seed=3, echo=lambda *a: None)
    assert rows[0].logits_rel < 0.05 and rows[0].top1_agree > 0.9
