"""Tiny real models (transformers / diffusers classes built from configs, random weights, no
download), saved as real safetensors checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DATA = Path(__file__).parent / "data"
COMMON = dict(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
              vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False)


def _causal_lm(family: str, hidden: int, inter: int, **extra):
    import transformers as tf

    config_cls, model_cls = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "gemma": ("GemmaConfig", "GemmaForCausalLM"),
        "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    }[family]
    kwargs = dict(COMMON, hidden_size=hidden, intermediate_size=inter, architectures=[model_cls], **extra)
    if family == "gemma":
        kwargs["hidden_activation"] = "gelu_pytorch_tanh"
    if family == "phi3":
        kwargs.pop("head_dim")  # Phi-3 derives it from hidden / heads
        kwargs["pad_token_id"] = 0
    config = getattr(tf, config_cls)(**kwargs)
    return getattr(tf, model_cls)(config).to(torch.bfloat16).eval()


def make_causal_lm(path: Path, family: str = "llama", hidden: int = 128, inter: int = 384, seed: int = 0,
                   max_shard_size: str | None = None, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    model = _causal_lm(family, hidden, inter).to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    (path / "tokenizer.json").write_text('{"version": "1.0", "note": "stand-in side file, copied verbatim"}\n')
    return model


def make_flux2(path: Path, seed: int = 0):
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(seed)
    model = Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=1, attention_head_dim=64,
        num_attention_heads=2, joint_attention_dim=32, timestep_guidance_channels=32, mlp_ratio=3.0,
        axes_dims_rope=(16, 16, 16, 16)).to(torch.bfloat16).eval()
    model.save_pretrained(path)
    return model


@pytest.fixture
def tiny_llama(tmp_path):
    src = tmp_path / "llama"
    model = make_causal_lm(src)
    return src, model


def make_ct_nvfp4(path: Path, model) -> None:
    """Quantize ``model`` with compressed-tensors' NVFP4A16 preset and save it packed
    (nvfp4-pack-quantized), as llm-compressor would: global scale 448·6/amax, per-16 scales."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    scheme = preset_name_to_scheme("NVFP4A16", targets=["Linear"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    with torch.no_grad():
        for _, m in model.named_modules():
            if not hasattr(m, "quantization_scheme"):
                continue
            w = m.weight.float()
            gs = generate_gparam(w.min(), w.max())
            m.weight_global_scale.data.copy_(gs)
            groups = w.unflatten(-1, (-1, 16))
            scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), m.quantization_scheme.weights,
                                         global_scale=gs)
            m.weight_scale.data = scale.to(m.weight_scale.dtype)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="nvfp4-pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(path)


def make_ct_fp8_block(path: Path, model, preset: str = "FP8_BLOCK") -> None:
    """Quantize ``model`` with compressed-tensors' FP8_BLOCK preset (e4m3 weights, one scale per
    128x128 block, dynamic e4m3 activations per token group of 128) and save it float-quantized, as
    llm-compressor would; lm_head stays bf16. compressed-tensors writes ``weight`` (e4m3) and
    ``weight_scale`` (a multiplier, in the model's dtype: bf16 [ceil(N/128), ceil(K/128)]).
    ``preset="FP8_DYNAMIC"`` makes its per-channel scheme instead (weight_scale [N, 1])."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = preset_name_to_scheme(preset, targets=["Linear"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    with torch.no_grad():
        for _, m in model.named_modules():
            if not hasattr(m, "quantization_scheme"):
                continue
            w = m.weight.float()
            if m.quantization_scheme.weights.strategy == "block":  # amax of each 128x128 block (edges partial)
                n, k = w.shape
                padded = torch.nn.functional.pad(w.abs(), (0, -k % 128, 0, -n % 128))
                amax = padded.unflatten(0, (-1, 128)).unflatten(-1, (-1, 128)).amax(dim=(1, 3))
            else:  # per output channel
                amax = w.abs().amax(dim=-1, keepdim=True)
            scale, _ = calculate_qparams(-amax, amax, m.quantization_scheme.weights)
            m.weight_scale.data = scale.to(m.weight_scale.dtype)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(path)


MODELOPT_SCRIPT = """
import sys, torch
import modelopt.torch.quantization as mtq
from modelopt.torch.export import export_hf_checkpoint
from transformers import LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).eval()
def calibrate(m):
    with torch.no_grad():
        m(torch.randint(0, m.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)))
model = mtq.quantize(model, mtq.NVFP4_DEFAULT_CFG, calibrate)
export_hf_checkpoint(model, export_dir=sys.argv[2])
"""


def make_modelopt_nvfp4(src: Path, dst: Path) -> None:
    """Quantize the bf16 checkpoint ``src`` with NVIDIA ModelOpt (NVFP4) and export it, in a
    subprocess so that ModelOpt's patches of torch/transformers stay out of the test process."""
    import subprocess
    import sys

    pytest.importorskip("modelopt", reason="nvidia-modelopt is installed by .ci/run")
    proc = subprocess.run([sys.executable, "-c", MODELOPT_SCRIPT, str(src), str(dst)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def make_hf_fp8(path: Path, bf16: Path, scale_fmt: str = "float") -> None:
    """Quantize the bf16 checkpoint ``bf16`` with transformers' own fine-grained FP8 quantizer
    (``FineGrainedFP8Config``, 128x128 blocks) and save it, as ``from_pretrained(...,
    quantization_config=...)`` + ``save_pretrained`` do on a GPU. transformers' ``validate_environment``
    refuses to quantize without a GPU although the quantization itself (``Fp8Quantize``) is plain
    torch, so only that check is skipped here: on an H100 (transformers 5.17) the same calls write
    byte-identical files with and without it skipped, for both scale formats.
    ``scale_fmt="ue8m0"`` (DeepSeek-V3.1's) rounds each block scale up to a power of two and stores
    it as float8_e8m0fnu. transformers quantizes only linears whose sides are both multiples of 128:
    others keep their bf16 weight beside an uninitialised ``weight_scale_inv`` (a broken
    checkpoint), so give it shapes that are (``num_key_value_heads=2`` for 128-row k/v)."""
    from unittest import mock

    from transformers import AutoModelForCausalLM, FineGrainedFP8Config
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    config = FineGrainedFP8Config(weight_block_size=[128, 128], scale_fmt=scale_fmt)
    with mock.patch.object(FineGrainedFP8HfQuantizer, "validate_environment", lambda self, *a, **k: None):
        model = AutoModelForCausalLM.from_pretrained(bf16, quantization_config=config, dtype=torch.bfloat16)
    model.save_pretrained(path)


MODELOPT_MANY_SCRIPT = """
import sys, torch
import modelopt.torch.quantization as mtq
from modelopt.torch.export import export_hf_checkpoint
from transformers import AutoModelForCausalLM
def calibrate(m):
    with torch.no_grad():
        m(torch.randint(0, m.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)))
for src, dst in zip(sys.argv[1::2], sys.argv[2::2]):
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    export_hf_checkpoint(mtq.quantize(model, mtq.NVFP4_DEFAULT_CFG, calibrate), export_dir=dst)
"""


def make_modelopt_nvfp4_many(pairs: list[tuple[Path, Path]]) -> None:
    """``make_modelopt_nvfp4`` for several (bf16 src, dst) pairs of any causal-LM family, in one
    subprocess (importing ModelOpt takes most of the time)."""
    import subprocess
    import sys

    pytest.importorskip("modelopt", reason="nvidia-modelopt is installed by .ci/run")
    args = [str(p) for pair in pairs for p in pair]
    proc = subprocess.run([sys.executable, "-c", MODELOPT_MANY_SCRIPT, *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
