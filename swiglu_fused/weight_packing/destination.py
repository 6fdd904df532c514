"""Where ``convert`` writes: the guarantees that keep a user's files safe (see convert's docstring).

- ``locate`` refuses a DST that is SRC, lies inside it or contains it, however the paths are
  spelled (relative, ``..``, symlinks, bind mounts: existing directories are compared by device
  and inode, not by name).
- ``Destination`` holds one run's claim on DST: the parent directories it made, a lock file
  ``.DST.lock`` beside DST (``flock``: a second run on the same DST is refused at once, and a
  killed run's lock dies with it), the hidden partial directory ``.DST.partial-*`` the output is
  written into (with a marker naming the pid and host, so that a later run can remove it if that
  process was killed), and the commit: a rename that fails if anything appeared at DST meanwhile,
  or, with ``--force``, an atomic exchange with the previous packed output (or empty directory)
  that was inspected at the start, and with nothing else.
- ``Interrupts`` turns SIGINT, SIGTERM and SIGHUP into ``ConvertInterrupted`` while a conversion
  runs, so that all three clean up the same way.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import shutil
import signal
import socket
import stat
import threading
import time
import uuid
from pathlib import Path

from .. import formats
from ..formats import FormatError
from . import safetensors_io as sio

try:
    import fcntl
except ImportError:  # not POSIX: no lock; the commit still refuses to overwrite what appeared
    fcntl = None

log = logging.getLogger(__name__)

MARKER = ".swiglu-fused-partial"  # inside a partial directory: {"pid", "host", "started", "dst"}
REPLACE_RULE = ("force=True replaces only a previous swiglu-fused output (a directory whose config.json has "
                f"quantization_config.quant_method {formats.QUANT_METHOD!r}) or an empty directory")


class DestinationError(FileExistsError):
    """DST is in use by another run, changed during the conversion, or is not something
    ``force`` may replace. The message names DST and says what to do."""


class ConvertInterrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP stopped a conversion. ``written`` says whether DST had already
    been committed (the signal came during the last moments of the run) or nothing was written."""

    def __init__(self, signum: int, written: bool = False):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.written = signum, written


# ------------------------------------------------------------------ where DST is, and what it is

def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def locate(src: Path, dst: Path) -> Path:
    """DST's real location (its parent resolved; a symlink at DST itself is not followed).
    Refuses a DST equal to SRC, inside it, or containing it, in any spelling."""
    src_real = Path(os.path.realpath(src))
    followed = Path(os.path.realpath(dst))
    where = Path(os.path.realpath(dst.parent)) / dst.name if os.path.islink(dst) else followed

    def spelled(p: Path, real: Path) -> str:
        return f"{p}" if Path(os.path.abspath(p)) == real else f"{p} (that is {real})"

    d, s = spelled(dst, followed), spelled(src, src_real)
    for p in dict.fromkeys((where, followed)):
        if p == src_real or _same_dir(p, src_real):
            raise FormatError(f"dst {d} is the source directory {s}; choose another output directory "
                              "(convert never writes into its source)")
        if src_real in p.parents or any(_same_dir(a, src_real) for a in p.parents):
            raise FormatError(f"dst {d} is inside the source directory {s}; choose an output directory outside it")
        if p in src_real.parents or any(_same_dir(p, a) for a in src_real.parents):
            raise FormatError(f"dst {d} contains the source directory {s}; choose an output directory that does "
                              "not contain it (replacing dst would delete the source)")
    return where


def _is_packed(path: Path) -> bool:
    try:
        with open(path / formats.CONFIG_FILE, "rb") as f:
            config = json.loads(f.read(1 << 20))
        return config["quantization_config"][formats.K_QUANT_METHOD] == formats.QUANT_METHOD
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _describe(path: Path) -> tuple[str, os.stat_result] | None:
    """What is at ``path`` now: None (nothing), "empty", "packed", or words for anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"a symbolic link (to {os.readlink(path)})", st
    if not stat.S_ISDIR(st.st_mode):
        return "a file, not a directory", st
    with os.scandir(path) as entries:
        if next(entries, None) is None:
            return "empty", st
    if not _is_packed(path):
        return "a directory that is not a swiglu-fused packed checkpoint", st
    for root, dirs, _ in os.walk(path):  # replacing removes it: never descend into another file system
        for d in dirs:
            if os.lstat(os.path.join(root, d)).st_dev != st.st_dev:
                return f"a packed checkpoint with a mount point inside ({os.path.join(root, d)})", st
    return "packed", st


def _foreign_entries(old: Path, new: Path) -> list[str]:
    """What a previous packed output ``old`` holds beyond what a conversion writes: entries that are
    neither in the new output ``new`` nor checkpoint files (shards, their index, config.json), e.g. a
    user's notes or folders, which --force must not delete. Sorted, directories with a trailing /."""
    def ours(name: str) -> bool:
        return name.endswith(".safetensors") or name in (formats.CONFIG_FILE, "generation_config.json", *sio.INDEX_NAMES)

    made = {e.name for e in os.scandir(new)}
    with os.scandir(old) as entries:
        return sorted(e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in entries
                      if e.name not in made and not (e.is_file(follow_symlinks=False) and ours(e.name)))


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


