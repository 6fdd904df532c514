"""Reading and writing safetensors checkpoints, with errors a person can act on.

The safetensors library rejects a corrupt file with a terse message (and accepts a tensor defined
twice); we check the header ourselves first (length, UTF-8 JSON without duplicate keys, dtypes,
shapes, offsets, and that the tensors' byte ranges tile the data section exactly) so the error
names the file, the tensor and what is wrong. Data is then read with the library itself; anything
it still raises becomes a CheckpointError naming the file. The directory helpers read only the
files a checkpoint names, and never follow a symbolic link out of its directory.

Layout of a file: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the data section; offsets are relative to the data section.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from safetensors import SafetensorError, safe_open

from .. import formats

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit
MAX_ELEMENTS = 2**63 - 1  # torch sizes are int64: a larger shape cannot be built even when empty


class CheckpointError(ValueError):
    """A checkpoint file or directory that cannot be read; the message names the file."""


@dataclass(frozen=True)
class Entry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    path: Path
    entries: dict[str, Entry]
    metadata: dict[str, str] | None

    def meta_tensors(self) -> dict[str, torch.Tensor]:
        return {n: torch.empty(e.shape, dtype=e.dtype, device="meta") for n, e in self.entries.items()}

    @property
    def data_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())


class _DuplicateKey(Exception):
    pass


def _refuse_duplicates(pairs: list) -> dict:
    """json.loads keeps the last of two equal keys silently (the safetensors library too), so a
    tensor defined twice would read as whichever came last."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")  # Python's json accepts NaN and Infinity; JSON does not


def _lone_surrogate(value) -> str | None:
    """A string of the parsed header that is not valid Unicode (JSON allows an escaped lone
    surrogate such as \\udc80; the safetensors library does not), or None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return v
    return None


def read_header(path: str | Path) -> Header:
    """Parse and check a safetensors header against the file; raise CheckpointError on any flaw.

    Everything the safetensors library would refuse is refused here first, with the file, the
    tensor and the fix named: the header (length, UTF-8, JSON, no duplicate keys), each entry
    (dtype, shape, offsets against the data section), and the layout (the tensors' byte ranges
    tile the data section exactly: no overlap, no gap, no trailing bytes).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found" if not path.exists() else
                              f"{path}: not a regular file (a safetensors file was expected)")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated: {size} bytes, too short to hold a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise CheckpointError(
                f"{path}: corrupt or truncated: header length {n} runs past the end of the {size}-byte file"
                if 8 + n > size else
                f"{path}: corrupt header: header length {n} exceeds the {MAX_HEADER}-byte limit of safetensors")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_refuse_duplicates,
                            parse_constant=_refuse_constant)
    except _DuplicateKey as e:
        raise CheckpointError(f"{path}: corrupt header: key {e.args[0]!r:.200} appears twice (a tensor or field "
                              "defined twice; readers would silently keep one of them)") from None
    except RecursionError:
        raise CheckpointError(f"{path}: corrupt header: JSON nested too deeply to be a safetensors header") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, NaN, integers too long to convert
        raise CheckpointError(f"{path}: corrupt header: not valid JSON ({str(e):.200})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt header: expected a JSON object, found {type(header).__name__}")
    bad = _lone_surrogate(header)
    if bad is not None:
        raise CheckpointError(f"{path}: corrupt header: the string {bad!r:.200} holds a lone UTF-16 surrogate "
                              "escape (\\udXXX), which is not text; the safetensors library refuses it")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        found = (f"the value of {next(k for k, v in metadata.items() if not isinstance(v, str))!r:.100}"
                 if isinstance(metadata, dict) else type(metadata).__name__)
        raise CheckpointError(f"{path}: corrupt header: __metadata__ must map strings to strings; found {found}")
    data_size = size - 8 - n
    entries = {name: _entry(path, name, info, data_size) for name, info in header.items()}
    _check_layout(path, entries, data_size)
    return Header(path, entries, metadata)


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0  # JSON true/false are not sizes


