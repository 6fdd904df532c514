"""What a source checkpoint directory says about itself: its config.json and the quantization its
producer declared (transformers fine-grained FP8, compressed-tensors NVFP4 and FP8 blocks, ModelOpt
NVFP4, dense), and which of its other files belong in the packed checkpoint (``side_files``).

Shared by ``convert`` (which packs it) and ``verify --against`` (which compares with it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from .. import formats
from ..formats import FormatError
from . import safetensors_io as sio

SOURCE_FORMATS = ("auto", "dense", "fp8_block128", "nvfp4")


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except RecursionError:
        raise FormatError(f"{path}: not valid JSON (nested too deeply); {what}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise FormatError(f"{path}: not valid JSON ({str(e):.200}); {what}") from None


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
    config = _read_json(path, "a model's config.json is a JSON object")
    if not isinstance(config, dict):
        raise FormatError(f"{path}: expected a JSON object (a model config with architectures, hidden_size, ...), "
                          f"found {_kind(config)}")
    return config


def _kind(value) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r:.60}"


def _modelopt_config(src: Path) -> dict | None:
    """ModelOpt's side file hf_quant_config.json, as a quantization_config; None if absent."""
    path = src / "hf_quant_config.json"
    if not path.is_file():
        return None
    body = _read_json(path, "ModelOpt writes it as a JSON object with a \"quantization\" object")
    q = body.get("quantization") if isinstance(body, dict) else None
    if not isinstance(q, dict):
        found = _kind(body) if not isinstance(body, dict) else f"quantization = {_kind(q)}"
        raise FormatError(f"{path}: expected a JSON object with a \"quantization\" object (as ModelOpt exports it), "
                          f"found {found}; remove the file if the checkpoint is not ModelOpt-quantized")
    return {"quant_method": "modelopt", **q}


def declared_source_format(config: Mapping, src: Path) -> str:
    """What the checkpoint's own quantization_config says it is."""
    q = config.get("quantization_config")
    where = f"{src / formats.CONFIG_FILE}: quantization_config"
    if q is not None and not isinstance(q, dict):
        raise FormatError(f"{where} must be a JSON object (with quant_method, ...), found {_kind(q)}")
    if not q:
        q = _modelopt_config(src)
        where = f"{src / 'hf_quant_config.json'}: quantization"
    if not q:
        return "dense"
    method = q.get("quant_method")
    if method == "fp8":
        block = q.get("weight_block_size")
        if not isinstance(block, list) or block != [formats.FP8_BLOCK, formats.FP8_BLOCK]:
            raise FormatError(f"{where}.weight_block_size is {block!r:.100}; only fine-grained FP8 with "
                              "[128, 128] blocks can be converted")
        if q.get("activation_scheme", "dynamic") != "dynamic":
            raise FormatError(f"{where}.activation_scheme is {q.get('activation_scheme')!r:.100}; only 'dynamic' "
                              "is supported (activations are quantized per token group at run time)")
        return "fp8_block128"
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
            raise FormatError(f"{where}.config_groups must be an object of group objects, found {groups!r:.100}")
        fmts = [q.get("format")] + [g.get("format") for g in groups.values()]
        if "nvfp4-pack-quantized" in fmts:
            return "nvfp4"
        if "float-quantized" in fmts:
            _check_ct_fp8_block(q, groups, where)
            return "fp8_block128"
        raise FormatError(f"{where}.format is {sorted({str(f) for f in fmts if f})}; only nvfp4-pack-quantized and "
                          f"float-quantized (FP8 with {CT_FP8_BLOCK}) compressed-tensors checkpoints are supported")
    if method == "modelopt":
        algo = q.get("quant_algo")
        if algo == "NVFP4":
            return "nvfp4"
        raise FormatError(f"{where}.quant_algo is {algo!r:.100}; only ModelOpt NVFP4 is supported")
    if method == formats.QUANT_METHOD:
        raise FormatError(f"{src}: already a swiglu-fused packed checkpoint (an output of convert, not a source): "
                          f"pass the original checkpoint it was converted from, or load this one as it is")
    raise FormatError(f"{where}.quant_method {method!r:.100} is not supported; expected fp8 (fine-grained), "
                      "compressed-tensors (nvfp4-pack-quantized, or float-quantized FP8 128x128 blocks) or modelopt "
                      "(NVFP4)")


CT_FP8_BLOCK = "block [128, 128] weights and dynamic group-128 activations (llmcompressor's FP8_BLOCK scheme)"


