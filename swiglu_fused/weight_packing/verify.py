"""Check a packed checkpoint (``verify``, and ``validate`` from its headers alone) and describe it
(``inspect``). Reading files is packing's business: formats.py checks what it is given."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open

from .. import formats
from . import adapters, pack
from . import safetensors_io as sio
from .source import declared_source_format, read_config
from .packed_checkpoint import PackedCheckpoint


@dataclass
class Check:
    module: str
    projection: str  # "gate", "up" or "down"
    mode: str  # "bit-exact", "within bound", "shape" (packed and source shapes differ) or "non-finite"
    error: float  # relative Frobenius error of the dequantized weights (0 for bit-exact)
    bound: float
    ok: bool
    detail: str = ""
    widened_from: str = ""  # bit-exact values whose source stored the scales narrower (bf16, e8m0): not bytes

    def problem(self) -> str:
        """Why the check failed, in words."""
        if self.mode == "shape":
            return f"shape differs: {self.detail}"
        if self.mode == "non-finite":
            return self.detail
        if self.mode == "bit-exact":
            return "bytes differ from the source's (it should have been moved unchanged)"
        return f"relative error {self.error:.4g} exceeds the format's bound {self.bound}"


@dataclass
class VerifyReport:
    path: Path
    violations: list[formats.Violation] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations and all(c.ok for c in self.checks)

    def __str__(self) -> str:  # print(report) reads like the CLI
        return self.summary()

    def summary(self) -> str:
        lines = [f"{self.path}: {'OK' if self.ok else 'FAILED'}"]
        lines += [f"  violation: {v}" for v in self.violations]
        if self.checks:
            exact = sum(c.mode == "bit-exact" and c.ok for c in self.checks)
            bounded = [c for c in self.checks if c.mode == "within bound"]
            lines.append(f"  {exact} projections bit-exact against the source")
            widened: dict[str, int] = {}
            for c in self.checks:
                if c.mode == "bit-exact" and c.ok and c.widened_from:
                    widened[c.widened_from] = widened.get(c.widened_from, 0) + 1
            if widened:
                lines.append(f"  of those, {pack.widened_note(widened)}")
            if bounded:
                worst = max(bounded, key=lambda c: c.error / c.bound)
                lines.append(f"  {len(bounded)} projections re-quantized; worst relative error "
                             f"{worst.error:.4f} ({worst.module} {worst.projection}, bound {worst.bound})")
            lines += [f"  MISMATCH {c.module} {c.projection}: {c.problem()}" for c in self.checks if not c.ok]
        return "\n".join(lines)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _compare(module: str, name: str, packed: pack.Projection, source: pack.Projection, fmt: str) -> Check:
    if pack.keeps_bytes(source, fmt, packed.kind):
        ok = packed.tensors.keys() == source.tensors.keys() and all(
            _same_bytes(packed.tensors[k], source.tensors[k].to(packed.tensors[k].dtype)
                        if k == "weight_scale_inv" else source.tensors[k]) for k in packed.tensors)
        widened = ", ".join(sorted({str(d).removeprefix("torch.") for d in source.widened.values()}))
        return Check(module, name, "bit-exact", 0.0 if ok else float("nan"), 0.0, ok, widened_from=widened)
    ref, got = pack.dequantize(source), pack.dequantize(packed)
    bound = formats.weight_format(fmt).roundtrip_bound
    if ref.shape != got.shape:
        return Check(module, name, "shape", float("nan"), bound, False,
                     f"packed {list(got.shape)}, source {list(ref.shape)} (converted from another model?)")
    for side, w in (("packed", got), ("source", ref)):
        nan, inf = int(w.isnan().sum()), int(w.isinf().sum())
        if nan or inf:
            return Check(module, name, "non-finite", float("nan"), bound, False,
                         f"the {side} weight dequantizes to {nan} NaN and {inf} infinite values (of {w.numel()})")
    err = _relative_error(got, ref)
    return Check(module, name, "within bound", err, bound, err <= bound)


def _relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """‖got − ref‖ / ‖ref‖ (Frobenius) of finite tensors. Both are divided by their largest
    magnitude first: squares of 1e30 weights overflow fp32 and squares of 1e-30 ones underflow."""
    top = torch.maximum(got.abs().amax(), ref.abs().amax())
    if top == 0:
        return 0.0
    got, ref = got / top, ref / top
    return ((got - ref).norm() / ref.norm()).item()  # ‖ref‖ = 0 with got ≠ 0: inf, a failure


def verify(dst: str | Path, against: str | Path | None = None) -> VerifyReport:
    """Validate ``dst`` (``validate``: config, metadata, index, shapes, dtypes, unlisted modules;
    then the values of every packed tensor, see ``_value_problems``); with ``against``, also compare
    every MLP weight with the source checkpoint: bit-exact where bytes were moved, within
    the format's roundtrip_bound where re-quantized."""
    if not Path(dst).is_dir():
        raise FileNotFoundError(f"{dst}: no such directory (DST: a packed checkpoint directory)"
                                if not Path(dst).exists() else f"{dst}: not a directory")
    report = VerifyReport(Path(dst), violations=validate(dst))
    if report.violations:
        return report
    ckpt = PackedCheckpoint(dst)
    report.violations += _value_problems(ckpt)
    if report.violations or against is None:
        return report
    cfg = ckpt.config
    src = Path(against)
    src_config = read_config(src)
    declared_source_format(src_config, src)
    adapter = adapters.for_config(src_config)
    files = sio.checkpoint_files(src)
    file_of = {n: f for f in files for n in sio.read_header(f).entries}
    mlps = {m.module: m for m in adapter.find_mlps(list(file_of))}
    missing = sorted(set(cfg.modules) ^ set(mlps))
    if missing:
        report.violations.append(formats.Violation(str(dst), None, formats.K_MODULES,
                                                   f"modules differ from the source's MLPs: {missing}"))
        return report
    for module in cfg.modules:
        mlp = mlps[module]
        names = [n for n in file_of if n.rsplit(".", 1)[0] in mlp.projections]
        src_t = {}
        for f in sorted({file_of[n] for n in names}):
            src_t.update(sio.load_file(f, [n for n in names if file_of[n] == f]))
        if mlp.fused:
            s_gate, s_up = pack.split_fused(pack.read_projection(src_t.get, mlp.fused))
        else:
            s_gate, s_up = pack.read_projection(src_t.get, mlp.gate), pack.read_projection(src_t.get, mlp.up)
        s_down = pack.read_projection(src_t.get, mlp.down)
        gu, dn = ckpt.module(module)
        p_gate, p_up = pack.unpack_gate_up(gu, cfg.weight_format, cfg.interleave, cfg.global_scale_kind)
        p_down = pack.Projection(cfg.weight_format, dn, "down", cfg.global_scale_kind)
        for name, p, s in (("gate", p_gate, s_gate), ("up", p_up, s_up), ("down", p_down, s_down)):
            report.checks.append(_compare(module, name, p, s, cfg.weight_format))
    find_splits = getattr(adapter, "find_splits", None)
    splits = find_splits(list(file_of), src_config) if find_splits else {}
    if splits != dict(cfg.split_projections):
        report.violations.append(formats.Violation(str(dst), None, formats.K_SPLIT,
                                                   f"split projections differ from the source's: packed "
                                                   f"{dict(cfg.split_projections)!r:.200}, source {splits!r:.200}"))
        return report
    for proj, prefix_rows in splits.items():
        names = [n for n in file_of if n.rsplit(".", 1)[0] == proj]
        src_t = {}
        for f in sorted({file_of[n] for n in names}):
            src_t.update(sio.load_file(f, [n for n in names if file_of[n] == f]))
        source = pack.split_prefix_pairs(pack.read_projection(src_t.get, proj), prefix_rows)
        packed = pack.unpack_split(ckpt.projection(proj, formats.SPLIT), prefix_rows, cfg.weight_format,
                                   cfg.interleave, cfg.global_scale_kind)
        for name, p, s in zip(formats.SPLIT_SEGMENTS, packed, source):
            report.checks.append(_compare(proj, name, p, s, cfg.weight_format))
    _check_rest(report, ckpt, file_of, {p for m in mlps.values() for p in m.projections} | set(splits))
    return report


