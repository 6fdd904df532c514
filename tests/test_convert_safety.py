"""Destination safety of ``convert`` (issue 19 items 1, 2, 3 and 8): the source is never touched,
nothing appears at or vanishes from DST behind the user's back, killed and interrupted runs
leave nothing that the next run does not clean up, and sharded outputs are numbered 1..n of n."""

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swiglu_fused.cli import main
from swiglu_fused.formats import FormatError
from swiglu_fused.weight_packing import convert as convert_mod
from swiglu_fused.weight_packing import destination
from swiglu_fused.weight_packing import safetensors_io as sio
from swiglu_fused.weight_packing.convert import convert
from swiglu_fused.weight_packing.destination import MARKER
from swiglu_fused.weight_packing.verify import verify

from conftest import make_causal_lm

ROOT = Path(__file__).resolve().parents[1]


def _state(path: Path) -> dict:
    """Every entry under ``path`` (itself included): a file's sha256, a link's target, "dir"."""
    out = {}
    for p in [path, *sorted(path.rglob("*"))]:
        key = str(p.relative_to(path.parent))
        if p.is_symlink():
            out[key] = "-> " + os.readlink(p)
        elif p.is_dir():
            out[key] = "dir"
        else:
            out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _hidden(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith("."))


def _cli(capsys, *args) -> tuple[int, str]:
    code = main(["convert", *map(str, args), "--no-progress"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swiglu-fused convert: error: "), err
    return lines[0]


@pytest.fixture
def nested(tmp_path):
    """p/src: a real tiny checkpoint one level down, so that p contains it."""
    src = tmp_path / "p" / "src"
    make_causal_lm(src)
    return src


# ------------------------------------------------------------------ 1. the source is sacred

@pytest.mark.parametrize("spelling", ["p", "p/src/..", "./p/", "p/../p", "."])
def test_dst_containing_the_source_is_refused_even_with_force(tmp_path, nested, capsys, monkeypatch, spelling):
    """The issue's report: ``convert p/src p --force`` deleted the source and exited 0."""
    monkeypatch.chdir(tmp_path)
    before = _state(tmp_path)
    code, err = _cli(capsys, "p/src", spelling, "--force")
    line = _one_error_line(err)
    assert code == 2 and f"dst {Path(spelling)}" in line and "contains the source directory p/src" in line
    assert _state(tmp_path) == before  # SRC byte-identical, nothing added anywhere


@pytest.mark.parametrize("spelling", ["p/src", "p/src/", "./p/src", "p/src/../src", "p/../p/src", "ABSOLUTE", "LINK"])
@pytest.mark.parametrize("force", [False, True])
def test_dst_equal_to_the_source_is_refused_in_any_spelling(tmp_path, nested, capsys, monkeypatch, spelling, force):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to("p/src")
    dst = {"ABSOLUTE": str(nested), "LINK": "link"}.get(spelling, spelling)
    before = _state(tmp_path)
    code, err = _cli(capsys, "p/src", dst, *(["--force"] if force else []))
    line = _one_error_line(err)
    assert code == 2 and f"dst {Path(dst)}" in line and "is the source directory p/src" in line
    if spelling == "LINK":
        assert f"(that is {nested})" in line  # the real path, where the name does not show it
    assert _state(tmp_path) == before


@pytest.mark.parametrize("spelling", ["p/src/packed", "link/packed", "p/src/new/deeper/packed"])
def test_dst_inside_the_source_is_refused(tmp_path, nested, capsys, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to("p/src")  # a path that does not mention src at all
    before = _state(tmp_path)
    code, err = _cli(capsys, "p/src", spelling)
    line = _one_error_line(err)
    assert code == 2 and f"dst {spelling}" in line and "is inside the source directory p/src" in line
    assert _state(tmp_path) == before


def test_a_source_seen_through_a_symlinked_parent_is_still_the_source(tmp_path, nested, capsys):
    """SRC spelled through a link to its parent, DST through the real path: same directory."""
    (tmp_path / "plink").symlink_to(tmp_path / "p")
    before = _state(tmp_path)
    code, err = _cli(capsys, tmp_path / "plink" / "src", nested, "--force")
    assert code == 2 and "is the source directory" in _one_error_line(err)
    code, err = _cli(capsys, tmp_path / "plink" / "src", tmp_path / "p", "--force")
    assert code == 2 and "contains the source directory" in _one_error_line(err)
    assert _state(tmp_path) == before


BIND = """
set -e
mount --bind "$SRC" "$ALIAS"
mount --bind "$PARENT" "$PALIAS"
for dst in "$ALIAS" "$PALIAS" "$ALIAS/packed"; do
  "$PY" -m swiglu_fused.cli convert "$SRC" "$dst" --force --no-progress && echo "exit 0" || echo "exit $?"
done
"""


def test_bind_mounts_of_the_source_are_recognised(tmp_path, nested):
    """Names differ but the directories are the same (device and inode): a bind mount of SRC, of
    its parent, and a directory inside the mounted SRC. Runs in a user+mount namespace."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("unshare -rm (user and mount namespaces) is not available here")
    alias, palias = tmp_path / "alias", tmp_path / "palias"
    alias.mkdir()
    palias.mkdir()
    before = _state(tmp_path)
    env = dict(os.environ, SRC=str(nested), ALIAS=str(alias), PARENT=str(nested.parent), PALIAS=str(palias),
               PY=sys.executable)
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", BIND], env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout.split("\n")[:-1] == ["exit 2"] * 3, proc.stdout + proc.stderr
    errs = proc.stderr.strip().splitlines()
    assert len(errs) == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert "is the source directory" in errs[0]
    assert "contains the source directory" in errs[1]
    assert "is inside the source directory" in errs[2]
    assert _state(tmp_path) == before


# ------------------------------------------------------------------ --force: what it may replace

def test_force_replaces_an_empty_directory_and_says_so(tmp_path, tiny_llama, capsys):
    src, _ = tiny_llama
    dst = tmp_path / "out"
    dst.mkdir()
    code, err = _cli(capsys, src, dst)
    assert code == 2 and f"{dst} already exists; pass --force to replace it" in _one_error_line(err)
    code, err = _cli(capsys, src, dst, "--force")
    assert code == 0 and err.strip() == f"swiglu-fused convert: replaced the empty directory at {dst}"
    assert verify(dst).ok and _hidden(tmp_path) == []


def test_force_replaces_a_previous_packed_output_and_says_so(tmp_path, tiny_llama, capsys, caplog):
    src, _ = tiny_llama
    dst = tmp_path / "out"
    convert(src, dst, weight_format="nvfp4", progress=False)
    old_inode = dst.stat().st_ino
    code, err = _cli(capsys, src, dst, "--format", "bf16", "--force")
    assert code == 0 and err.strip() == f"swiglu-fused convert: replaced the previous packed checkpoint at {dst}"
    assert dst.stat().st_ino != old_inode and json.loads((dst / "config.json").read_text())[
        "quantization_config"]["weight_format"] == "bf16"
    assert verify(dst, against=src).ok and _hidden(tmp_path) == []
    caplog.clear()  # the Python API says it too, as a warning of the swiglu_fused logger
    convert(src, dst, weight_format="bf16", force=True, progress=False)
    assert [r.getMessage() for r in caplog.records] == [f"replaced the previous packed checkpoint at {dst}"]


def test_force_keeps_what_a_user_added_to_a_previous_packed_output(tmp_path, tiny_llama, capsys):
    """A previous packed output that holds anything a conversion does not write (a user's notes, a
    folder) is not replaced: the run says which entries and leaves all of it as it was. Stale shards
    of another conversion are not the user's and go."""
    src, _ = tiny_llama
    dst = tmp_path / "out"
    convert(src, dst, weight_format="nvfp4", progress=False)
    (dst / "NOTES.md").write_text("my only copy")
    (dst / "sub").mkdir()
    (dst / "sub" / "f").write_text("mine")
    before = _state(tmp_path)
    code, err = _cli(capsys, src, dst, "--format", "bf16", "--force")
    line = _one_error_line(err)
    assert code == 2 and f"{dst} holds what a conversion does not write (NOTES.md, sub/)" in line, line
    assert "nothing was written" in line and _state(tmp_path) == before and _hidden(tmp_path) == []
    shutil.rmtree(dst / "sub")
    (dst / "NOTES.md").unlink()
    (dst / "model-00009-of-00009.safetensors").write_bytes(b"stale shard of another conversion")
    code, err = _cli(capsys, src, dst, "--format", "bf16", "--force")
    assert code == 0 and not (dst / "model-00009-of-00009.safetensors").exists() and verify(dst, against=src).ok


def test_force_into_the_working_directory_reports_success(tmp_path, tiny_llama, capsys, monkeypatch):
    """DST spelled "." (the shell inside it): the commit replaces the working directory, and the run
    still reports what it wrote, with exit status 0 (it used to re-read "." after the swap and fail)."""
    src, _ = tiny_llama
    dst = tmp_path / "out"
    dst.mkdir()
    monkeypatch.chdir(dst)
    code, err = _cli(capsys, src, ".", "--format", "bf16", "--force")
    assert code == 0 and "replaced the empty directory at ." in err, err
    assert verify(dst, against=src).ok


def test_an_output_under_a_file_is_refused_by_name(tmp_path, tiny_llama, capsys):
    src, _ = tiny_llama
    (tmp_path / "afile").write_text("x")
    code, err = _cli(capsys, src, tmp_path / "afile" / "sub")
    line = _one_error_line(err)
    assert code == 2 and f"{tmp_path / 'afile'} is a file, not a directory; choose another output" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "llama"] and (tmp_path / "afile").is_file()


def test_a_full_disk_names_the_output(tmp_path, tiny_llama, capsys, monkeypatch):
    """ENOSPC names no file: the error still names DST and the fix, and nothing is left behind."""
    import errno

    src, _ = tiny_llama
    dst = tmp_path / "out"

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(convert_mod, "_verify_partial", full)
    code, err = _cli(capsys, src, dst)
    line = _one_error_line(err)
    assert code == 2 and f"cannot write {dst}: No space left on device (nothing was left behind" in line, line
    assert not dst.exists() and _hidden(tmp_path) == []


def _packed_elsewhere(tmp_path, src) -> Path:
    other = tmp_path / "packed-elsewhere"
    convert(src, other, weight_format="bf16", progress=False)
    return other


@pytest.mark.parametrize("what, words", [
    ("dir", "is a directory that is not a swiglu-fused packed checkpoint"),
    ("file", "is a file, not a directory"),
    ("symlink", "is a symbolic link (to packed-elsewhere)"),  # even to a packed output: its target is not DST
    ("dangling", "is a symbolic link (to nowhere)"),
    ("config-only", "is a directory that is not a swiglu-fused packed checkpoint"),
])
def test_force_refuses_anything_but_a_packed_output_or_an_empty_directory(tmp_path, tiny_llama, capsys, what, words):
    src, _ = tiny_llama
    dst = tmp_path / "out"
    _packed_elsewhere(tmp_path, src)
    if what == "dir":
        dst.mkdir()
        (dst / "notes.txt").write_text("my only copy")
    elif what == "file":
        dst.write_text("my only copy")
    elif what == "symlink":
        dst.symlink_to("packed-elsewhere")
    elif what == "dangling":
        dst.symlink_to("nowhere")
    else:  # a model directory of someone else's with a config.json but another quant_method
        dst.mkdir()
        (dst / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8"}}))
    before = _state(tmp_path)
    for flags in ([], ["--force"]):
        code, err = _cli(capsys, src, dst, *flags)
        line = _one_error_line(err)
        assert code == 2 and f"{dst} " in line and words in line and "remove it yourself" in line, line
    assert _state(tmp_path) == before


# ------------------------------------------------------------------ 2. nothing appears or vanishes

STALL = """
import os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal's shell starts it, even where the tests run under nohup
signal.signal(signal.SIGINT, signal.default_int_handler)  # (and as a background job, which inherits SIGINT ignored)
from swiglu_fused.weight_packing import safetensors_io as sio
from swiglu_fused.cli import main
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
real = sio.write_file
def stalling_write(tensors, path, metadata=None):
    real(tensors, path, metadata)
    ready.write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
sio.write_file = stalling_write
sys.exit(main(sys.argv[3:]))
"""


def _stalled_convert(tmp_path, src, dst, *extra) -> tuple[subprocess.Popen, Path]:
    """A real ``swiglu-fused convert`` in a child process, stopped after writing its first shard
    (its lock held, its partial directory half written). Touch the returned path to let it go on."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    ready.unlink(missing_ok=True)
    go.unlink(missing_ok=True)
    child = subprocess.Popen([sys.executable, "-c", STALL, str(ready), str(go), "convert", str(src), str(dst),
                              "--no-progress", *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the child convert never reached its first write"
        time.sleep(0.02)
    return child, go


def test_a_second_convert_to_the_same_dst_is_refused_while_the_first_runs(tmp_path, tiny_llama, capsys):
    src, _ = tiny_llama
    out = tmp_path / "out"
    out.mkdir()
    dst = out / "packed"
    child, go = _stalled_convert(tmp_path, src, dst)
    try:
        code, err = _cli(capsys, src, dst, "--force")
        line = _one_error_line(err)
        assert code == 2 and f"{dst} is being written by another swiglu-fused convert (pid {child.pid} on " \
                             f"{socket.gethostname()}" in line
        assert not dst.exists()
    finally:
        go.touch()
        stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, stderr
    assert stdout.startswith(f"wrote {dst}") and verify(dst).ok
    assert _hidden(out) == []  # the winner's lock and partial directory are gone, the loser left none


@pytest.mark.parametrize("appears", ["empty dir", "dir", "file"])
def test_dst_appearing_during_the_run_is_left_alone(tmp_path, tiny_llama, capsys, monkeypatch, appears):
    """Something created at DST while converting (here: just before the commit) is not replaced —
    not even an empty directory, which a plain rename would silently replace."""
    src, _ = tiny_llama
    dst = tmp_path / "out"
    real_verify = convert_mod.verify

    def someone_else_creates_dst(path, *args, **kwargs):
        if appears == "file":
            dst.write_text("theirs")
        else:
            dst.mkdir()
            if appears == "dir":
                (dst / "theirs.txt").write_text("theirs")
        return real_verify(path, *args, **kwargs)

    monkeypatch.setattr(convert_mod, "verify", someone_else_creates_dst)
    before_src = _state(src)
    code, err = _cli(capsys, src, dst)
    line = _one_error_line(err)
    assert code == 2 and f"{dst} changed during conversion: it was absent when the conversion started" in line
    assert "nothing was written" in line
    if appears == "file":
        assert dst.read_text() == "theirs"
    else:
        assert sorted(p.name for p in dst.iterdir()) == ([] if appears == "empty dir" else ["theirs.txt"])
    assert _state(src) == before_src and _hidden(tmp_path) == []


@pytest.mark.parametrize("change", ["replaced by another packed output", "files added to the empty dir", "removed"])
def test_force_replaces_only_what_was_there_when_the_run_started(tmp_path, tiny_llama, capsys, monkeypatch, change):
    src, _ = tiny_llama
    dst = tmp_path / "out"
    if change == "files added to the empty dir":
        dst.mkdir()
    else:
        convert(src, dst, weight_format="bf16", progress=False)
    real_verify = convert_mod.verify

    def someone_else_changes_dst(path, *args, **kwargs):
        if change == "replaced by another packed output":
            shutil.copytree(dst, tmp_path / "copy")
            shutil.rmtree(dst)
            (tmp_path / "copy").rename(dst)
        elif change == "files added to the empty dir":
            (dst / "theirs.txt").write_text("theirs")
        else:
            shutil.rmtree(dst)
        return real_verify(path, *args, **kwargs)

    monkeypatch.setattr(convert_mod, "verify", someone_else_changes_dst)
    code, err = _cli(capsys, src, dst, "--force")
    line = _one_error_line(err)
    assert code == 2 and f"{dst} changed during conversion" in line and "it was left as it is" in line
    after = {"replaced by another packed output": "is now a packed checkpoint (another one)",
             "files added to the empty dir": "is now a directory that is not a swiglu-fused packed checkpoint",
             "removed": "is now absent"}[change]
    assert after in line
    if change == "replaced by another packed output":
        assert verify(dst).ok and json.loads((dst / "config.json").read_text())[
            "quantization_config"]["weight_format"] == "bf16"  # theirs, not ours (fp8_block128)
    elif change == "files added to the empty dir":
        assert [p.name for p in dst.iterdir()] == ["theirs.txt"]
    else:
        assert not dst.exists()
    assert _hidden(tmp_path) == []


def test_a_killed_run_leaves_a_partial_directory_that_the_next_run_removes(tmp_path, tiny_llama, capsys):
    src, _ = tiny_llama
    dst = tmp_path / "out"
    child, _ = _stalled_convert(tmp_path, src, dst)
    child.kill()  # SIGKILL: no cleanup can run
    child.communicate(timeout=60)
    partials = [n for n in _hidden(tmp_path) if n.startswith(".out.partial-")]
    assert len(partials) == 1 and (tmp_path / partials[0] / MARKER).is_file()
    assert ".out.lock" in _hidden(tmp_path)  # the file stays; its flock died with the process
    # partial directories that are not provably a dead local run's are never touched
    keep = {".out.partial-nomarker": None,
            ".out.partial-otherhost": {"pid": child.pid, "host": socket.gethostname() + "-elsewhere"},
            ".out.partial-alive": {"pid": os.getpid(), "host": socket.gethostname()},
            ".out.partial-badmarker": "not json"}
    for name, marker in keep.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"half")
        if marker is not None:
            (tmp_path / name / MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))
    kept = {name: _state(tmp_path / name) for name in keep}
    code, err = _cli(capsys, src, dst)
    lines = err.strip().splitlines()
    assert code == 0 and lines == [f"swiglu-fused convert: removed {tmp_path / partials[0]}, left by an "
                                   f"interrupted convert (pid {child.pid}, started {lines[0].split('started ')[1]}"]
    assert verify(dst).ok
    assert _hidden(tmp_path) == sorted(keep)  # the stale one and the lock are gone
    assert {name: _state(tmp_path / name) for name in keep} == kept


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_signals_clean_up_and_print_one_line(tmp_path, tiny_llama, sig):
    src, _ = tiny_llama
    out = tmp_path / "new"
    dst = out / "packed"  # its parent is made by convert, and must go again
    child, go = _stalled_convert(tmp_path, src, dst)
    signum = getattr(signal, sig)
    child.send_signal(signum)
    try:
        _, stderr = child.communicate(timeout=60)
    finally:
        go.touch()
    assert child.returncode == 128 + signum, stderr
    assert stderr.strip().splitlines() == [f"swiglu-fused convert: interrupted; nothing was written to {dst}"]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["go", "llama", "ready"]


def test_signal_handlers_are_installed_only_during_convert_and_respect_the_callers(tmp_path, tiny_llama, monkeypatch):
    """The Python API leaves no handler behind; a handler the application set (or nohup's ignored
    SIGHUP) stays in charge during the conversion."""
    src, _ = tiny_llama

    def mine(signum, frame):
        pass

    during = {}
    real_write = sio.write_file

    def recording_write(tensors, path, metadata=None):
        during.update({s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)})
        real_write(tensors, path, metadata)

    monkeypatch.setattr(sio, "write_file", recording_write)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, even where the suite runs as a background job
    signal.signal(signal.SIGHUP, mine)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        convert(src, tmp_path / "a", progress=False)
        assert during[signal.SIGHUP] is mine  # the application's own
        assert during[signal.SIGTERM] not in (signal.SIG_DFL, signal.SIG_IGN)  # ours: cleans up, then raises
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and signal.getsignal(signal.SIGHUP) is mine
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        with pytest.raises(FileExistsError):
            convert(src, tmp_path / "a", progress=False)
        convert(src, tmp_path / "b", progress=False)
        assert during[signal.SIGHUP] is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def test_a_signal_during_the_commit_waits_until_dst_is_complete(tmp_path, tiny_llama, capsys, monkeypatch):
    """A signal that arrives while DST is being committed neither tears the commit nor claims that
    nothing was written: the commit finishes, then the run stops with 128+N and says DST is complete."""
    src, _ = tiny_llama
    dst = tmp_path / "out"
    real_commit = destination.Destination.commit

    def signalled_commit(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # let the handler run before the commit goes on
        real_commit(self)

    monkeypatch.setattr(destination.Destination, "commit", signalled_commit)
    assert main(["convert", str(src), str(dst), "--no-progress"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"swiglu-fused convert: interrupted; {dst} was already complete"]
    assert verify(dst).ok and _hidden(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_without_renameat2_the_same_guarantees_hold(tmp_path, tiny_llama, capsys, monkeypatch):
    """Systems without renameat2 (or file systems without its flags) take the fallback: check,
    then rename; move the old output aside, check it is the one inspected, move ours in."""
    src, _ = tiny_llama
    monkeypatch.setattr(destination, "_rename2", lambda a, b, flags: False)
    dst = tmp_path / "out"
    convert(src, dst, weight_format="bf16", progress=False)
    old_inode = dst.stat().st_ino
    code, err = _cli(capsys, src, dst, "--force")
    assert code == 0 and "replaced the previous packed checkpoint" in err and dst.stat().st_ino != old_inode
    assert verify(dst).ok and _hidden(tmp_path) == []
    real_verify = convert_mod.verify

    def someone_else_creates(path, *args, **kwargs):
        (tmp_path / "late").mkdir()
        return real_verify(path, *args, **kwargs)

    monkeypatch.setattr(convert_mod, "verify", someone_else_creates)
    code, err = _cli(capsys, src, tmp_path / "late")
    assert code == 2 and "changed during conversion" in _one_error_line(err)
    assert list((tmp_path / "late").iterdir()) == [] and _hidden(tmp_path) == []


# ------------------------------------------------------------------ 3. verified before the commit

def test_an_output_that_fails_verify_is_never_committed(tmp_path, tiny_llama, capsys, monkeypatch):
    """A converter bug (simulated: a shard whose metadata says another format) is caught by the
    same checks as ``swiglu-fused verify`` before DST appears; the message names DST's file."""
    src, _ = tiny_llama
    dst = tmp_path / "out"
    real_write = sio.write_file

    def wrong_metadata(tensors, path, metadata=None):
        blob = json.loads(metadata["swiglu_fused"])
        blob["weight_format"] = "nvfp4"
        real_write(tensors, path, {**metadata, "swiglu_fused": json.dumps(blob)})

    monkeypatch.setattr(sio, "write_file", wrong_metadata)
    code, err = _cli(capsys, src, dst)
    line = _one_error_line(err)
    assert code == 2 and f"{dst}: the converted checkpoint fails verify, so nothing was written" in line
    assert f"{dst / 'model.safetensors'}" in line and "weight_format" in line and ".partial" not in line
    assert not dst.exists() and _hidden(tmp_path) == []
    with pytest.raises(FormatError, match="fails verify"):
        convert(src, dst, progress=False)


# ------------------------------------------------------------------ 8. shard numbers, argument types

def test_sharded_output_is_numbered_consecutively(tmp_path):
    src = tmp_path / "src"
    make_causal_lm(src, max_shard_size="100KB")
    src_index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    by_file = {}
    for name, f in src_index.items():
        by_file.setdefault(f, []).append(name)
    partner = {"gate_proj.weight": "up_proj.weight", "up_proj.weight": "gate_proj.weight"}

    def waits(name, f):  # a gate or up half whose partner comes in a later shard
        stem, _, proj = name.rpartition(".mlp.")
        return proj in partner and src_index[f"{stem}.mlp.{partner[proj]}"] > f

    waiting_only = [f for f, names in by_file.items() if all(waits(n, f) for n in names)]
    assert waiting_only, "the fixture must have a source shard that holds only a half waiting for its partner"
    convert(src, tmp_path / "a", progress=False)
    convert(src, tmp_path / "b", progress=False)
    dst = tmp_path / "a"
    files = sorted(p.name for p in dst.glob("*.safetensors"))
    n = len(by_file) - len(waiting_only)
    assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == files
    for f in files:
        header = sio.read_header(dst / f)
        assert sorted(n for n, v in index["weight_map"].items() if v == f) == sorted(header.entries)
    assert index["metadata"]["total_size"] == sum(sio.read_header(dst / f).data_bytes for f in files)
    assert verify(dst, against=src).ok
    assert _state(tmp_path / "a") == {k.replace("b", "a", 1): v for k, v in _state(tmp_path / "b").items()}


@pytest.mark.parametrize("kwargs, words", [
    ({"force": "yes"}, "force='yes' (str); expected True or False"),
    ({"progress": 1}, "progress=1 (int); expected True or False"),
    ({"interleave": "128"}, "interleave='128' (str); expected an int"),
    ({"interleave": True}, "interleave=True (bool); expected an int"),
    ({"weight_format": 8}, "weight_format=8 (int); expected a format name"),  # None: follow the source
    ({"source_format": 1}, "source_format=1 (int); expected one of"),
    ({"dst": None}, "dst=None (NoneType); expected a path"),
])
def test_the_python_api_rejects_wrong_argument_types_by_name(tmp_path, tiny_llama, kwargs, words):
    src, _ = tiny_llama
    args = {"dst": tmp_path / "out", **kwargs}
    with pytest.raises(TypeError, match=re.escape(f"convert(): {words}")):
        convert(src, args.pop("dst"), **args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]
