"""Where a packed checkpoint's tensors live in vLLM, and which part of each a tensor-parallel rank
holds: plain Python (no vLLM import), shared by the plugin's modules and tested without vLLM
(tests/test_vllm_shards.py)."""

from __future__ import annotations

import math

from .. import formats
from ..formats import FormatError

# architecture (config.json "architectures") → vLLM module that defines it, for the families
# weight_packing converts; the plugin registers a FusedMLP-swapping subclass for each.
ARCHITECTURES = {
    "LlamaForCausalLM": "vllm.model_executor.models.llama",
    "MistralForCausalLM": "vllm.model_executor.models.mistral",
    "Qwen2ForCausalLM": "vllm.model_executor.models.qwen2",
    "Qwen3ForCausalLM": "vllm.model_executor.models.qwen3",
    "GemmaForCausalLM": "vllm.model_executor.models.gemma",
    "Phi3ForCausalLM": "vllm.model_executor.models.phi3",
}
# vLLM's names of an MLP's projections (a packed MLP's are replaced with it)
MLP_PROJECTIONS = ("gate_up_proj", "down_proj", "gate_proj", "up_proj")


def granule(fmt: formats.WeightFormat, suffix: str, axis: int) -> int:
    """Matrix rows (axis 0) or columns (axis 1) per stored element of the tensor ``suffix``: 1 for
    a bf16/e4m3 weight, 2 for nvfp4's packed columns, 128 for an fp8 block-scale grid, 16 for
    nvfp4's per-16 scales. A shard boundary must fall on a multiple of it."""
    n = 2048  # a multiple of every block size: shape(n) = n / granule exactly
    return n // fmt.tensors(n, n, 1)[suffix][1][axis]


def shard_range(fmt: formats.WeightFormat, suffix: str, axis: int, start: int, length: int, full: int
                ) -> tuple[int, int] | None:
    """The stored elements of ``suffix`` along ``axis`` that hold matrix rows/cols
    [start, start + length) of ``full``, or None when that range splits a block or a byte."""
    g = granule(fmt, suffix, axis)
    if start % g or (length % g and start + length != full):
        return None
    return start // g, math.ceil(length / g)


def mlp_tp_problem(intermediate: int, interleave: int, fmt: formats.WeightFormat, tp: int) -> str | None:
    """Why a packed MLP of intermediate size I cannot be split over ``tp`` ranks, or None. Rank r
    holds rows [r·2I/T, (r+1)·2I/T) of gate_up (whole g-chunks: (I/T) % g == 0) and the matching
    I/T columns of down, whose blocks (128 for fp8, 16 for nvfp4) must stay whole."""
    if intermediate % tp:
        return f"I = {intermediate} is not divisible by {tp}"
    local = intermediate // tp
    if local % interleave:
        return f"I/T = {local} is not a multiple of the interleave g = {interleave} (each rank holds whole g-chunks)"
    for suffix in fmt.tensors(2, 2, 1):
        if len(fmt.tensors(2, 2, 1)[suffix][1]) == 2 and local % granule(fmt, suffix, 1):
            return (f"I/T = {local} splits down_proj.{suffix}'s blocks of {granule(fmt, suffix, 1)} columns")
    return None


def valid_tp_sizes(intermediate: int, interleave: int, fmt: formats.WeightFormat) -> list[int]:
    return [t for t in range(1, intermediate + 1) if mlp_tp_problem(intermediate, interleave, fmt, t) is None]


def check_tensor_parallel(cfg: formats.PackedConfig, intermediate: int, tp: int) -> None:
    """One clear error, naming the valid sizes, when the checkpoint's MLPs cannot be split over
    ``tp`` ranks."""
    fmt = formats.weight_format(cfg.weight_format)
    problem = mlp_tp_problem(intermediate, cfg.interleave, fmt, tp)
    if problem is None:
        return
    valid = valid_tp_sizes(intermediate, cfg.interleave, fmt)
    finer = formats.suggest_interleaves(intermediate // tp, fmt) if intermediate % tp == 0 else []
    hint = f", or convert the source again with --interleave {finer[0]} to serve it at {tp}" if finer else ""
    raise FormatError(
        f"tensor_parallel_size {tp}: this packed checkpoint ({cfg.weight_format}, intermediate size "
        f"I = {intermediate}, interleave g = {cfg.interleave}) cannot be split over {tp} ranks: {problem}. "
        f"Valid tensor-parallel sizes for it: {', '.join(map(str, valid))} (vLLM also needs the "
        f"attention heads to divide){hint}")