def _check_rest(report: VerifyReport, ckpt: PackedCheckpoint, src_file_of: Mapping[str, Path],
                mlp_projections: set[str]) -> None:
    """Every tensor of the source outside its MLPs has a home in the packed checkpoint: the same
    tensor, bit-equal (names, dtypes, bytes); or, in a linear the source quantized, that linear in
    the packed format (``linears``; bit-exact where bytes were moved, else within the format's
    bound; a plain bf16 weight when the format is bf16), minus the activation scales the
    weight-only format drops. Anything else is a violation naming the source tensor; so is a
    tensor of the MLPs' projections that their producer's layout does not know, and a packed tensor
    that is none of these homes (_foreign)."""
    cfg, dst = ckpt.config, ckpt.path
    fmt = formats.weight_format(cfg.weight_format)
    homes = {n for n in src_file_of if n.rsplit(".", 1)[0] not in mlp_projections}  # (copied, or a linear's)
    by_prefix: dict[str, list[str]] = {}
    for n in src_file_of:
        by_prefix.setdefault(n.rsplit(".", 1)[0], []).append(n)
    src_meta = {n: t for f in sorted(set(src_file_of.values())) for n, t in sio.read_header(f).meta_tensors().items()}

    def load(names: list[str]) -> dict[str, torch.Tensor]:
        out = {}
        for f in sorted({src_file_of[n] for n in names}):
            out.update(sio.load_file(f, [n for n in names if src_file_of[n] == f]))
        return out

    def homeless(name: str, why: str) -> None:
        report.violations.append(formats.Violation(str(src_file_of[name]), name, None,
                                                   f"has no home in {dst}: {why}"))

    for prefix, names in sorted(by_prefix.items()):
        layout = formats.source_layout(lambda suffix: src_meta.get(f"{prefix}.{suffix}"))
        if prefix in mlp_projections:
            known = {*layout.names.values(), *layout.dropped} if layout else {"weight"}
            for n in sorted(names):
                if n.rsplit(".", 1)[1] not in known:
                    homeless(n, "a tensor of an MLP projection that its format does not use")
            continue
        if layout is None:  # what the source left unquantized: copied as it was
            for n in sorted(names):
                if n not in ckpt.file_of:
                    homeless(n, "missing from the packed checkpoint")
                elif not _same_bytes(ckpt.tensor(n), load([n])[n]):
                    report.checks.append(Check(n, "copied", "bit-exact", float("nan"), 0.0, False))
            continue
        known = {*layout.names.values(), *layout.dropped, "bias"}
        homes |= {f"{prefix}.{suffix}" for suffix in fmt.tensors(1, 2, 1)}
        for n in sorted(names):
            if n.rsplit(".", 1)[1] not in known:
                homeless(n, f"a tensor of the {layout.producer} quantized linear {prefix} that no format uses")
        listed = prefix in cfg.linears
        if not listed and fmt.packs_linears:
            homeless(f"{prefix}.{layout.weight}", f"the source quantized {prefix}, but quantization_config.linears "
                                                  "does not list it")
            continue
        src_t = load(names)
        bias = src_t.pop(f"{prefix}.bias", None)
        source = pack.read_projection(src_t.get, prefix)
        packed = {s: ckpt.tensor(f"{prefix}.{s}") for s in fmt.tensors(1, 2, 1) if f"{prefix}.{s}" in ckpt.file_of}
        if packed.keys() != fmt.tensors(1, 2, 1).keys():
            homeless(f"{prefix}.{layout.weight}", f"{prefix} is missing from the packed checkpoint")
            continue
        report.checks.append(_compare(prefix, "linear", pack.Projection(fmt.name, packed, prefix,
                                                                        cfg.global_scale_kind), source, fmt.name))
        if bias is not None:
            got = ckpt.tensor(f"{prefix}.bias") if f"{prefix}.bias" in ckpt.file_of else None
            if got is None:
                homeless(f"{prefix}.bias", "missing from the packed checkpoint")
            elif not _same_bytes(got, bias):
                report.checks.append(Check(prefix, "bias", "bit-exact", float("nan"), 0.0, False))
    _foreign(report, ckpt, homes)


