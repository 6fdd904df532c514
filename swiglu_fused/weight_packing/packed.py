"""Read a packed checkpoint: its config and, per MLP module, its packed tensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from .. import formats
from ..formats import FormatError
from . import safetensors_io as sio


class PackedCheckpoint:
    """A packed checkpoint directory, opened lazily: tensors are read only when asked for."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        cfg_path = self.path / formats.CONFIG_FILE
        if not cfg_path.is_file():
            raise FormatError(f"{cfg_path}: missing; not a packed checkpoint directory")
        self.model_config = json.loads(cfg_path.read_text())
        q = self.model_config.get("quantization_config")
        if not isinstance(q, dict) or q.get(formats.K_QUANT_METHOD) != formats.QUANT_METHOD:
            raise FormatError(f"{cfg_path}: quantization_config.quant_method is not {formats.QUANT_METHOD!r}; "
                              "convert the checkpoint with `swiglu-fused convert` first")
        self.config = formats.PackedConfig.from_dict(q, str(cfg_path))
        self.files = sio.checkpoint_files(self.path)
        self.headers = {f: sio.read_header(f) for f in self.files}
        for f, h in self.headers.items():
            problems = formats.file_metadata_problems(h.metadata, self.config, str(f))
            if problems:
                raise FormatError("; ".join(map(str, problems)))
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
