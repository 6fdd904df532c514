"""The vLLM plugin's tensor-parallel arithmetic and its import without vLLM (issue 23; no vLLM
needed: the serving tests are tests/test_vllm_serving.py)."""

import subprocess
import sys

import pytest

from swiglu_fused import formats
from swiglu_fused.formats import FormatError
from swiglu_fused.integrations import vllm_layout as plugin

FP8, NVFP4, BF16 = (formats.weight_format(n) for n in ("fp8_block128", "nvfp4", "bf16"))


def test_importing_the_package_and_the_plugin_module_needs_no_vllm():
    code = ("import sys; sys.modules['vllm'] = None\n"  # any import of vllm now raises ImportError
            "import swiglu_fused, swiglu_fused.integrations.vllm, swiglu_fused.integrations.vllm_layout as p\n"
            "print(p.valid_tp_sizes(384, 128, swiglu_fused.formats.weight_format('fp8_block128')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[1, 3]", proc.stderr


def test_granules_are_the_formats_blocks():
    assert [plugin.granule(FP8, s, a) for s in ("weight", "weight_scale_inv") for a in (0, 1)] == [1, 1, 128, 128]
    assert [plugin.granule(NVFP4, s, 1) for s in ("weight_packed", "weight_scale")] == [2, 16]
    assert plugin.granule(NVFP4, "weight_scale", 0) == 1


def test_shard_ranges():
    # fp8 down [H, I = 512] at T = 2: rank 1 holds columns [256, 512) = scale columns [2, 4)
    assert plugin.shard_range(FP8, "weight_scale_inv", 1, 256, 256, 512) == (2, 2)
    assert plugin.shard_range(FP8, "weight", 1, 256, 256, 512) == (256, 256)
    assert plugin.shard_range(FP8, "weight_scale_inv", 0, 64, 64, 128) is None  # splits a 128-row block
    assert plugin.shard_range(FP8, "weight_scale_inv", 0, 128, 64, 192) == (1, 1)  # the partial last block
    assert plugin.shard_range(NVFP4, "weight_packed", 1, 32, 32, 64) == (16, 16)
    assert plugin.shard_range(NVFP4, "weight_scale", 1, 8, 8, 16) is None


@pytest.mark.parametrize("fmt, inter, g, valid", [
    (FP8, 384, 128, [1, 3]), (FP8, 14336, 128, [1, 2, 4, 7, 8, 14, 16, 28, 56, 112]),
    (BF16, 384, 64, [1, 2, 3, 6]), (NVFP4, 96, 1, [1, 2, 3, 6]),  # nvfp4: I/T in whole 16-column scale groups
])
def test_valid_tensor_parallel_sizes(fmt, inter, g, valid):
    assert plugin.valid_tp_sizes(inter, g, fmt) == valid


def test_an_invalid_size_names_the_valid_ones_and_a_finer_interleave():
    cfg = formats.PackedConfig("bf16", 128, "silu", ("m",))
    with pytest.raises(FormatError) as e:
        plugin.check_tensor_parallel(cfg, 384, 2)
    msg = str(e.value)
    assert "tensor_parallel_size 2" in msg and "I/T = 192 is not a multiple of the interleave g = 128" in msg
    assert "Valid tensor-parallel sizes for it: 1, 3" in msg and "--interleave 96" in msg
    plugin.check_tensor_parallel(cfg, 384, 3)  # valid: no error
