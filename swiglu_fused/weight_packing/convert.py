"""Convert a Hugging Face / diffusers checkpoint directory into a packed one.

Streaming: source shards are read one at a time and each becomes one output shard; a gate (or
up) whose partner lives in a later shard waits in memory until it arrives. Output shards keep the
source's file names, except that sharded names are renumbered consecutively
(``model-00001-of-00003.safetensors`` …) when a source shard held only halves waiting for their
partner and so became no output shard. Deterministic: the same input gives the same bytes.

What a user can rely on (destination.py implements the file-system side):

- The source is never written, moved or deleted: a DST that is SRC, lies inside SRC or contains
  SRC is refused, however either is spelled (relative, ``..``, symlinks, bind mounts).
- DST appears only complete and verified: everything is written into a hidden sibling
  ``.DST.partial-*``, checked with ``verify`` (the same checks as ``swiglu-fused verify``), and
  then renamed to DST. The rename fails if anything appeared at DST meanwhile ("DST changed
  during conversion"); nothing of anyone else's is ever replaced.
- ``force`` replaces only a previous packed output or an empty directory, the very one that was
  there when the run started, swapped atomically, and says so (a warning on the
  ``swiglu_fused`` logger: "replaced the previous packed checkpoint at DST"). A file, a symlink
  or any other directory at DST is refused: the user removes it. So is a previous packed output
  that holds anything a conversion does not write (a user's notes, a folder): they are listed.
- One run at a time per DST: a lock file ``.DST.lock`` beside DST (``flock``, released by the
  kernel if the process dies; removed when the run ends). A second run is refused at once with
  the first one's pid and host.
- Failures and signals leave nothing behind (no partial directory, lock or parent directories
  made for DST). SIGINT, SIGTERM and SIGHUP (where their handlers are the default ones, in the
  main thread, restored afterwards) raise ``ConvertInterrupted`` after the same cleanup. A run
  killed outright (SIGKILL, power loss) leaves its partial directory with a marker file naming
  its pid and host; the next run on that DST removes it once that process is gone, and says so.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
from tqdm.auto import tqdm

from .. import formats
from ..formats import FormatError
from . import adapters, pack
from . import safetensors_io as sio
from .destination import ConvertInterrupted, Destination, DestinationError, Interrupts
from .source import SOURCE_FORMATS, declared_source_format, read_config, side_files
from .verify import verify

__all__ = ["ConvertInterrupted", "ConvertReport", "DestinationError", "OutputError", "convert"]


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
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (SRC entry, why it was not copied)
    linears: list[str] = field(default_factory=list)  # the source's quantized non-MLP linears, converted
    linears_repacked: int = 0  # of those, moved unchanged
    widened: dict[str, int] = field(default_factory=dict)  # repacked with scales widened exactly: source dtype → count
    splits: list[str] = field(default_factory=list)  # split projections packed (formats.SPLIT; their 3 parts counted above)

    def __str__(self) -> str:  # print(report) reads like the CLI
        return self.summary()

    def summary(self) -> str:
        return (f"wrote {self.dst} ({self.weight_format}, g={self.interleave}, act={self.activation}, "
                f"adapter={self.adapter}): {len(self.modules)} MLPs"
                + (f", {len(self.splits)} split projections (prefix + gate/up pairs)" if self.splits else "")
                + f", {self.repacked} projections repacked "
                f"bit-exactly, {self.quantized} {formats.weight_format(self.weight_format).requantized}; "
                f"{self.src_bytes / 2**20:.1f} MiB → "
                f"{self.dst_bytes / 2**20:.1f} MiB" + self._linears_line()
                + (f"\nrepacked: {pack.widened_note(self.widened)}" if self.widened else "") + self._left_out_line())

    def _linears_line(self) -> str:
        n = len(self.linears)
        if not n:
            return ""
        rest = n - self.linears_repacked
        how = (f"{self.linears_repacked} repacked bit-exactly" if not rest else
               f"{rest} dequantized to plain {self.weight_format} weights"
               if not formats.weight_format(self.weight_format).packs_linears else
               f"{rest} re-quantized from the source's {self.source_format} to {self.weight_format}"
               + (f", {self.linears_repacked} repacked bit-exactly" if self.linears_repacked else ""))
        return f"\n{n} quantized non-MLP linears of the source (attention, ...): {how}"

    def _left_out_line(self, shown: int = 5) -> str:
        if not self.left_out:
            return ""
        items = [f"{name} ({why})" for name, why in self.left_out[:shown]]
        more = f", and {len(self.left_out) - shown} more" if len(self.left_out) > shown else ""
        n = len(self.left_out)
        return f"\nleft out {n} {'file' if n == 1 else 'files'} of the source: {', '.join(items)}{more}"


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
    linears: dict[str, set[str]] = field(default_factory=dict)  # quantized non-MLP linear → its tensor names
    splits: dict[str, int] = field(default_factory=dict)  # split projection → its prefix rows


def _plan(src: Path, weight_format: str, g: int, source_format: str) -> _Plan:
    """Read and check everything that can be checked before a byte is written."""
    if source_format not in SOURCE_FORMATS:
        raise FormatError(f"source_format: {source_format!r} is not one of {list(SOURCE_FORMATS)}")
    fmt = formats.weight_format(weight_format)
    config = read_config(src)
    adapter = adapters.for_config(config, str(src / formats.CONFIG_FILE))
    declared = declared_source_format(config, src)
    if source_format != "auto" and source_format != declared:
        raise FormatError(f"source_format='{source_format}' but {src / formats.CONFIG_FILE} describes a "
                          f"{declared} checkpoint; pass source_format='auto'")
    files = sio.checkpoint_files(src)
    headers = [sio.read_header(f) for f in files]
    names = [n for h in headers for n in h.entries]
    mlps = adapter.find_mlps(names)
    if not mlps:
        raise FormatError(f"{src}: no {adapter.name} MLP tensors found (looked for "
                          f"{adapter.mlp_pattern}.{{{', '.join(c for c in (adapter.gate, adapter.up, adapter.fused, adapter.down) if c)}}})")
    meta = {n: e for h in headers for n, e in h.entries.items()}
    home = {n: h.path.name for h in headers for n in h.entries}  # (errors name the shard to look in)
    for mlp in mlps:
        _check_mlp_shapes(mlp, meta, home, fmt, g)
    find_splits = getattr(adapter, "find_splits", None)  # families with split projections (adapters/flux2.py)
    splits = find_splits(names, config) if find_splits else {}
    for proj, prefix_rows in splits.items():
        _check_split_shape(proj, prefix_rows, meta, home, fmt, g)
    owner = {p: mlp for mlp in mlps for p in mlp.projections}
    members: dict[str, set[str]] = {}
    for n in names:
        proj = n.rsplit(".", 1)[0]
        if proj in owner or proj in splits:
            members.setdefault(proj, set()).add(n)
    return _Plan(config, adapter, adapter.activation(config), declared, files, headers, mlps, owner, members,
                 _quantized_linears(headers, {**owner, **splits}), splits)


def _check_split_shape(proj: str, prefix_rows: int, meta, home: Mapping[str, str], fmt: formats.WeightFormat,
                       g: int) -> None:
    rows, cols = _rows_cols(meta, proj) or (None, None)
    if rows is None:
        raise FormatError(f"{proj}.weight: missing from the checkpoint")
    problem = formats.split_shape_problem(rows, prefix_rows, g, fmt) or fmt.size_problem("hidden size", cols)
    if problem:
        raise FormatError(f"{_in_shard(proj, home)} ([Q; K; V] of {prefix_rows} rows, then [gate; up]): {problem}")


def _quantized_linears(headers: list[sio.Header], mlp_projections: Mapping) -> dict[str, set[str]]:
    """Every projection outside the MLPs that the source stores quantized (a producer's layout,
    formats.SourceLayout, recognises it) → its tensor names; FormatError for a tensor of one that
    no layout explains (it would have no home in the packed checkpoint)."""
    meta = {n: t for h in headers for n, t in h.meta_tensors().items()}
    by_prefix: dict[str, set[str]] = {}
    for n in meta:
        by_prefix.setdefault(n.rsplit(".", 1)[0], set()).add(n)
    out = {}
    for proj in sorted(mlp_projections):  # read_projection reads only the tensors a layout names
        layout = formats.source_layout(lambda suffix: meta.get(f"{proj}.{suffix}"))
        known = {*layout.names.values(), *layout.dropped} if layout else {"weight", "bias"}  # (bias: refused later)
        strange = sorted(n for n in by_prefix.pop(proj, ()) if n.rsplit(".", 1)[1] not in known)
        if strange:
            raise FormatError(f"{strange[0]}: a tensor of the MLP projection {proj} that swiglu-fused does not "
                              f"know (it knows {', '.join(sorted(known))}), so the packed checkpoint would have "
                              "no place for it")
    for prefix, names in sorted(by_prefix.items()):
        layout = formats.source_layout(lambda suffix: meta.get(f"{prefix}.{suffix}"))
        if layout is None:
            continue
        known = {*layout.names.values(), *layout.dropped, "bias"}
        strange = sorted(n for n in names if n.rsplit(".", 1)[1] not in known)
        if strange:
            raise FormatError(f"{strange[0]}: a tensor of the {layout.producer} quantized linear {prefix} that "
                              f"swiglu-fused does not know (it knows {', '.join(sorted(known))}), so the packed "
                              "checkpoint would have no place for it")
        out[prefix] = names
    return out


def default_format(src: str | Path, source_format: str = "auto") -> str:
    """The packed format a conversion of ``src`` writes when none is asked for: the source's own
    (nvfp4 → nvfp4, fine-grained fp8 → fp8_block128, so bytes are moved), fp8_block128 for a dense one."""
    src = Path(src)
    declared = declared_source_format(read_config(src), src) if source_format == "auto" else source_format
    return declared if declared in formats.WEIGHT_FORMATS else "fp8_block128"


def _rows_cols(meta: Mapping[str, sio.Entry], proj: str) -> tuple[int, int] | None:
    if f"{proj}.weight_packed" in meta:
        r, c = meta[f"{proj}.weight_packed"].shape
        return r, 2 * c
    e = meta.get(f"{proj}.weight")
    if e is None:
        return None
    return (e.shape[0], 2 * e.shape[1]) if e.dtype == torch.uint8 else tuple(e.shape)


def _in_shard(proj: str, home: Mapping[str, str]) -> str:
    """``proj`` and the shard its weight is stored in, for an error about it."""
    shard = home.get(f"{proj}.weight") or home.get(f"{proj}.weight_packed")
    return f"{proj} (in {shard})" if shard else proj


def _check_mlp_shapes(mlp: adapters.MLPSource, meta, home: Mapping[str, str], fmt: formats.WeightFormat,
                      g: int) -> None:
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
            raise FormatError(f"{_in_shard(mlp.gate, home)} is {list(gate)} but {_in_shard(mlp.up, home)} is "
                              f"{list(up)}; gate and up must match")
        inter, hidden = gate
    down = _rows_cols(meta, mlp.down)
    if down != (hidden, inter):
        raise FormatError(f"{_in_shard(mlp.down, home)} is {list(down)}; expected [{hidden}, {inter}] from its "
                          "gate/up projections")
    problem = fmt.size_problem("hidden size", hidden)
    if problem:
        raise FormatError(f"{mlp.module}: {problem}")
    formats.check_interleave(inter, g, fmt, mlp.module)


def _target_kind(weight_format: str, source_format: str, headers: list[sio.Header]) -> str | None:
    """How the packed per-tensor scales are stored: as the source's producer stored them when the
    source is already in the target format (bit-exact repack), else as a divisor."""
    fmt = formats.weight_format(weight_format)
    if not fmt.global_scale_name:
        return None
    if source_format in formats.WEIGHT_FORMATS and formats.weight_format(source_format) is fmt:
        for layout in fmt.sources:
            if any(n.endswith(f".{layout.marker}") for h in headers for n in h.entries) \
                    and layout.global_scale_kind == formats.MULTIPLIER:
                return formats.MULTIPLIER
    return formats.DIVISOR


class _Packer:
    """Turns the tensors of one source shard into those of its output shard."""

    def __init__(self, plan: _Plan, weight_format: str, g: int, kind: str | None, report: ConvertReport):
        self.plan, self.fmt, self.g, self.kind, self.report = plan, weight_format, g, kind, report
        self.by_module = {m.module: m for m in plan.mlps}
        self.waiting: dict[str, dict[str, torch.Tensor]] = {}  # MLP module → source tensors not yet packed
        self.done: dict[str, set[str]] = {}  # MLP module → packed projections ("gate_up_interleaved", "down_proj")
        self.linear_waiting: dict[str, dict[str, torch.Tensor]] = {}  # quantized linear → source tensors so far
        self.split_waiting: dict[str, dict[str, torch.Tensor]] = {}  # split projection → source tensors so far

    def shard(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        touched = set()
        for name, t in tensors.items():
            prefix = name.rsplit(".", 1)[0]
            if prefix in self.plan.linears:
                have = self.linear_waiting.setdefault(prefix, {})
                have[name] = t
                if self.plan.linears[prefix] <= have.keys():
                    out.update(self._linear(prefix, self.linear_waiting.pop(prefix)))
                continue
            if prefix in self.plan.splits:
                have = self.split_waiting.setdefault(prefix, {})
                have[name] = t
                if self.plan.members[prefix] <= have.keys():
                    out.update(self._split(prefix, self.split_waiting.pop(prefix)))
                continue
            mlp = self.plan.owner.get(prefix)
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

    def _split(self, prefix: str, have: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A split projection: [prefix; gate; up] rows cut apart (bytes kept), each brought to the
        target format (moved when it is the source's), then packed (formats.SPLIT)."""
        parts = pack.split_prefix_pairs(pack.read_projection(have.get, prefix), self.plan.splits[prefix])
        converted = [pack.to_format(part, self.fmt, self.kind) for part in parts]
        self._count(all(kept for _, kept in converted), *parts)
        self.report.splits.append(prefix)
        return self._named(prefix, formats.SPLIT, pack.pack_split(*(proj for proj, _ in converted), self.g))

    def _linear(self, prefix: str, have: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A quantized non-MLP linear in the target format (bytes moved when it is the source's; a
        plain bf16 weight for target bf16), its bias as it was."""
        bias_name = f"{prefix}.bias"
        source = pack.read_projection(lambda n: None if n == bias_name else have.get(n), prefix)
        proj, kept = pack.to_format(source, self.fmt, self.kind)
        self.report.linears.append(prefix)
        self.report.linears_repacked += kept
        self.report.dropped += source.dropped
        self._count_widened(kept, source)
        out = {f"{prefix}.{suffix}": t for suffix, t in proj.tensors.items()}
        if bias_name in have:
            out[bias_name] = have[bias_name]
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
            self._count_widened(kept, p)

    def _count_widened(self, kept: bool, p: pack.Projection) -> None:
        for dtype in set(p.widened.values()) if kept else ():
            name = str(dtype).removeprefix("torch.")
            self.report.widened[name] = self.report.widened.get(name, 0) + 1

    @staticmethod
    def _named(module: str, proj: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {f"{module}.{proj}.{suffix}": t for suffix, t in tensors.items()}


def convert(
    src: str | Path,
    dst: str | Path,
    *,
    weight_format: str | None = None,
    interleave: int = formats.DEFAULT_INTERLEAVE,
    source_format: str = "auto",
    force: bool = False,
    progress: bool = True,
) -> ConvertReport:
    """Convert the checkpoint in ``src`` into a packed checkpoint in ``dst`` (see module docstring).

    ``weight_format`` None follows the source (``default_format``: nvfp4 → nvfp4, fine-grained fp8 →
    fp8_block128, dense → fp8_block128); another format than a quantized source's re-quantizes, and
    the report says so. Every projection the source quantized outside the MLPs (attention, ...) is
    stored in the packed format and listed in ``quantization_config.linears`` (for bf16: dequantized
    to a plain weight); what the source left unquantized is copied as it was.

    Raises FormatError / CheckpointError for a source or a request it cannot convert,
    FileExistsError (DestinationError) for a DST it may not write, OutputError when writing fails,
    TypeError for an argument of the wrong type, and ConvertInterrupted (a KeyboardInterrupt) on
    SIGINT, SIGTERM or SIGHUP; in every case nothing is left behind."""
    _check_types(src=src, dst=dst, weight_format=weight_format, interleave=interleave,
                 source_format=source_format, force=force, progress=progress)
    src, dst = Path(src), Path(dst)
    if weight_format is None:
        if source_format not in SOURCE_FORMATS:
            raise FormatError(f"source_format: {source_format!r} is not one of {list(SOURCE_FORMATS)}")
        weight_format = default_format(src, source_format)
    plan = _plan(src, weight_format, interleave, source_format)
    kind = _target_kind(weight_format, plan.source_format, plan.headers)
    cfg = formats.PackedConfig(
        weight_format=weight_format, interleave=interleave, activation=plan.activation,
        modules=tuple(m.module for m in plan.mlps), global_scale_kind=kind,
        source={"format": plan.source_format, "adapter": plan.adapter.name,
                **({"quantization_config": plan.config["quantization_config"]}
                   if "quantization_config" in plan.config else {})},
        linears=tuple(plan.linears) if formats.weight_format(weight_format).packs_linears else (),
        split_projections=plan.splits)
    report = ConvertReport(dst, weight_format, interleave, plan.activation, plan.adapter.name, plan.source_format,
                           src_bytes=sum(h.data_bytes for h in plan.headers))
    written = Path(os.path.abspath(dst))  # (DST may be the working directory, which the commit replaces)
    _write_atomically(src, dst, force, plan, cfg, kind, report, progress)
    report.dst_bytes = sum(sio.read_header(f).data_bytes for f in sio.checkpoint_files(written))
    return report


_TYPES = {"src": ((str, os.PathLike), "a path (str or os.PathLike)"),
          "dst": ((str, os.PathLike), "a path (str or os.PathLike)"),
          "weight_format": ((str, type(None)), f"a format name, one of {sorted(formats.WEIGHT_FORMATS)}, or None "
                                               "(follow the source)"),
          "interleave": (int, "an int"),
          "source_format": (str, f"one of {list(SOURCE_FORMATS)}"),
          "force": (bool, "True or False"),
          "progress": (bool, "True or False")}


def _check_types(**args) -> None:
    for name, value in args.items():
        types, expected = _TYPES[name]
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            raise TypeError(f"convert(): {name}={value!r} ({type(value).__name__}); expected {expected}")


def _write_atomically(src: Path, dst: Path, force: bool, plan: _Plan, cfg: formats.PackedConfig, kind, report,
                      progress: bool) -> None:
    """Write into a hidden sibling of DST, verify it, and move it into place (destination.py);
    on any failure or signal remove it and the parent directories made for it, and name DST (not
    the sibling) in write errors."""
    target = Destination(src, dst, force)  # refuses a DST that is, holds or lies in SRC
    with Interrupts() as interrupts:
        try:
            with target:
                _write(src, target.partial, plan, cfg, kind, report, progress)
                _verify_partial(target.partial, dst)
                interrupts.defer()  # from here a signal waits: DST is complete or untouched, never half
                target.commit()
        except OSError as e:
            ours = e.filename is not None and target.owns(Path(os.fsdecode(e.filename)))
            if ours or e.errno in (errno.ENOSPC, errno.EDQUOT):  # (a full disk's error names no file)
                raise OutputError(e.errno, f"cannot write {dst}: {e.strerror} (nothing was left behind; "
                                           f"choose a writable directory with enough free space)") from e
            raise


def _verify_partial(partial: Path, dst: Path) -> None:
    """Run ``verify`` on the finished output before it becomes DST: a checkpoint that fails it
    is never committed. Messages name DST, not the hidden directory."""
    def as_dst(text: str) -> str:
        return text.replace(str(partial), str(dst))

    try:
        checked = verify(partial)
    except (FormatError, sio.CheckpointError) as e:
        raise type(e)(as_dst(str(e))) from None
    if not checked.ok:
        problems = "; ".join(as_dst(str(v)) for v in checked.violations)
        raise FormatError(f"{dst}: the converted checkpoint fails verify, so nothing was written: {problems} "
                          f"(a source value the packed format cannot hold, or a bug in swiglu-fused: please "
                          f"report it with this message)")


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
            try:
                out = packer.shard(sio.load_file(path))
            except FormatError as e:  # (a tensor's problem: say which shard it came in)
                e.args = (f"{e} (in {path.name})", *e.args[1:])
                raise
            if out:  # a shard holding only halves that wait for their partner becomes nothing
                sio.write_file(out, tmp / path.name, metadata)
                weight_map.update({n: path.name for n in out})
            bar.update(header.data_bytes)
    if packer.split_waiting:
        raise FormatError(f"{src}: incomplete split projections (a weight or its scales never appeared): "
                          f"{', '.join(sorted(packer.split_waiting))}")
    if packer.linear_waiting:
        raise FormatError(f"{src}: incomplete quantized linears (a weight or its scales never appeared): "
                          f"{', '.join(sorted(packer.linear_waiting))}")
    if packer.waiting:
        missing = ", ".join(sorted(packer.waiting))
        raise FormatError(f"{src}: incomplete MLPs (gate, up or down never appeared): {missing}")
    report.dropped.sort()
    renamed = _consecutive_names(list(dict.fromkeys(weight_map.values())))
    for old, new in renamed.items():  # through temporary names: no new name may land on an old one
        os.rename(tmp / old, tmp / f".{new}.renaming")
    for new in renamed.values():
        os.rename(tmp / f".{new}.renaming", tmp / new)
    weight_map = {n: renamed.get(f, f) for n, f in weight_map.items()}
    report.left_out = _write_side_files(src, tmp, plan, cfg, weight_map)


_SHARD_NAME = re.compile(r"(?P<stem>.+)-(?P<number>[0-9]+)-of-(?P<total>[0-9]+)\.safetensors")


def _consecutive_names(names: list[str]) -> dict[str, str]:
    """Old → new names of the output shards (in order) where sharded names would skip numbers:
    a source shard that held only halves waiting for their partner became no output shard, so
    ``model-00002-of-00004`` must become ``model-00002-of-00003`` and so on. Names that do not
    follow the ``STEM-NNNNN-of-NNNNN.safetensors`` pattern stay as they are."""
    matches = [_SHARD_NAME.fullmatch(n) for n in names]
    if not names or not all(matches) or len({(m["stem"], len(m["total"])) for m in matches}) != 1:
        return {}
    width, total = len(matches[0]["total"]), len(names)
    new = {n: f"{m['stem']}-{i:0{width}d}-of-{total:0{width}d}.safetensors"
           for i, (n, m) in enumerate(zip(names, matches), 1)}
    return {old: name for old, name in new.items() if old != name}


def _write_side_files(src: Path, tmp: Path, plan: _Plan, cfg: formats.PackedConfig,
                      weight_map: dict) -> list[tuple[str, str]]:
    config = dict(plan.config)
    config["quantization_config"] = cfg.to_dict()
    (tmp / formats.CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    index = sio.index_file(src)
    if index is not None:
        total = sum(sio.read_header(tmp / f).data_bytes for f in sorted(set(weight_map.values())))
        body = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / index.name).write_text(json.dumps(body, indent=2) + "\n")
    copy, left_out = side_files(src, plan.files, index)  # weight files, links out of SRC, directories: left out
    for item in copy:
        shutil.copyfile(item, tmp / item.name)
    return left_out
