"""The one-launch fp8 decode MLP's host side (kernels/sm90/decode_mlp.py): its plan and the tiles it
accepts. Its compile checks are test_kernels_cpu's; its numbers, tests/gpu/test_decode_mlp_gpu.py's."""

import dataclasses

import pytest

pytest.importorskip("cutlass")


def test_plan_counts_tiles_and_counter_words():
    from swiglu_fused.kernels.sm90 import decode_mlp

    # 4096x14336: gate_up 112 tiles of 32 k tiles, down 16 of 112; counters: the larger + 1, and two counts
    assert decode_mlp.plan(1, 4096, 14336, 132) == (112, 132, 16, 132, 115)
    assert decode_mlp.plan(1, 4096, 14336, 132, gate_up_stream_k=False) == (0, 132, 16, 132, 19)
    assert decode_mlp.plan(1, 4096, 14336, 132, down_split=4) == (112, 132, 16, 64, 115)  # 4 CTAs a down tile
    assert decode_mlp.plan(16, 8192, 3584, 132, down_split=8) == (28, 132, 32, 132, 35)  # (at most the SMs)
    assert decode_mlp.plan(1, 8192, 3584, 132, gate_up_split=2) == (28, 56, 32, 132, 35)  # gate_up on 56 CTAs
    assert decode_mlp.plan(1, 1152, 4608, 132) == (36, 132, 5, 132, 39)  # (down's last tile half past H)
    with pytest.raises(ValueError, match="fewer k tiles"):
        decode_mlp.plan(1, 512, 1024, 132)  # down: 2 tiles of 8 k tiles


def test_only_the_fp8_swap_ab_tiles_with_one_pipeline_are_taken():
    from swiglu_fused.kernels.sm90 import decode_mlp

    gu, dn = decode_mlp.mlp_configs()
    decode_mlp.check_configs(gu, dn)
    with pytest.raises(ValueError, match="stages"):
        decode_mlp.check_configs(dataclasses.replace(gu, stages=5), dn)
    with pytest.raises(ValueError, match="16-token swap-AB"):
        decode_mlp.check_configs(gu, dataclasses.replace(dn, mainloop="bf16"))
    with pytest.raises(ValueError, match="fp8 h"):
        decode_mlp.check_configs(dataclasses.replace(gu, h_format="bf16"), dn)
