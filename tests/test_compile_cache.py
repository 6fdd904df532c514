"""The on-disk compiled-kernel cache (DESIGN §5): a second process loads what the first compiled,
without calling the compiler; corrupt entries are rebuilt; the key follows the kernel source.
Runs on the CPU (CuTe DSL compiles and exports sm_90a objects without a GPU); skipped where
nvidia-cutlass-dsl is not installed."""

import json
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

ROOT = Path(__file__).resolve().parents[1]
PIN = "5" * 64  # stands in for the source hash (see _CHILD)

# compiles (or loads) a shipped quant_x or gate_up config (FAMILY); with FORBID_COMPILE set, cute.compile raises
_CHILD = r"""
import json, os, sys, time
import cutlass.cute as cute
from swiglu_fused.kernels.sm90 import compile_cache, quant_x

# the kernel sources may be edited while the test runs (that rightly changes the key): pin it
compile_cache._source_hash = os.environ["PIN_SOURCE_HASH"]
if os.environ.get("FORBID_COMPILE"):
    def _no_compile(*a, **k):
        raise AssertionError("cute.compile called although the disk cache should have served")
    cute.compile = _no_compile
family = os.environ.get("FAMILY", "quant_x")
if family == "quant_x":
    cfg = quant_x.QuantXConfig()
    build = lambda: quant_x.compile_quant_x(cfg)
else:  # the decode tile of the flagship kernel
    from swiglu_fused.kernels.sm90 import gate_up
    cfg = gate_up.GateUpConfig(tile_m=64, stages=5)
    build = lambda: gate_up.compile_gate_up(cfg)
t = time.perf_counter()
fn = compile_cache.get(family, cfg, build)
dt = time.perf_counter() - t
assert fn is not None and callable(fn)
print(json.dumps(dict(compile_cache.stats, seconds=dt, path=str(compile_cache.entry_path(family, cfg)))))
"""


def _run(cache_dir, umask=None, **env):
    e = dict(os.environ, SWIGLU_FUSED_CACHE_DIR=str(cache_dir), PIN_SOURCE_HASH=PIN, **env)
    e.pop("SWIGLU_FUSED_DISK_CACHE", None)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", _CHILD], env=e, cwd=ROOT, capture_output=True, text=True,
                       timeout=120, preexec_fn=None if umask is None else (lambda: os.umask(umask)))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


@pytest.mark.parametrize("family", ["quant_x", "gate_up"])
def test_second_process_loads_without_compiling(tmp_path, family):
    first, _ = _run(tmp_path, FAMILY=family)
    assert first["built"] == 1 and first["disk_writes"] == 1 and first["disk_loads"] == 0
    entry = Path(first["path"])
    assert entry.is_file() and entry.parent.parent == tmp_path
    assert not [p for p in entry.parent.iterdir() if p != entry]  # no temp files left behind

    second, _ = _run(tmp_path, FORBID_COMPILE="1", FAMILY=family)
    assert second["built"] == 0 and second["disk_loads"] == 1 and second["disk_errors"] == 0
    assert second["path"] == first["path"]


def test_corrupt_entry_is_rebuilt(tmp_path, monkeypatch):
    from swiglu_fused.kernels.sm90 import compile_cache as cc
    from swiglu_fused.kernels.sm90.quant_x import QuantXConfig

    monkeypatch.setenv("SWIGLU_FUSED_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SWIGLU_FUSED_DISK_CACHE", raising=False)
    monkeypatch.setattr(cc, "_source_hash", PIN)
    entry = cc.entry_path("quant_x", QuantXConfig())
    entry.parent.mkdir(parents=True)
    entry.write_bytes(cc.MAGIC + b"\0" * 32 + b"\x7fELF truncated")  # e.g. a torn write from elsewhere
    again, err = _run(tmp_path)
    assert again["path"] == str(entry)
    assert again["disk_errors"] == 1 and again["built"] == 1 and again["disk_writes"] == 1
    assert "ignoring unusable entry" in err
    third, _ = _run(tmp_path, FORBID_COMPILE="1")  # the rebuilt entry replaced the corrupt one
    assert third["disk_loads"] == 1 and third["built"] == 0 and third["disk_errors"] == 0


