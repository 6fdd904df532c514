"""Compiled-kernel cache, keyed by (kernel family, frozen config): in-process, then on disk.

In-process: a dict, so each (kernel, config) compiles once per process (0.4–0.8 s per gate_up
config, 0.1–0.2 s for quant_x on a 2-core CPU, plus the DSL's own start-up).

On disk (DESIGN §5, "a second start compiles nothing"): each compiled kernel is exported with
CuTe DSL's AOT object-file export (``JitCompiledFunction.dump_to_object(prefix)``: an ELF object
holding the host launch function, the sm_90a cubin and the argument-signature metadata) and
loaded back in a later process with ``cutlass.cute.runtime.load_module(path)[prefix]``, which
links the object in memory (LLVM JITLink, a few ms) and returns a callable taking the same
arguments — no tracing, no MLIR passes, no ptxas.

Why CuTe DSL's own file cache (``CUTE_DSL_CACHE_DIR``) never helped: ``cute.compile`` forces
``no_cache=True`` and ``compile_only=True`` (``cutlass/base_dsl/compiler.py``,
``CompileCallable._compile``), so explicitly compiled functions are neither looked up in nor
written to it; it only serves the implicit call-a-``@cute.jit``-function path. Even there it is
keyed by a hash of the freshly *traced* MLIR module, so every process still pays the Python
tracing before a hit, and it stores MLIR bytecode, not a loadable binary.

Layout: ``$SWIGLU_FUSED_CACHE_DIR`` (default ``~/.cache/swiglu_fused``) / ``kernels`` /
``<family>-<sha256 of the key>.o``. The key is (family, repr of the frozen config, DSL version,
CUDA version of the DSL build, GPU arch + compile options, host machine, a hash of every source
file of this package directory), so an edited kernel never loads a stale binary. Each entry is
``MAGIC + sha256(payload) + payload``, written to a temp file and renamed into place; an entry
that is unreadable, fails its checksum or fails to load is ignored with a warning and rebuilt
(and overwritten). ``SWIGLU_FUSED_DISK_CACHE=0`` turns the disk layer off.

Permissions: an entry is native code linked into the process, so whoever can write the cache can
run code as its user. Directories this module creates are 0700 and entries 0600 (whatever the
umask). Before loading or writing, the cache root, ``kernels`` and the entry must be owned by the
current user and not writable by group or others (a plain file for the entry); if not, the disk
layer is skipped with one warning per directory: kernels are compiled in-process and nothing is
written there. A cache meant to be shared between users is therefore not supported.

Measured (benchmarks/startup_compile.py, H100, two fresh processes): the first quant_x + gate_up
call took 6.28 s compiling both kernels and 4.92 s loading them from disk (0 compilations, output
checked against the reference). On a 2-core CPU the two kernels take 0.8 s to compile and 0.01 s
to load. So the disk layer removes the compile cost; what is left of the first call on the GPU
(≈ 4.9 s) is not compilation (the benchmark now prints the import / load / first-launch split).

All kernels take raw device pointers and Int32 sizes (no DLPack round trip per call), so one
compilation serves every M, K and I a config supports.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import stat
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Hashable

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import make_ptr

GPU_ARCH = "sm_90a"
COMPILE_OPTIONS = f"--gpu-arch {GPU_ARCH}"

MAGIC = b"SWIGLU_FUSED_KERNEL_V1\n"
_SOURCE_DIR = Path(__file__).resolve().parent

_lock = threading.Lock()
_compiled: dict[tuple[str, Hashable], Any] = {}
_modules: list[Any] = []  # loaded ExternalBinaryModules (kept alive with their functions)
_source_hash: str | None = None
_runtime_preloaded = False

_unsafe_warned: set[str] = set()  # cache directories already warned about (once each)

# what this process did, for tests and benchmarks
stats = {"built": 0, "disk_loads": 0, "disk_writes": 0, "disk_errors": 0, "disk_unsafe": 0}


def fake_ptr(dtype: type[cutlass.Numeric], align: int = 16):
    """A null device pointer: enough to compile (compilation never dereferences it)."""
    return make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=align)


def ptr(dtype: type[cutlass.Numeric], tensor, align: int = 16):
    return make_ptr(dtype, tensor.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)


def null_stream() -> cuda.CUstream:
    return cuda.CUstream(0)


# ---------------------------------------------------------------- disk layer
def cache_dir() -> Path | None:
    """The on-disk cache directory, or None when the disk layer is off."""
    if os.environ.get("SWIGLU_FUSED_DISK_CACHE", "1").strip().lower() in ("0", "false", "off", "no"):
        return None
    root = os.environ.get("SWIGLU_FUSED_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "swiglu_fused"
    )
    return Path(root) / "kernels"


def source_hash() -> str:
    """sha256 over every ``*.py`` of the kernel directory (names and contents), once per process."""
    global _source_hash
    if _source_hash is None:
        h = hashlib.sha256()
        for p in sorted(_SOURCE_DIR.glob("*.py")):
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
        _source_hash = h.hexdigest()
    return _source_hash


def entry_key(family: str, config: Hashable) -> str:
    parts = (
        family,
        repr(config),
        f"cutlass-dsl={cutlass.__version__}",
        f"cuda={getattr(cutlass, 'CUDA_VERSION', '?')}",
        COMPILE_OPTIONS,
        platform.machine(),
        source_hash(),
    )
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def entry_path(family: str, config: Hashable) -> Path | None:
    d = cache_dir()
    return None if d is None else d / f"{family}-{entry_key(family, config)}.o"


def _prefix(family: str, config: Hashable) -> str:
    # the object file's symbol prefix: a C identifier, unique per entry
    return f"swiglu_fused_{family}_{entry_key(family, config)[:16]}"


def _preload_runtime() -> None:
    """Export links the host object in an LLVM JIT session that resolves the runtime's
    ``_cuda*`` symbols from the process: make libcute_dsl_runtime globally visible first
    (without it dump_to_object fails with "Symbols not found: _cudaLaunchKernelEx ...")."""
    global _runtime_preloaded
    if not _runtime_preloaded:
        from cutlass.cute.runtime import find_runtime_libraries

        for lib in find_runtime_libraries(enable_tvm_ffi=False):
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        _runtime_preloaded = True


def _warn(msg: str) -> None:
    stats["disk_errors"] += 1
    warnings.warn(f"swiglu_fused compile cache: {msg}", RuntimeWarning, stacklevel=3)


def _unsafe(path: Path, entry: bool) -> str | None:
    """Why ``path`` (an existing cache directory, or an ``entry``) is not safe to load code from or
    write to, or None: it must be owned by this user and not writable by group or others."""
    st = os.lstat(path) if entry else os.stat(path)  # an entry must not be a symlink to elsewhere
    kind = "entry" if entry else "directory"
    if not (stat.S_ISREG(st.st_mode) if entry else stat.S_ISDIR(st.st_mode)):
        return f"{kind} {path} is not a {'regular file' if entry else 'directory'}"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{kind} {path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & 0o022:
        who = {0o022: "group and others", 0o020: "group", 0o002: "others"}[st.st_mode & 0o022]
        return f"{kind} {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _safe_chain(path: Path) -> bool:
    """The cache root, ``kernels`` and the entry ``path`` (those that exist) are safe; else warn once
    per directory and return False: load nothing from there, write nothing there."""
    d = path.parent
    for p, entry in ((d.parent, False), (d, False), (path, True)):
        try:
            why = _unsafe(p, entry) if os.path.lexists(p) else None
        except OSError as e:
            why = f"cannot stat {p} ({e.strerror})"
        if why is not None:
            stats["disk_unsafe"] += 1
            if str(d) not in _unsafe_warned:
                _unsafe_warned.add(str(d))
                fix = f"delete {p}" if entry else f"make {p} yours and `chmod go-w {p}`"
                warnings.warn(
                    f"swiglu_fused compile cache: not using {d}: {why}, so another user could replace the "
                    f"native code this process would load. Compiling in-process instead, writing nothing there; "
                    f"fix: {fix}, or set SWIGLU_FUSED_CACHE_DIR to a private directory", RuntimeWarning, stacklevel=4)
            return False
    return True


def _make_private_dirs(d: Path) -> None:
    """Create ``d`` and its missing parents with mode 0700, whatever the umask (existing ones are
    left as they are: _safe_chain judges them)."""
    missing = []
    while not os.path.lexists(d):
        missing.append(d)
        d = d.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:  # made meanwhile by another process: judged like any other
            continue
        os.chmod(p, 0o700)


def _load(family: str, config: Hashable) -> Any | None:
    path = entry_path(family, config)
    if path is None or not path.exists() or not _safe_chain(path):
        return None
    try:
        blob = path.read_bytes()
        head = len(MAGIC) + 32
        if len(blob) <= head or not blob.startswith(MAGIC):
            raise ValueError("bad header")
        payload = blob[head:]
        if hashlib.sha256(payload).digest() != blob[len(MAGIC) : head]:
            raise ValueError("checksum mismatch")
        from cutlass.cute.runtime import load_module

        _preload_runtime()
        # load_module reads a path: hand it the verified payload (in the system temp dir, so a
        # read-only cache directory still works), not the entry that may be replaced meanwhile
        fd, tmp = tempfile.mkstemp(prefix="swiglu_fused_", suffix=".o")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            module = load_module(tmp)
        finally:
            os.unlink(tmp)
        fn = module[_prefix(family, config)]
    except Exception as e:  # unreadable, corrupt, or from an incompatible build: rebuild
        _warn(f"ignoring unusable entry {path} ({type(e).__name__}: {e}); recompiling")
        return None
    _modules.append(module)
    stats["disk_loads"] += 1
    return fn


def _store(family: str, config: Hashable, fn: Any) -> None:
    path = entry_path(family, config)
    if path is None or not hasattr(fn, "dump_to_object"):
        return
    try:
        _preload_runtime()
        if not _safe_chain(path):  # what exists of the chain
            return
        payload = fn.dump_to_object(_prefix(family, config))
        _make_private_dirs(path.parent)
        if not _safe_chain(path):  # and what another process may have made meanwhile
            return
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o600)  # native code: this user's only (mkstemp's 0600, exactly, whatever the umask)
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, path)  # atomic: readers see the old entry, none, or the whole new one
        except BaseException:
            os.unlink(tmp)
            raise
    except Exception as e:  # a read-only or full disk must not break the kernel call
        _warn(f"could not write {path} ({type(e).__name__}: {e})")
        return
    stats["disk_writes"] += 1


class CompileError(RuntimeError):
    """A kernel configuration failed to compile; the message names the family and the config."""


def _build(family: str, config: Hashable, build: Callable[[], Any]) -> Any:
    try:
        return build()
    except Exception as e:
        raise CompileError(f"compiling the {family} kernel for {config!r} failed: {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------- public
def get(family: str, config: Hashable, build: Callable[[], Any]) -> Any:
    """The compiled kernel for (family, config): from this process's dict, else from the disk
    cache, else ``build()`` (then written to disk)."""
    key = (family, config)
    fn = _compiled.get(key)
    if fn is None:
        with _lock:
            fn = _compiled.get(key)
            if fn is None:
                fn = _load(family, config)
                if fn is None:
                    fn = _build(family, config, build)
                    stats["built"] += 1
                    _store(family, config, fn)
                _compiled[key] = fn
    return fn


def clear() -> None:
    """Forget this process's compiled kernels (the disk cache is kept)."""
    with _lock:
        _compiled.clear()
