"""Read a packed checkpoint: its config and, per MLP module, its packed tensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from .. import formats
from ..formats import FormatError
from . import safetensors_io as sio


_CONVERT_FIRST = "convert the checkpoint with `swiglu-fused convert` first"


def read_config(cfg_path: Path) -> tuple[dict, formats.PackedConfig]:
    """A packed checkpoint's config.json: (the whole model config, its quantization_config)."""
    try:
        model_config = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{cfg_path}: not valid JSON ({e}); restore the config.json that "
                          "`swiglu-fused convert` wrote") from None
    if not isinstance(model_config, dict):
        raise FormatError(f"{cfg_path}: expected a JSON object (a model config), found "
                          f"{type(model_config).__name__} {model_config!r:.80}")
    q = model_config.get("quantization_config")
    if not isinstance(q, dict):
        found = "missing" if q is None else f"a {type(q).__name__} ({q!r:.80}), not an object"
        raise FormatError(f"{cfg_path}: quantization_config is {found}; not a packed checkpoint: {_CONVERT_FIRST}")
    if q.get(formats.K_QUANT_METHOD) != formats.QUANT_METHOD:
        raise FormatError(f"{cfg_path}: quantization_config.quant_method is {q.get(formats.K_QUANT_METHOD)!r}, "
                          f"not {formats.QUANT_METHOD!r}; {_CONVERT_FIRST}")
    return model_config, formats.PackedConfig.from_dict(q, str(cfg_path))


def _joined(problems: list, limit: int = 4) -> str:
    more = f"; and {len(problems) - limit} more (`swiglu-fused verify` lists all)" if len(problems) > limit else ""
    return "; ".join(map(str, problems[:limit])) + more


def check_files_match_config(cfg: formats.PackedConfig, cfg_path: Path | str, headers) -> None:
    """What a loader checks before it reads a tensor (the facts ``verify`` checks, from the headers
    alone): every safetensors ``__metadata__`` states the format, version, interleave, activation and
    global-scale kind config.json states, and every packed tensor has the dtype and shape of that
    format. ``headers``: safetensors_io.Header of every file. Raises FormatError naming the files."""
    problems = [p for f, h in headers.items() for p in formats.file_metadata_problems(h.metadata, cfg, str(f))]
    if problems:
        raise FormatError(f"{cfg_path} and the safetensors files disagree: " + _joined(problems)
                          + "; loading would run the wrong format: restore the files or re-run "
                          "`swiglu-fused convert` on the source checkpoint")
    tensors, file_of = {}, {}
    for f, h in headers.items():
        for name, t in h.meta_tensors().items():
            tensors[name], file_of[name] = t, str(f)
    problems = formats.validate_state_dict(tensors, cfg, file_of)
    if problems:
        raise FormatError(f"{cfg_path}: the packed tensors are not those of format {cfg.weight_format} "
                          f"(g={cfg.interleave}): " + _joined(problems)
                          + "; re-run `swiglu-fused convert` on the source checkpoint")


class PackedCheckpoint:
    """A packed checkpoint directory, opened lazily: tensors are read only when asked for."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        cfg_path = self.path / formats.CONFIG_FILE
        if not cfg_path.is_file():
            raise FormatError(f"{cfg_path}: missing; not a packed checkpoint directory")
        self.model_config, self.config = read_config(cfg_path)
        self.files = sio.checkpoint_files(self.path)
        self.headers = {f: sio.read_header(f) for f in self.files}
        check_files_match_config(self.config, cfg_path, self.headers)
        self.file_of = {n: f for f, h in self.headers.items() for n in h.entries}

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self.file_of:
            raise FormatError(f"{self.path}: tensor {name} is missing")
        with safe_open(str(self.file_of[name]), framework="pt") as f:
            return f.get_tensor(name)

    def projection(self, module: str, proj: str) -> dict[str, torch.Tensor]:
        """Suffix → tensor for ``{module}.{proj}`` (proj = formats.GATE_UP or formats.DOWN)."""
        prefix = f"{module}.{proj}."
        return {n[len(prefix):]: self.tensor(n) for n in sorted(self.file_of) if n.startswith(prefix)}

    def module(self, module: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return self.projection(module, formats.GATE_UP), self.projection(module, formats.DOWN)