def _check_ct_fp8_block(q: Mapping, groups: Mapping, where: str) -> None:
    """FormatError unless every config group of a float-quantized compressed-tensors checkpoint is
    FP8 block [128, 128] weights with dynamic activations per token group of 128: the numbers of
    our fp8_block128 (per-tensor, per-channel or static-activation FP8 are not)."""
    supported = f"only FP8 with {CT_FP8_BLOCK} can be converted (or nvfp4-pack-quantized)"
    if not groups:
        raise FormatError(f"{where}.config_groups is empty: a float-quantized checkpoint must say how its weights "
                          f"are quantized; {supported}")
    for gname, g in groups.items():
        at = f"{where}.config_groups.{gname}"
        fmt = g.get("format") or q.get("format")
        if fmt != "float-quantized":
            raise FormatError(f"{at}.format is {fmt!r:.60} beside float-quantized groups; {supported}")
        w, x = g.get("weights"), g.get("input_activations")
        if not isinstance(w, dict):
            raise FormatError(f"{at}.weights is {_kind(w)}; {supported}")
        found = {k: w.get(k) for k in ("type", "num_bits", "strategy", "block_structure")}
        if found != {"type": "float", "num_bits": 8, "strategy": "block",
                     "block_structure": [formats.FP8_BLOCK, formats.FP8_BLOCK]}:
            strategy = w.get("strategy")
            what = (f"strategy {strategy!r:.40} ({'per-tensor' if strategy == 'tensor' else 'per-channel'} scales)"
                    if strategy in ("tensor", "channel") else
                    ", ".join(f"{k} {v!r:.40}" for k, v in found.items()))
            raise FormatError(f"{at}.weights: {what}; {supported}")
        if not isinstance(x, dict) or (x.get("type"), x.get("num_bits"), x.get("dynamic"), x.get("strategy"),
                                       x.get("group_size")) != ("float", 8, True, "group", formats.FP8_BLOCK):
            keys = ("type", "num_bits", "dynamic", "strategy", "group_size")
            what = ("absent (weight-only)" if x is None else
                    ", ".join(f"{k} {x.get(k)!r:.40}" for k in keys) if isinstance(x, dict) else _kind(x))
            raise FormatError(f"{at}.input_activations: {what}; {supported}")


# Files that hold weights (or pickled training state): never copied beside the packed weights, where
# a loader could pick them up instead (transformers prefers a model.safetensors to an index).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".ggml", ".h5", ".msgpack",
                   ".onnx", ".tflite", ".npz", ".npy", ".pkl", ".pickle", ".ot")


def side_files(src: Path, shard_files: list[Path], index: Path | None) -> tuple[list[Path], list[tuple[str, str]]]:
    """Which entries of ``src`` to copy unchanged into the packed checkpoint, and which are left out
    (name, reason). config.json, the index and the shards (written anew) are in neither list.

    Copied: every other regular file of SRC's top level (tokenizer files, generation_config.json,
    chat templates, README, LICENSE, custom code, ...), symbolic links included when they lead to a
    file inside SRC. Left out, with the reason: weight files the checkpoint does not use (a stale
    model.safetensors beside an index, consolidated.safetensors, pytorch_model*.bin), other weight
    indexes, hidden files, directories, symbolic links leading elsewhere, special files.
    """
    handled = {formats.CONFIG_FILE} | {p.name for p in shard_files} | ({index.name} if index is not None else set())
    copy: list[Path] = []
    left_out: list[tuple[str, str]] = []
    for item in sorted(src.iterdir()):
        name = item.name
        if name in handled:
            continue
        lower = name.lower()
        if name.startswith("."):
            reason = "hidden: its name starts with a dot"
        elif name == "hf_quant_config.json":
            reason = "ModelOpt's quantization description; the packed quantization_config replaces it"
        elif item.is_symlink() and item.is_dir():
            reason = "a symbolic link to a directory"
        elif item.is_dir():
            reason = ("a directory (original/ holds another copy of the weights)" if name == "original" else
                      "a directory; only the files at the top level of a checkpoint are copied")
        elif lower.endswith(".safetensors"):
            reason = (f"a weight file not named by the index {index.name}" if index is not None else
                      f"a weight file; the checkpoint is {', '.join(p.name for p in shard_files)}")
        elif lower.endswith(WEIGHT_SUFFIXES):
            reason = "a weight file in another format; the packed safetensors replace the weights"
        elif lower.endswith(".index.json"):
            reason = "an index of other weight files"
        else:
            reason = sio.link_problem(item, src)
            if reason is None:
                copy.append(item)
                continue
        left_out.append((name, reason))
    return copy, left_out
