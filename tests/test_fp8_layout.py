"""fp8's tile-major weight order (kernels/fp8_layout.py): a k tile's 32 KB contiguous, the inverse
exact, and the configs that may read it (TileConfig.tile_major on the fp8 mainloop)."""

import pytest
import torch

from swiglu_fused.kernels import fp8_layout


def test_a_k_tile_is_one_contiguous_run_and_the_inverse_is_exact():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(512, 384, generator=g) * 100).to(torch.float8_e4m3fn)
    t = fp8_layout.to_tile_major(w)
    assert t.shape == w.shape and t.dtype == w.dtype
    flat = t.view(torch.uint8).reshape(-1)
    run = 256 * 128
    for n_tile, k_tile in ((0, 0), (0, 2), (1, 1)):
        start = (n_tile * 3 + k_tile) * run  # [N/256][K/128][256][128]
        block = w[256 * n_tile:256 * (n_tile + 1), 128 * k_tile:128 * (k_tile + 1)]
        assert torch.equal(flat[start:start + run], block.contiguous().view(torch.uint8).reshape(-1))
    assert torch.equal(fp8_layout.from_tile_major(t).view(torch.uint8), w.view(torch.uint8))


@pytest.mark.parametrize("shape,dtype", [((500, 384), torch.float8_e4m3fn), ((512, 200), torch.float8_e4m3fn),
                                         ((512, 384), torch.bfloat16)])
def test_weights_without_whole_k_tiles_are_refused(shape, dtype):
    with pytest.raises(ValueError, match="weight"):
        fp8_layout.to_tile_major(torch.zeros(shape, dtype=dtype))


def test_only_gate_up_and_down_tiles_of_the_fp8_mainloop_read_it():
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90.split import SplitConfig
    from swiglu_fused.kernels.sm90.tile_config import DownConfig, GateUpConfig

    GateUpConfig(tile_m=16, stages=5, swap_ab=True, tile_major=True)
    DownConfig(tile_m=128, stages=4, tile_major=True)
    with pytest.raises(ValueError, match="tile_major: the nvfp4 mainloop's weight layout, or the fp8"):
        GateUpConfig(tile_m=128, stages=4, mainloop="bf16", h_format="bf16", tile_major=True)
    SplitConfig(h_format="bf16", prefix=256)
    with pytest.raises(ValueError, match="or a tile-major fp8 weight"):  # (not measured there)
        SplitConfig(h_format="bf16", prefix=256, tile_major=True)
