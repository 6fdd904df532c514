"""Convert a Hugging Face / diffusers checkpoint directory into a packed one.

Streaming: source shards are read one at a time and each becomes one output shard with the same
file name; a gate (or up) whose partner lives in a later shard waits in memory until it arrives.
Atomic: everything is written into a hidden sibling directory that is renamed to DST only when
complete, so a failure leaves nothing behind. Deterministic: the same input gives the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
from tqdm.auto import tqdm

from .. import formats
from ..formats import FormatError
from . import adapters, pack
from . import safetensors_io as sio
from .source import SOURCE_FORMATS, declared_source_format, read_config


@dataclass
class ConvertReport:
    dst: Path
    weight_format: str
    interleave: int
    activation: str
    adapter: str
    source_format: str
    modules: list[str] = field(default_factory=list)
    repacked: int = 0  # projections whose bytes were moved unchanged
    quantized: int = 0  # projections converted through fp32
    dropped: list[str] = field(default_factory=list)
    src_bytes: int = 0
    dst_bytes: int = 0

    def __str__(self) -> str:  # print(report) reads like the CLI
        return self.summary()

    def summary(self) -> str:
        return (f"wrote {self.dst} ({self.weight_format}, g={self.interleave}, act={self.activation}, "
                f"adapter={self.adapter}): {len(self.modules)} MLPs, {self.repacked} projections repacked "
                f"bit-exactly, {self.quantized} {'converted to bf16' if self.weight_format == 'bf16' else 'quantized'}; "
                f"{self.src_bytes / 2**20:.1f} MiB → "
                f"{self.dst_bytes / 2**20:.1f} MiB")


@dataclass
class _Plan:
    config: dict
    adapter: adapters.Adapter
    activation: str
    source_format: str
    files: list[Path]
    headers: list[sio.Header]
    mlps: list[adapters.MLPSource]
    owner: dict[str, adapters.MLPSource]  # source projection prefix → its MLP
    members: dict[str, set[str]]  # source projection prefix → all its tensor names, over all shards


def _plan(src: Path, weight_format: str, g: int, source_format: str) -> _Plan:
    """Read and check everything that can be checked before a byte is written."""
    if source_format not in SOURCE_FORMATS:
        raise FormatError(f"source_format: {source_format!r} is not one of {list(SOURCE_FORMATS)}")
    fmt = formats.weight_format(weight_format)
    config = read_config(src)
    adapter = adapters.for_config(config, str(src / formats.CONFIG_FILE))
    declared = declared_source_format(config, src)
    if source_format != "auto" and source_format != declared:
        raise FormatError(f"--source-format {source_format} but {src / formats.CONFIG_FILE} describes a "
                          f"{declared} checkpoint; pass --source-format auto")
    files = sio.checkpoint_files(src)
    headers = [sio.read_header(f) for f in files]
    names = [n for h in headers for n in h.entries]
    mlps = adapter.find_mlps(names)
    if not mlps:
        raise FormatError(f"{src}: no {adapter.name} MLP tensors found (looked for "
                          f"{adapter.mlp_pattern}.{{{', '.join(c for c in (adapter.gate, adapter.up, adapter.fused, adapter.down) if c)}}})")
    meta = {n: e for h in headers for n, e in h.entries.items()}
    for mlp in mlps:
        _check_mlp_shapes(mlp, meta, fmt, g)
    owner = {p: mlp for mlp in mlps for p in mlp.projections}
    members: dict[str, set[str]] = {}
    for n in names:
        proj = n.rsplit(".", 1)[0]
        if proj in owner:
            members.setdefault(proj, set()).add(n)
    return _Plan(config, adapter, adapter.activation(config), declared, files, headers, mlps, owner, members)


def _rows_cols(meta: Mapping[str, sio.Entry], proj: str) -> tuple[int, int] | None:
    if f"{proj}.weight_packed" in meta:
        r, c = meta[f"{proj}.weight_packed"].shape
        return r, 2 * c
    e = meta.get(f"{proj}.weight")
    if e is None:
        return None
    return (e.shape[0], 2 * e.shape[1]) if e.dtype == torch.uint8 else tuple(e.shape)


def _check_mlp_shapes(mlp: adapters.MLPSource, meta, fmt: formats.WeightFormat, g: int) -> None:
    for proj in mlp.projections:
        if _rows_cols(meta, proj) is None:
            raise FormatError(f"{proj}.weight: missing from the checkpoint (MLP {mlp.module} needs "
                              f"{', '.join(mlp.projections)})")
    if mlp.fused:
        rows, hidden = _rows_cols(meta, mlp.fused)
        inter = rows // 2
    else:
        gate, up = _rows_cols(meta, mlp.gate), _rows_cols(meta, mlp.up)
        if gate != up:
            raise FormatError(f"{mlp.gate} is {list(gate)} but {mlp.up} is {list(up)}; gate and up must match")
        inter, hidden = gate
    down = _rows_cols(meta, mlp.down)
    if down != (hidden, inter):
        raise FormatError(f"{mlp.down} is {list(down)}; expected [{hidden}, {inter}] from its gate/up projections")
    if fmt.name == "nvfp4" and hidden % 2:
        raise FormatError(f"{mlp.module}: hidden size {hidden} is odd; nvfp4 packs two values per byte")
    formats.check_interleave(inter, g, fmt, mlp.module)


def _target_kind(weight_format: str, source_format: str, headers: list[sio.Header]) -> str | None:
    if weight_format != "nvfp4":
        return None
    modelopt = any(n.endswith(".weight_scale_2") for h in headers for n in h.entries)
    return "multiplier" if source_format == "nvfp4" and modelopt else "divisor"


class _Packer:
    """Turns the tensors of one source shard into those of its output shard."""

    def __init__(self, plan: _Plan, weight_format: str, g: int, kind: str | None, report: ConvertReport):
        self.plan, self.fmt, self.g, self.kind, self.report = plan, weight_format, g, kind, report
        self.by_module = {m.module: m for m in plan.mlps}
        self.waiting: dict[str, dict[str, torch.Tensor]] = {}  # MLP module → source tensors not yet packed
        self.done: dict[str, set[str]] = {}  # MLP module → packed projections ("gate_up_proj", "down_proj")

    def shard(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        touched = set()
        for name, t in tensors.items():
            mlp = self.plan.owner.get(name.rsplit(".", 1)[0])
            if mlp is None:
                out[name] = t
                continue
            self.waiting.setdefault(mlp.module, {})[name] = t
            touched.add(mlp.module)
        for module in sorted(touched):
            out.update(self._emit_ready(self.by_module[module]))
        return out

    def _emit_ready(self, mlp: adapters.MLPSource) -> dict[str, torch.Tensor]:
        """Pack whichever of the MLP's two projections has all its source tensors by now."""
        have = self.waiting[mlp.module]
        done = self.done.setdefault(mlp.module, set())
        halves = [mlp.fused] if mlp.fused else [mlp.gate, mlp.up]
        out = {}
        if formats.DOWN not in done and self._present(have, [mlp.down]):
            down = pack.read_projection(have.get, mlp.down)
            proj, kept = pack.to_format(down, self.fmt, self.kind)
            out.update(self._named(mlp.module, formats.DOWN, proj.tensors))
            self._count(kept, down)
            self._forget(have, [mlp.down])
            done.add(formats.DOWN)
        if formats.GATE_UP not in done and self._present(have, halves):
            if mlp.fused:
                gate, up = pack.split_fused(pack.read_projection(have.get, mlp.fused))
            else:
                gate, up = pack.read_projection(have.get, mlp.gate), pack.read_projection(have.get, mlp.up)
            g_out, g_kept = pack.to_format(gate, self.fmt, self.kind)
            u_out, u_kept = pack.to_format(up, self.fmt, self.kind)
            out.update(self._named(mlp.module, formats.GATE_UP, pack.pack_gate_up(g_out, u_out, self.g)))
            self._count(g_kept and u_kept, gate, up)
            self._forget(have, halves)
            done.add(formats.GATE_UP)
        if len(done) == 2:
            del self.waiting[mlp.module]
            self.report.modules.append(mlp.module)
        return out

    def _present(self, have: Mapping[str, torch.Tensor], projections: list[str]) -> bool:
        """Whether every tensor of these projections has arrived (a weight and its scales may
        sit in different shards)."""
        return all(self.plan.members[p] <= have.keys() for p in projections)

    @staticmethod
    def _forget(have: dict[str, torch.Tensor], projections: list[str]) -> None:
        for n in [n for n in have if n.rsplit(".", 1)[0] in projections]:
            del have[n]

    def _count(self, kept: bool, *projs: pack.Projection) -> None:
        if kept:
            self.report.repacked += len(projs)
        else:
            self.report.quantized += len(projs)
        for p in projs:
            self.report.dropped += p.dropped

    @staticmethod
    def _named(module: str, proj: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {f"{module}.{proj}.{suffix}": t for suffix, t in tensors.items()}


def convert(
    src: str | Path,
    dst: str | Path,
    *,
    weight_format: str = "fp8_block128",
    interleave: int = formats.DEFAULT_INTERLEAVE,
    source_format: str = "auto",
    force: bool = False,
    progress: bool = True,
) -> ConvertReport:
    """Convert the checkpoint in ``src`` into a packed checkpoint in ``dst`` (see module docstring)."""
    src, dst = Path(src), Path(dst)
    if dst.resolve() == src.resolve():
        raise FormatError(f"dst {dst} is the source directory; choose another output directory")
    if dst.exists() and not force:
        raise FileExistsError(f"{dst} already exists; pass force=True (--force) to replace it")
    plan = _plan(src, weight_format, interleave, source_format)
    if src.resolve() in dst.resolve().parents:  # its partial directory would be copied into itself
        raise FormatError(f"dst {dst} is inside the source directory {src}; choose an output directory outside it")
    kind = _target_kind(weight_format, plan.source_format, plan.headers)
    cfg = formats.PackedConfig(
        weight_format=weight_format, interleave=interleave, activation=plan.activation,
        modules=tuple(m.module for m in plan.mlps), global_scale_kind=kind,
        source={"format": plan.source_format, "adapter": plan.adapter.name,
                **({"quantization_config": plan.config["quantization_config"]}
                   if "quantization_config" in plan.config else {})})
    report = ConvertReport(dst, weight_format, interleave, plan.activation, plan.adapter.name, plan.source_format,
                           src_bytes=sum(h.data_bytes for h in plan.headers))
    _write_atomically(src, dst, plan, cfg, kind, report, progress)
    report.dst_bytes = sum(sio.read_header(f).data_bytes for f in sio.checkpoint_files(dst))
    return report


def _write_atomically(src: Path, dst: Path, plan: _Plan, cfg: formats.PackedConfig, kind, report,
                      progress: bool) -> None:
    """Write into a hidden sibling of DST and rename it into place; on any failure remove it and
    the parent directories made for it, and name DST (not the sibling) in write errors."""
    tmp = dst.parent / f".{dst.name}.partial-{uuid.uuid4().hex[:8]}"
    new_parents = [p for p in tmp.parents if not p.exists()]  # made here, removed again on failure
    try:
        tmp.mkdir(parents=True)
        _write(src, tmp, plan, cfg, kind, report, progress)
        _commit(tmp, dst)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        for p in new_parents:  # nearest first; stops at the first that is not empty
            try:
                p.rmdir()
            except OSError:
                break
        if isinstance(e, OSError) and _is_output_path(e.filename, tmp, dst):
            raise OutputError(e.errno, f"cannot write {dst}: {e.strerror} (nothing was left behind; "
                                       f"choose a writable directory with enough free space)") from e
        raise


def _is_output_path(filename, tmp: Path, dst: Path) -> bool:
    """Whether an OSError's file is the output's (the partial directory, its files, the parents
    made for it, DST) rather than a source file's."""
    if filename is None:
        return False
    path, tmp = Path(os.fsdecode(filename)).resolve(), tmp.resolve()
    return path in (tmp, dst.resolve()) or tmp in path.parents or path in tmp.parents


class OutputError(OSError):
    """Writing the packed checkpoint failed (permissions, disk space): names DST, not the hidden
    partial directory the error happened in."""

    def __str__(self) -> str:
        return self.strerror


def _write(src: Path, tmp: Path, plan: _Plan, cfg: formats.PackedConfig, kind, report, progress: bool) -> None:
    packer = _Packer(plan, cfg.weight_format, cfg.interleave, kind, report)
    weight_map: dict[str, str] = {}
    metadata = cfg.file_metadata()
    bar = tqdm(total=report.src_bytes, unit="B", unit_scale=True, desc="convert", disable=not progress)
    with bar:
        for path, header in zip(plan.files, plan.headers):
            out = packer.shard(sio.load_file(path))
            if out:  # a shard holding only halves that wait for their partner becomes nothing
                sio.write_file(out, tmp / path.name, metadata)
                weight_map.update({n: path.name for n in out})
            bar.update(header.data_bytes)
    if packer.waiting:
        missing = ", ".join(sorted(packer.waiting))
        raise FormatError(f"{src}: incomplete MLPs (gate, up or down never appeared): {missing}")
    report.dropped.sort()
    _write_side_files(src, tmp, plan, cfg, weight_map)


def _write_side_files(src: Path, tmp: Path, plan: _Plan, cfg: formats.PackedConfig, weight_map: dict) -> None:
    config = dict(plan.config)
    config["quantization_config"] = cfg.to_dict()
    (tmp / formats.CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    index = sio.index_file(src)
    if index is not None:
        total = sum(sio.read_header(tmp / f).data_bytes for f in sorted(set(weight_map.values())))
        body = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / index.name).write_text(json.dumps(body, indent=2) + "\n")
    skip = {formats.CONFIG_FILE, "hf_quant_config.json"} | {p.name for p in plan.files}
    if index is not None:
        skip.add(index.name)
    for item in sorted(src.iterdir()):
        if item.name in skip or item.name.startswith("."):
            continue
        if item.is_dir():
            shutil.copytree(item, tmp / item.name)
        else:
            shutil.copyfile(item, tmp / item.name)


def _commit(tmp: Path, dst: Path) -> None:
    """Move the finished directory into place; an existing dst (force) is removed only after."""
    if dst.exists():
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(dst, old)
        os.rename(tmp, dst)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:  # --force over a file (or a link): rmtree would leave it
            old.unlink(missing_ok=True)
    else:
        os.rename(tmp, dst)