def _foreign(report: VerifyReport, ckpt: PackedCheckpoint, homes: set[str]) -> None:
    """A packed tensor that is neither a home of a source tensor (``homes``: the copies and the
    linears' packed tensors) nor one of its format's tensors of a listed packed MLP or split
    projection came from somewhere else (added after the conversion, or by another tool): a
    violation naming it and its file. (validate checks that the format's tensors are there, not
    that nothing else is.)"""
    cfg = ckpt.config
    suffixes = set(formats.weight_format(cfg.weight_format).tensors(2, 2, 1))  # (the same names for every projection)
    packed = ({f"{m}.{p}" for m in cfg.modules for p in (formats.GATE_UP, formats.DOWN)}
              | {f"{s}.{formats.SPLIT}" for s in cfg.split_projections})
    for n in sorted(ckpt.file_of):
        prefix, _, suffix = n.rpartition(".")
        if n not in homes and not (prefix in packed and suffix in suffixes):
            report.violations.append(formats.Violation(str(ckpt.file_of[n]), n, None,
                                                       "is not from the source: neither one of its tensors nor "
                                                       "one of the packed projections' tensors"))


def _value_problems(ckpt: PackedCheckpoint) -> list[formats.Violation]:
    """Values that would poison every output they touch (pack.value_problem: NaN/inf weights, NaN,
    infinite or negative scales, zero or out-of-range global scales) in the packed tensors of every
    listed module. Headers cannot show these, so the data is read: file by file, one tensor at a
    time, so memory holds one tensor however large the checkpoint."""
    cfg = ckpt.config
    suffixes = set(formats.weight_format(cfg.weight_format).tensors(2, 2, 1))
    projections = ({f"{m}.{p}" for m in cfg.modules for p in (formats.GATE_UP, formats.DOWN)} | set(cfg.linears)
                   | {f"{s}.{formats.SPLIT}" for s in cfg.split_projections})
    out = []
    for f, header in ckpt.headers.items():
        names = [n for n in header.entries if n.rsplit(".", 1)[0] in projections and n.rsplit(".", 1)[1] in suffixes]
        if not names:
            continue
        with safe_open(str(f), framework="pt") as opened:
            for name in names:
                problem = pack.value_problem(name.rsplit(".", 1)[1], opened.get_tensor(name), cfg.global_scale_kind)
                if problem:
                    out.append(formats.Violation(str(f), name, "values", problem))
    return out


