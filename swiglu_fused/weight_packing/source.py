"""What a source checkpoint directory says about itself: its config.json and the quantization its
producer declared (transformers fine-grained FP8, compressed-tensors NVFP4, ModelOpt NVFP4, dense).

Shared by ``convert`` (which packs it) and ``verify --against`` (which compares with it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from .. import formats
from ..formats import FormatError

SOURCE_FORMATS = ("auto", "dense", "fp8_block128", "nvfp4")


def read_config(src: Path) -> dict:
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: no such directory (the source checkpoint: a Hugging Face model directory)"
                                if not src.exists() else f"{src}: not a directory (the source checkpoint must be one)")
    path = src / formats.CONFIG_FILE
    if not path.is_file():
        hint = (f"; this looks like a diffusers pipeline: pass its {src / 'transformer'} folder"
                if (src / "model_index.json").is_file() and (src / "transformer").is_dir() else "")
        raise FormatError(f"{path}: missing; SRC must be a Hugging Face model directory (or a diffusers "
                          f"transformer/ folder) with config.json and safetensors files{hint}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise FormatError(f"{path}: not valid JSON ({e})") from None


def declared_source_format(config: Mapping, src: Path) -> str:
    """What the checkpoint's own quantization_config says it is."""
    q = config.get("quantization_config")
    if not q and (src / "hf_quant_config.json").is_file():  # ModelOpt's side file
        q = json.loads((src / "hf_quant_config.json").read_text()).get("quantization", {})
        q = {"quant_method": "modelopt", **q}
    if not q:
        return "dense"
    method = q.get("quant_method")
    where = f"{src / formats.CONFIG_FILE}: quantization_config"
    if method == "fp8":
        block = q.get("weight_block_size")
        if list(block or []) != [formats.FP8_BLOCK, formats.FP8_BLOCK]:
            raise FormatError(f"{where}.weight_block_size is {block}; only fine-grained FP8 with "
                              "[128, 128] blocks can be converted")
        if q.get("activation_scheme", "dynamic") != "dynamic":
            raise FormatError(f"{where}.activation_scheme is {q.get('activation_scheme')!r}; only 'dynamic' "
                              "is supported (activations are quantized per token group at run time)")
        return "fp8_block128"
    if method == "compressed-tensors":
        fmts = {q.get("format")} | {g.get("format") for g in (q.get("config_groups") or {}).values()}
        if "nvfp4-pack-quantized" in fmts:
            return "nvfp4"
        raise FormatError(f"{where}.format is {sorted(f for f in fmts if f)}; only nvfp4-pack-quantized "
                          "compressed-tensors checkpoints are supported")
    if method == "modelopt":
        algo = q.get("quant_algo")
        if algo == "NVFP4":
            return "nvfp4"
        raise FormatError(f"{where}.quant_algo is {algo!r}; only ModelOpt NVFP4 is supported")
    if method == formats.QUANT_METHOD:
        raise FormatError(f"{src}: already a swiglu-fused packed checkpoint")
    raise FormatError(f"{where}.quant_method {method!r} is not supported; expected fp8 (fine-grained), "
                      "compressed-tensors (nvfp4-pack-quantized) or modelopt (NVFP4)")