def _entry(path: Path, name: str, info, data_size: int) -> Entry:
    where = f"{path}: tensor {name!r:.200}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise CheckpointError(f"{where}: header entry lacks dtype, shape or data_offsets")
    dtype_name = info["dtype"]
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise CheckpointError(f"{where}: unsupported dtype {dtype_name!r:.100}; expected one of {sorted(DTYPES)}")
    shape = info["shape"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CheckpointError(f"{where}: invalid shape {shape!r:.200}; expected a list of non-negative integers")
    if math.prod(max(d, 1) for d in shape) > MAX_ELEMENTS:
        raise CheckpointError(f"{where}: shape {shape!r:.200} is too large to address (more than 2^63 elements)")
    offsets = info["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets)
            or offsets[0] > offsets[1]):
        raise CheckpointError(f"{where}: invalid data_offsets {offsets!r:.200}; expected [begin, end] with "
                              "0 <= begin <= end")
    begin, end = offsets
    if end > data_size:
        raise CheckpointError(
            f"{where}: data_offsets [{begin}, {end}] run past the data section ({data_size} bytes): "
            "the file is truncated or corrupt")
    dtype = DTYPES[dtype_name]
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected:
        raise CheckpointError(
            f"{where}: dtype {dtype_name} and shape {shape} need {expected} bytes but data_offsets "
            f"span {end - begin}")
    return Entry(dtype, tuple(shape), begin, end)


def _check_layout(path: Path, entries: Mapping[str, Entry], data_size: int) -> None:
    """The tensors' byte ranges must tile the data section: every byte belongs to exactly one tensor."""
    at, prev = 0, None
    for name, e in sorted(entries.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if e.begin < at:
            raise CheckpointError(
                f"{path}: corrupt header: tensor {name!r:.200} (bytes [{e.begin}, {e.end})) overlaps tensor "
                f"{prev!r:.200} (which ends at {at}); each tensor needs its own bytes")
        if e.begin > at:
            after = f"after tensor {prev!r:.200}" if prev is not None else "at the start of the data section"
            raise CheckpointError(
                f"{path}: corrupt header: bytes [{at}, {e.begin}) {after} belong to no tensor (a gap before "
                f"tensor {name!r:.200}); the file is corrupt or was written by a broken tool")
        at, prev = e.end, name
    if at != data_size:
        raise CheckpointError(
            f"{path}: corrupt file: {data_size - at} trailing bytes after the last tensor (the header describes "
            f"{at} of the {data_size} data bytes); the file is corrupt or was appended to")


def load_file(path: str | Path, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Checked read of a whole file (or of ``names``) into CPU tensors."""
    header = read_header(path)
    names = list(header.entries) if names is None else names
    unknown = [n for n in names if n not in header.entries]
    if unknown:
        raise CheckpointError(f"{path}: no tensor {unknown[0]!r} in this file")
    out = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                out[name] = f.get_tensor(name)
    except (SafetensorError, RuntimeError, TypeError, ValueError) as e:  # what the header check did not foresee
        raise CheckpointError(f"{path}: the safetensors library cannot read it: {(str(e).splitlines() or [type(e).__name__])[0]:.300}") from None
    return out


def write_file(tensors: Mapping[str, torch.Tensor], path: str | Path, metadata: Mapping[str, str] | None) -> None:
    """Write CPU tensors as safetensors, byte-for-byte reproducibly.

    The safetensors library keeps ``__metadata__`` in a hash map whose order changes from process
    to process, so the same checkpoint would not give the same bytes twice; the format is simple
    enough to write here with sorted keys. Tensors are laid out widest dtype first (then by name)
    so every tensor stays aligned to its element size, as the library does.
    """
    names = sorted(tensors, key=lambda n: (-tensors[n].dtype.itemsize, n))
    header: dict = {"__metadata__": dict(sorted((metadata or {}).items()))} if metadata else {}
    offset = 0
    for n in names:
        t = tensors[n]
        nbytes = t.numel() * t.dtype.itemsize
        header[n] = {"dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for n in names:
            t = tensors[n].detach().cpu().contiguous()
            if t.numel():
                f.write(t.reshape(-1).view(torch.uint8).numpy().data)


# ---------------------------------------------------------------- directories
INDEX_NAMES = (formats.INDEX_FILE, "diffusion_pytorch_model.safetensors.index.json")
SINGLE_NAMES = (formats.SINGLE_FILE, "diffusion_pytorch_model.safetensors")


def index_file(directory: Path) -> Path | None:
    return next((directory / n for n in INDEX_NAMES if (directory / n).is_file()), None)


def hub_blobs(directory: Path) -> Path | None:
    """The blob store of a Hugging Face hub cache snapshot (``models--org--name/snapshots/<rev>``),
    whose files are all symbolic links into ``models--org--name/blobs``; None elsewhere."""
    directory = Path(os.path.abspath(directory))
    if directory.parent.name == "snapshots" and directory.parent.parent.name.startswith(("models--", "datasets--")):
        return directory.parent.parent / "blobs"
    return None


def link_problem(path: Path, directory: Path) -> str | None:
    """Why ``path`` (an entry of ``directory``) must not be read or copied as a file of that
    checkpoint, or None: a symbolic link is followed only to a regular file inside the directory
    (or, in a Hugging Face hub cache snapshot, inside its blob store)."""
    if not path.is_symlink():
        return None if path.is_file() or not path.exists() else "not a regular file"
    target = Path(os.path.realpath(path))
    if not target.exists():
        return f"a broken symbolic link (to {os.readlink(path)})"
    if not target.is_file():
        return f"a symbolic link to a directory or special file ({target})"
    real = Path(os.path.realpath(directory))
    allowed = [real] + [Path(os.path.realpath(b)) for b in (hub_blobs(directory), hub_blobs(real)) if b]
    if not any(a in target.parents for a in allowed):
        return f"a symbolic link to {target}, outside the checkpoint directory"
    return None


def _shard_name_problem(name) -> str | None:
    if not isinstance(name, str) or not name:
        return f"{name!r:.100} is not a file name"
    if name in (".", "..") or "/" in name or "\\" in name or "\0" in name or os.path.isabs(name):
        return f"{name!r:.200} is not a plain file name in this directory (paths such as ../x or /x are refused)"
    if not name.endswith(".safetensors"):
        return f"{name!r:.200} is not a .safetensors file"
    return None


def index_weight_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` of a safetensors index (tensor name → shard file name), checked: a JSON
    object of strings whose shard names are plain ``*.safetensors`` names in the index's directory."""
    try:
        body = json.loads(index.read_bytes().decode("utf-8"))
    except RecursionError:
        raise CheckpointError(f"{index}: not a valid safetensors index (JSON nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{index}: not a valid safetensors index: not valid JSON ({str(e):.200})") from None
    if not isinstance(body, dict) or "weight_map" not in body:
        raise CheckpointError(f"{index}: not a valid safetensors index: expected a JSON object with a "
                              f"\"weight_map\" field, found {type(body).__name__ if not isinstance(body, dict) else 'no weight_map'}")
    weight_map = body["weight_map"]
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: weight_map must be a JSON object (tensor name → shard file), found "
                              f"{type(weight_map).__name__}")
    if not weight_map:
        raise CheckpointError(f"{index}: weight_map is empty: the index names no tensors")
    for tensor, shard in weight_map.items():
        problem = _shard_name_problem(shard)
        if problem:
            raise CheckpointError(f"{index}: weight_map[{tensor!r:.200}]: {problem}")
    return weight_map


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a Hugging Face / diffusers directory, in index order.

    Only regular files of the directory itself: an index naming ``../x`` or ``/x``, or a shard that
    is a symbolic link out of the directory, is refused (a hub cache snapshot's links to its blob
    store are fine)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    index = index_file(directory)
    if index is not None:
        files = list(dict.fromkeys(sorted(index_weight_map(index).values())))
        missing = [f for f in files if not (directory / f).exists() and not (directory / f).is_symlink()]
        if missing:
            raise CheckpointError(f"{index}: lists shard(s) that do not exist: {', '.join(missing)}")
        found = [directory / f for f in files]
        where = f"{index}: lists shard"
    else:
        found = next(([directory / n] for n in SINGLE_NAMES if (directory / n).is_file()), None)
        if found is None:
            found = sorted(p for p in directory.glob("*.safetensors") if p.is_file() or p.is_symlink())
        if not found:
            raise CheckpointError(
                f"{directory}: no safetensors files (expected {formats.SINGLE_FILE} or {formats.INDEX_FILE}); "
                "convert .bin checkpoints with `save_pretrained(..., safe_serialization=True)` first")
        where = "checkpoint file"
    for f in found:
        problem = link_problem(f, directory)
        if problem:
            raise CheckpointError(f"{where} {f}: {problem}; copy the file itself into {directory}")
    return found