@dataclass
class InspectRow:
    module: str
    weight_format: str
    interleave: int
    gate_up_shape: tuple[int, int]
    down_shape: tuple[int, int]
    nbytes: int


def inspect(dst: str | Path) -> tuple[formats.PackedConfig, list[InspectRow]]:
    """Per-MLP description of a packed checkpoint, read from headers only. FormatError if the headers
    break the format (a module without its tensors, wrong shapes, ...): the table would be wrong."""
    if not Path(dst).is_dir():
        raise FileNotFoundError(f"{dst}: no such directory (DST: a packed checkpoint directory)"
                                if not Path(dst).exists() else f"{dst}: not a directory")
    problems = validate(dst)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise formats.FormatError(f"{dst}: not a valid packed checkpoint: {problems[0]}{more}; "
                                  f"`swiglu-fused verify {dst}` lists them all")
    ckpt = PackedCheckpoint(dst)
    cfg = ckpt.config
    fmt = formats.weight_format(cfg.weight_format)
    entries = {n: e for h in ckpt.headers.values() for n, e in h.entries.items()}
    rows = []
    for module in cfg.modules:
        def shape(proj):
            e = entries[f"{module}.{proj}.{fmt.weight_name}"]
            return (e.shape[0], e.shape[1] * fmt.values_per_byte)
        nbytes = sum(e.nbytes for n, e in entries.items() if n.startswith(module + "."))
        rows.append(InspectRow(module, cfg.weight_format, cfg.interleave, shape(formats.GATE_UP),
                               shape(formats.DOWN), nbytes))
    return cfg, rows


@dataclass
class LinearRow:
    module: str
    weight_format: str
    shape: tuple[int, int]  # [out_features, in_features]
    bias: bool
    nbytes: int