def test_key_follows_source_config_and_dir(tmp_path, monkeypatch):
    from swiglu_fused.kernels.sm90 import compile_cache as cc
    from swiglu_fused.kernels.sm90.quant_x import QuantXConfig

    monkeypatch.setenv("SWIGLU_FUSED_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SWIGLU_FUSED_DISK_CACHE", raising=False)
    p = cc.entry_path("quant_x", QuantXConfig())
    assert p.parent == tmp_path / "kernels" and p.name.startswith("quant_x-")
    assert cc.entry_key("gate_up", QuantXConfig()) != cc.entry_key("quant_x", QuantXConfig())
    monkeypatch.setattr(cc, "_source_hash", None)
    assert cc.source_hash() == cc.source_hash() and len(cc.source_hash()) == 64
    p = cc.entry_path("quant_x", QuantXConfig())
    monkeypatch.setattr(cc, "_source_hash", "0" * 64)  # an edited kernel source
    assert cc.entry_path("quant_x", QuantXConfig()) != p
    monkeypatch.setenv("SWIGLU_FUSED_DISK_CACHE", "0")
    assert cc.entry_path("quant_x", QuantXConfig()) is None


def test_compile_error_names_the_configuration(monkeypatch):
    from swiglu_fused.kernels.sm90 import compile_cache, gate_up

    monkeypatch.setenv("SWIGLU_FUSED_DISK_CACHE", "0")
    cfg = gate_up.GateUpConfig(tile_m=64, stages=5, act="gelu_tanh")

    def broken():
        raise TypeError("DSL could not lower an op")

    monkeypatch.setattr(compile_cache, "_compiled", {})
    with pytest.raises(compile_cache.CompileError, match="gate_up kernel for GateUpConfig.*act='gelu_tanh'.*"
                       "TypeError: DSL could not lower an op"):
        compile_cache.get("gate_up", cfg, broken)
    assert ("gate_up", cfg) not in compile_cache._compiled  # nothing half-built is kept


def _mode(p):
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_cache_is_private_whatever_the_umask(tmp_path):
    """Entries are native code loaded into the process: directories the cache creates are 0700 and
    entries 0600, even under umask 0 (the old code wrote 0644 "to be shareable")."""
    root = tmp_path / "home" / "cache"  # neither exists yet
    first, err = _run(root, umask=0)
    assert first["disk_writes"] == 1 and first["disk_unsafe"] == 0, err
    entry = Path(first["path"])
    assert _mode(entry) == 0o600
    assert [_mode(d) for d in (tmp_path / "home", root, entry.parent)] == [0o700] * 3
    second, _ = _run(root, umask=0, FORBID_COMPILE="1")  # and a private cache is used
    assert second["disk_loads"] == 1 and second["built"] == 0


def _snapshot(root):
    return {p: (p.read_bytes(), os.lstat(p).st_mtime_ns) for p in Path(root).rglob("*") if p.is_file()}


@pytest.mark.parametrize("loose", ["root", "kernels", "entry"])
def test_writable_by_others_is_not_loaded_nor_written(tmp_path, loose):
    """A cache directory (or entry) others can write may hold their code: warn, compile in-process,
    load nothing from it and write nothing to it."""
    first, _ = _run(tmp_path)
    entry = Path(first["path"])
    target, mode = {"root": (tmp_path, 0o777), "kernels": (entry.parent, 0o775), "entry": (entry, 0o666)}[loose]
    os.chmod(target, mode)
    before = _snapshot(tmp_path)
    again, err = _run(tmp_path)
    assert again["disk_loads"] == 0 and again["built"] == 1 and again["disk_writes"] == 0
    assert again["disk_unsafe"] >= 1 and again["disk_errors"] == 0
    assert err.count("RuntimeWarning") == 1 and "not using" in err and f"{target} is writable by" in err
    assert (f"delete {target}" if loose == "entry" else f"chmod go-w {target}") in err
    assert _snapshot(tmp_path) == before  # nothing written there


def test_entry_or_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    """Owned by someone else (another uid: simulated by this process claiming another uid), or an entry
    that is a symlink: refused with one warning per cache directory."""
    from swiglu_fused.kernels.sm90 import compile_cache as cc

    kernels = tmp_path / "kernels"
    kernels.mkdir(mode=0o700)
    entry = kernels / "quant_x-0.o"
    entry.write_bytes(b"x")
    os.chmod(entry, 0o600)
    monkeypatch.setattr(cc, "_unsafe_warned", set())
    assert cc._safe_chain(entry)
    elsewhere = tmp_path / "planted.o"
    elsewhere.write_bytes(b"x")
    entry.unlink()
    entry.symlink_to(elsewhere)
    with pytest.warns(RuntimeWarning, match=r"not using .*kernels: entry .*quant_x-0\.o is not a regular file"):
        assert not cc._safe_chain(entry)
    entry.unlink()
    monkeypatch.setattr(cc, "_unsafe_warned", set())
    monkeypatch.setattr(os, "getuid", lambda: os.stat(tmp_path).st_uid + 1)
    with pytest.warns(RuntimeWarning, match=r"directory .* is owned by uid \d+, not by you"):
        assert not cc._safe_chain(entry)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per directory
        assert not cc._safe_chain(entry)
