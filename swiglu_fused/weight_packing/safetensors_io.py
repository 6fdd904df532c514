"""Reading and writing safetensors checkpoints, with errors a person can act on.

The safetensors library rejects a corrupt file with a terse message; we check the header
ourselves first (length, JSON, dtypes, shapes, offsets against the file size) so the error names
the file, the tensor and what is wrong. Data is then read with the library itself.

Layout of a file: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the data section; offsets are relative to the data section.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open

from .. import formats

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit


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


def read_header(path: str | Path) -> Header:
    """Parse and check a safetensors header against the file; raise CheckpointError on any flaw."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated: {size} bytes, too short to hold a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise CheckpointError(
                f"{path}: corrupt or truncated: header length {n} runs past the end of the {size}-byte file")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt header: not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt header: expected a JSON object")
    metadata = header.pop("__metadata__", None)
    data_size = size - 8 - n
    entries = {name: _entry(path, name, info, data_size) for name, info in header.items()}
    return Header(path, entries, metadata)


def _entry(path: Path, name: str, info, data_size: int) -> Entry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise CheckpointError(f"{where}: header entry lacks dtype, shape or data_offsets")
    if info["dtype"] not in DTYPES:
        raise CheckpointError(f"{where}: unsupported dtype {info['dtype']!r}")
    shape = info["shape"]
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: invalid shape {shape!r}")
    offsets = info["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise CheckpointError(f"{where}: invalid data_offsets {offsets!r}")
    begin, end = offsets
    if end > data_size:
        raise CheckpointError(
            f"{where}: data_offsets [{begin}, {end}] run past the data section ({data_size} bytes): "
            "the file is truncated or corrupt")
    dtype = DTYPES[info["dtype"]]
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected:
        raise CheckpointError(
            f"{where}: dtype {info['dtype']} and shape {shape} need {expected} bytes but data_offsets "
            f"span {end - begin}")
    return Entry(dtype, tuple(shape), begin, end)


def load_file(path: str | Path, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Checked read of a whole file (or of ``names``) into CPU tensors."""
    header = read_header(path)
    names = list(header.entries) if names is None else names
    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in names:
            out[name] = f.get_tensor(name)
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


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a Hugging Face / diffusers directory, in index order."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    index = index_file(directory)
    if index is not None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e!r})") from None
        files = list(dict.fromkeys(sorted(weight_map.values())))
        missing = [f for f in files if not (directory / f).is_file()]
        if missing:
            raise CheckpointError(f"{index}: lists shard(s) that do not exist: {', '.join(missing)}")
        return [directory / f for f in files]
    for name in SINGLE_NAMES:
        if (directory / name).is_file():
            return [directory / name]
    found = sorted(directory.glob("*.safetensors"))
    if not found:
        raise CheckpointError(
            f"{directory}: no safetensors files (expected {formats.SINGLE_FILE} or {formats.INDEX_FILE}); "
            "convert .bin checkpoints with `save_pretrained(..., safe_serialization=True)` first")
    return found