def inspect_linears(dst: str | Path) -> list[LinearRow]:
    """Per-linear description of the packed non-MLP linears (``quantization_config.linears``: the
    source's quantized attention projections, ...), read from headers only; ``inspect`` checks."""
    ckpt = PackedCheckpoint(dst)
    fmt = formats.weight_format(ckpt.config.weight_format)
    entries = {n: e for h in ckpt.headers.values() for n, e in h.entries.items()}
    rows = []
    for module in ckpt.config.linears:
        e = entries[f"{module}.{fmt.weight_name}"]
        nbytes = sum(entries[f"{module}.{s}"].nbytes for s in (*fmt.tensors(1, 2, 1), "bias")
                     if f"{module}.{s}" in entries)
        rows.append(LinearRow(module, fmt.name, (e.shape[0], e.shape[1] * fmt.values_per_byte),
                              f"{module}.bias" in entries, nbytes))
    return rows


@dataclass
class SplitRow:
    module: str
    weight_format: str
    prefix: int  # rows kept as they are (Q; K; V)
    intermediate: int  # h columns of the gate/up pairs
    in_features: int
    nbytes: int


def inspect_splits(dst: str | Path) -> list[SplitRow]:
    """Per-projection description of the split projections (``quantization_config.split_projections``:
    Flux.2's single-stream [Q; K; V | gate, up]), read from headers only; ``inspect`` checks."""
    ckpt = PackedCheckpoint(dst)
    fmt = formats.weight_format(ckpt.config.weight_format)
    entries = {n: e for h in ckpt.headers.values() for n, e in h.entries.items()}
    rows = []
    for module, prefix in ckpt.config.split_projections.items():
        base = f"{module}.{formats.SPLIT}"
        e = entries[f"{base}.{fmt.weight_name}"]
        nbytes = sum(x.nbytes for n, x in entries.items() if n.startswith(base + "."))
        rows.append(SplitRow(module, fmt.name, prefix, (e.shape[0] - prefix) // 2, e.shape[1] * fmt.values_per_byte,
                             nbytes))
    return rows