# ------------------------------------------------------------------ renames that refuse to clobber

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
_renameat2 = None


def _rename2(a: Path, b: Path, flags: int) -> bool:
    """renameat2(2); False where the system or the file system does not offer it."""
    global _renameat2
    if _renameat2 is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _renameat2 = fn
        except (OSError, AttributeError):
            _renameat2 = False
    if not _renameat2:
        return False
    at_fdcwd = -100
    if _renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


def _rename_noreplace(a: Path, b: Path) -> None:
    """Rename ``a`` to ``b``; FileExistsError if anything is at ``b`` (even an empty directory,
    which a plain rename would silently replace)."""
    try:
        if _rename2(a, b, RENAME_NOREPLACE):
            return
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise FileExistsError(e.errno, e.strerror, os.fspath(b)) from None
        raise
    if os.path.lexists(b):  # fallback: check, then rename (the lock keeps other converts out)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(b))
    os.rename(a, b)


# ------------------------------------------------------------------ one run's claim on DST

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process
        return True
    return True


def _read_marker(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            m = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    ok = (isinstance(m, dict) and isinstance(m.get("pid"), int) and not isinstance(m.get("pid"), bool)
          and m["pid"] > 0 and isinstance(m.get("host"), str))
    return m if ok else None


def _stamp(dst: Path) -> str:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S"), "dst": str(dst)})


class Destination:
    """Use as ``with Destination(src, dst, force) as d:`` — write into ``d.partial``, then call
    ``d.commit()``. Leaving the block without a commit removes the partial directory, the lock
    and the parent directories made for DST; ``d.replaced`` says what a commit replaced."""

    def __init__(self, src: Path, dst: Path, force: bool):
        self.shown, self.force = dst, force
        self.path = locate(src, dst)
        self.lock_path = self.path.parent / f".{self.path.name}.lock"
        self.partial = self.path.parent / f".{self.path.name}.partial-{uuid.uuid4().hex[:8]}"
        self.made_parents: list[Path] = []
        self.seen: tuple[str, os.stat_result] | None = None  # what was at DST when we looked
        self.replaced: str | None = None
        self.committed = False
        self._lock_fd: int | None = None
        self._old: Path | None = None  # the replaced DST, to remove after the commit

    def __enter__(self) -> Destination:
        try:
            blocker = next((p for p in self.path.parents if p.exists() and not p.is_dir()), None)
            if blocker is not None:
                raise DestinationError(f"{self.shown}: {blocker} is a file, not a directory; choose another output "
                                       f"directory")
            self.made_parents = [p for p in self.path.parents if not p.exists()]  # nearest first
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock()
            self._sweep_stale_partials()
            self.seen = self._inspect()
            self.partial.mkdir()
            (self.partial / MARKER).write_text(_stamp(self.shown) + "\n")
        except BaseException:
            self._clean_up()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._clean_up()

    # -- the lock
    def _lock(self) -> None:
        if fcntl is None:
            return
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_marker(self.lock_path)
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise OSError(e.errno, e.strerror, os.fspath(self.lock_path)) from None
                who = (f" (pid {holder['pid']} on {holder['host']}, started {holder.get('started', '?')})"
                       if holder else "")
                raise DestinationError(f"{self.shown} is being written by another swiglu-fused convert{who}; "
                                       f"wait for it to finish or choose another output directory") from None
            try:  # the run that held it may have removed the file just before we locked it
                same = _identity(os.fstat(fd)) == _identity(os.stat(self.lock_path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, (_stamp(self.shown) + "\n").encode())

    def _unlock(self) -> None:
        if self._lock_fd is None:
            return
        try:
            os.unlink(self.lock_path)  # while still holding it; see _lock for the other side
        except FileNotFoundError:
            pass
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- what earlier runs left, and what is at DST
    def _sweep_stale_partials(self) -> None:
        """Remove partial directories of this DST left by killed runs on this host: only those
        whose marker names a process that no longer exists."""
        prefix, host = f".{self.path.name}.partial-", socket.gethostname()
        for name in sorted(os.listdir(self.path.parent)):
            p = self.path.parent / name
            if not name.startswith(prefix) or p.is_symlink() or not p.is_dir():
                continue
            m = _read_marker(p / MARKER)
            if m is None or m["host"] != host or _alive(m["pid"]):
                continue
            shutil.rmtree(p)
            log.warning("removed %s, left by an interrupted convert (pid %d, started %s)",
                        p, m["pid"], m.get("started", "?"))

    def _inspect(self) -> tuple[str, os.stat_result] | None:
        seen = _describe(self.path)
        if seen is None:
            return None
        what = seen[0]
        replaceable = what in ("empty", "packed")
        if not self.force:
            if replaceable:
                raise FileExistsError(f"{self.shown} already exists; pass force=True to replace it")
            raise FileExistsError(f"{self.shown} already exists and is {what}; {REPLACE_RULE}: "
                                  f"remove it yourself or choose another output directory")
        if not replaceable:
            raise DestinationError(f"{self.shown} is {what}; {REPLACE_RULE}: remove it yourself "
                                   f"or choose another output directory")
        return seen

    # -- the commit
    def _changed(self, now: tuple[str, os.stat_result] | None) -> DestinationError:
        def words(seen):
            if seen is None:
                return "absent"
            return {"empty": "an empty directory", "packed": "a packed checkpoint"}.get(seen[0], seen[0])

        other = (now is not None and self.seen is not None and now[0] == self.seen[0]
                 and _identity(now[1]) != _identity(self.seen[1]))
        return DestinationError(f"{self.shown} changed during conversion: it was {words(self.seen)} when the "
                                f"conversion started and is now {words(now)}{' (another one)' if other else ''}; it was "
                                f"left as it is and nothing was written (remove it or choose another output "
                                f"directory, then convert again)")

    def commit(self) -> None:
        """Move the finished partial directory to DST, atomically against what is at DST now."""
        (self.partial / MARKER).unlink()
        if self.seen is None:
            try:
                _rename_noreplace(self.partial, self.path)
            except FileExistsError:
                raise self._changed(_describe(self.path)) from None
            self.committed = True
            return
        now = _describe(self.path)
        if now is None or now[0] != self.seen[0] or _identity(now[1]) != _identity(self.seen[1]):
            raise self._changed(now)
        foreign = _foreign_entries(self.path, self.partial) if self.seen[0] == "packed" else []
        if foreign:
            listed = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise DestinationError(f"{self.shown} holds what a conversion does not write ({listed}); {REPLACE_RULE}, "
                                   f"holding nothing else: move those elsewhere or choose another output directory "
                                   f"(nothing was written)")
        if _rename2(self.partial, self.path, RENAME_EXCHANGE):
            try:
                moved = os.lstat(self.partial)  # what we swapped out: must be what we inspected
            except FileNotFoundError:
                moved = None
            if moved is None or _identity(moved) != _identity(self.seen[1]):
                _rename2(self.partial, self.path, RENAME_EXCHANGE)  # put theirs back
                raise self._changed(_describe(self.path))
            self._old = self.partial
        else:  # no atomic exchange here: move the old one aside, check it, move ours in
            old = self.path.parent / f".{self.path.name}.replaced-{uuid.uuid4().hex[:8]}"
            os.rename(self.path, old)
            if _identity(os.lstat(old)) != _identity(self.seen[1]):
                _rename_noreplace(old, self.path)
                raise self._changed(_describe(self.path))
            try:
                _rename_noreplace(self.partial, self.path)
            except FileExistsError:
                raise DestinationError(f"{self.shown} changed during conversion: something appeared there while "
                                       f"the previous packed checkpoint was being replaced; that one is now at "
                                       f"{old}. Nothing was written") from None
            self._old = old
        self.committed = True
        self.replaced = "empty directory" if self.seen[0] == "empty" else "previous packed checkpoint"
        log.warning("replaced the %s at %s", self.replaced, self.shown)

    # -- cleaning up
    def _clean_up(self) -> None:
        try:
            if self._old is not None:
                shutil.rmtree(self._old, ignore_errors=True)
            if not self.committed:
                shutil.rmtree(self.partial, ignore_errors=True)
        finally:
            self._unlock()
            if not self.committed:
                for p in self.made_parents:  # nearest first; stops at the first that is not empty
                    try:
                        p.rmdir()
                    except OSError:
                        break

    def owns(self, path: Path) -> bool:
        """Whether ``path`` is part of the output (DST, the partial directory and what is in it,
        the lock, the parents of DST), not of the source."""
        path = Path(os.path.realpath(path))
        return (path in (self.path, self.partial, self.lock_path) or self.partial in path.parents
                or path in self.path.parents)


# ------------------------------------------------------------------ signals

class Interrupts:
    """While active (``with Interrupts() as i:``), SIGINT, SIGTERM and SIGHUP raise
    ``ConvertInterrupted`` so that the caller's cleanup runs; after ``i.defer()`` (the commit)
    a signal is held and raised as ``ConvertInterrupted(written=True)`` on exit. Only in the main
    thread, and only for signals whose handler is the default one (``nohup``'s ignored SIGHUP
    stays ignored, an application's own handler stays in charge). The previous handlers are
    restored on exit."""

    def __init__(self):
        self.previous: dict[int, object] = {}
        self.deferred = self.raised = False
        self.pending: int | None = None

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):
            sig = getattr(signal, name, None)
            if sig is None:
                continue
            current = signal.getsignal(sig)
            if current is (signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL):
                self.previous[sig] = current
                signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.deferred:
            self.pending = self.pending or signum
            return
        if self.raised:  # a second signal while the first one's cleanup runs
            return
        self.raised = True
        raise ConvertInterrupted(signum)

    def defer(self) -> None:
        self.deferred = True

    def __exit__(self, exc_type, exc, tb) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self.pending is not None and exc_type is None:
            raise ConvertInterrupted(self.pending, written=True)