def _columns(head: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    fmt_row = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [fmt_row(head), fmt_row(["-" * w for w in widths])] + [fmt_row(b) for b in body]


def format_table(cfg: formats.PackedConfig, rows: list[InspectRow], linears: list[LinearRow] = (),
                 splits: list[SplitRow] = ()) -> str:
    head = ("module", "format", "g", "gate_up [2I, H]", "down [H, I]", "bytes")
    body = [(r.module, r.weight_format, str(r.interleave), "x".join(map(str, r.gate_up_shape)),
             "x".join(map(str, r.down_shape)), f"{r.nbytes:,}") for r in rows]
    total = sum(r.nbytes for r in rows)
    lines = [f"format v{cfg.format_version}: weight_format={cfg.weight_format} interleave={cfg.interleave} "
             f"activation={cfg.activation} h_format={cfg.h_format}"
             + (f" global_scale_kind={cfg.global_scale_kind}" if cfg.global_scale_kind else "")]
    lines += _columns(head, body)
    lines.append(f"{len(rows)} MLPs, {total:,} bytes of MLP weights")
    if splits:
        body = [(r.module, r.weight_format, str(r.prefix), str(r.intermediate), str(r.in_features), f"{r.nbytes:,}")
                for r in splits]
        lines += [""] + _columns(("split projection", "format", "prefix rows", "I", "in", "bytes"), body)
        lines.append(f"{len(splits)} split projections (quantization_config.split_projections: prefix rows as "
                     f"they are, then gate/up interleaved), {sum(r.nbytes for r in splits):,} bytes")
    if linears:
        body = [(r.module, r.weight_format, "x".join(map(str, r.shape)), "yes" if r.bias else "-", f"{r.nbytes:,}")
                for r in linears]
        lines += [""] + _columns(("linear", "format", "weight [out, in]", "bias", "bytes"), body)
        lines.append(f"{len(linears)} packed non-MLP linears (quantization_config.linears), "
                     f"{sum(r.nbytes for r in linears):,} bytes; other modules are stored as the source had them")
    return "\n".join(lines)


# ---------------------------------------------------------------- headers (no tensor data)
def validate(path: str | Path) -> list[formats.Violation]:
    """Every violation found in a packed checkpoint directory (empty list = valid): reads the
    headers (config.json, each shard's __metadata__, the index) and checks them with formats.py's
    pure checks (``formats.header_problems``, ``formats.file_metadata_problems``, ``formats.validate_state_dict``)."""
    path = Path(path)
    cfg_path = path / formats.CONFIG_FILE
    if not cfg_path.is_file():
        return [formats.Violation(str(cfg_path), None, None, "missing config.json")]
    try:
        model_config = json.loads(cfg_path.read_text())
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError; nesting too deep
        return [formats.Violation(str(cfg_path), None, None, f"not valid JSON ({str(e) or type(e).__name__:.200})")]
    qcfg = model_config.get("quantization_config") if isinstance(model_config, dict) else None
    if not isinstance(qcfg, dict):
        return [formats.Violation(str(cfg_path), None, "quantization_config", "missing: not a swiglu-fused checkpoint")]
    problems = formats.header_problems(qcfg, str(cfg_path))
    if problems:
        return problems
    cfg = formats.PackedConfig.from_dict(qcfg)
    try:
        files = sio.checkpoint_files(path)
    except sio.CheckpointError as e:
        return [formats.Violation(str(path), None, None, str(e))]
    tensors: dict[str, torch.Tensor] = {}
    file_of: dict[str, str] = {}
    stored: dict[str, list[str]] = {}  # file name → its tensors (readable files only)
    out: list[formats.Violation] = []
    for f in files:
        try:
            header = sio.read_header(f)
        except sio.CheckpointError as e:  # (its message names the file already)
            out.append(formats.Violation(None if str(e).startswith(str(f)) else str(f), None, None, str(e)))
            continue
        out += formats.file_metadata_problems(header.metadata, cfg, str(f))
        stored[f.relative_to(path).as_posix()] = list(header.entries)
        # Meta tensors carry dtype and shape without reading a byte of data.
        for name, t in header.meta_tensors().items():
            if name in file_of:
                out.append(formats.Violation(str(f), name, None, f"also stored in {file_of[name]}: a loader reads only one"))
            tensors[name] = t
            file_of[name] = str(f)
    index = sio.index_file(path)
    if index is not None:
        single = path / formats.SINGLE_FILE
        if single.is_file() and single not in files:  # transformers loads it and ignores the index
            out.append(formats.Violation(str(single), None, None, f"beside {index.name}: transformers loads this file "
                                 "instead of the index; remove it"))
        # other safetensors files the index does not name: loaders never open them (a Mistral
        # repo's consolidated.safetensors is fine), but they tell where a listed tensor went
        extra = {}
        for f in sorted(set(path.glob("*.safetensors")) - set(files)):
            try:
                extra[f.name] = list(sio.read_header(f).entries)
            except sio.CheckpointError:
                pass
        out += index_problems(index, sio.index_weight_map(index), stored,
                              unreadable={f.relative_to(path).as_posix() for f in files} - stored.keys(), extra=extra)
    if len(stored) < len(files):  # an unreadable file: the model's check would call its tensors missing
        return out
    out += formats.validate_state_dict(tensors, cfg, file_of)
    return out


def index_problems(index: Path, weight_map: Mapping[str, str], stored: Mapping[str, list[str]],
                   unreadable: set[str] = set(), extra: Mapping[str, list[str]] = {}) -> list[formats.Violation]:
    """The index must list every tensor of the files it names, in the file that holds it, and
    nothing else: a loader reads only what it lists (an unlisted MLP tensor is left randomly
    initialised) and fails on a listed tensor that no file holds. ``stored``: file → tensors of the
    files the index names; ``extra``: the same for safetensors files it does not name."""
    out = []
    weight_map = {n: Path(f).as_posix() for n, f in weight_map.items()}  # "./a.safetensors" is "a.safetensors"
    holder = {n: f for f, names in stored.items() for n in names}
    elsewhere = {n: f for f, names in extra.items() for n in names}
    for name, f in holder.items():
        listed = weight_map.get(name)
        if listed is None:
            out.append(formats.Violation(str(index), name, "weight_map",
                                 f"stored in {f} but not listed: loaders will not read it"))
        elif listed != f:
            out.append(formats.Violation(str(index), name, "weight_map", f"listed in {listed} but stored in {f}"))
    for name, f in weight_map.items():
        if name in holder or f in unreadable:
            continue
        if name in elsewhere:
            out.append(formats.Violation(str(index), name, "weight_map", f"listed in {f} but stored in {elsewhere[name]}, "
                                                                 "a file the index does not name"))
        else:
            out.append(formats.Violation(str(index), name, "weight_map", f"listed in {f}, but no file holds this tensor"))
    return out
