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


def test_a_module_holding_gate_ups_fp8_weight_tile_major_keeps_its_outputs_and_its_checkpoint(monkeypatch):
    """dispatch.fp8_tile_major (on an sm90 GPU, forced here): the module holds gate_up's fp8
    weight tile-major where it says so (down's stays packed: cuBLAS and DeepGEMM read only that);
    forward reads it through the ops (here the reference) to the same bits, state_dict gives the
    packed order, and a load or a move settles the order again."""
    from swiglu_fused import FusedSwiGLUMLP
    from swiglu_fused.kernels import dispatch

    g = torch.Generator().manual_seed(3)
    gate, up, down = torch.randn(512, 256, generator=g), torch.randn(512, 256, generator=g), torch.randn(256, 512, generator=g)
    plain = FusedSwiGLUMLP.from_linear(gate, up, down, weight_format="fp8_block128")
    monkeypatch.setattr(dispatch, "fp8_tile_major", lambda w: fp8_layout.fits(*w.shape))
    held = FusedSwiGLUMLP.from_linear(gate, up, down, weight_format="fp8_block128")
    assert held.gate_up_interleaved.tile_major and not held.down_proj.tile_major
    packed = plain.gate_up_interleaved.kernel_tensors()["weight"]
    assert torch.equal(held.gate_up_interleaved.kernel_tensors()["weight"].view(torch.uint8),
                       fp8_layout.to_tile_major(packed).view(torch.uint8))
    x = torch.randn(5, 256, generator=g).to(torch.bfloat16)
    assert torch.equal(held(x), plain(x))
    state = held.state_dict()
    assert all(torch.equal(state[k].view(torch.uint8) if state[k].dtype == torch.float8_e4m3fn else state[k],
                           v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v)
               for k, v in plain.state_dict().items())
    again = FusedSwiGLUMLP.from_linear(gate * 2, up, down, weight_format="fp8_block128")
    again.load_state_dict(state)
    assert again.gate_up_interleaved.tile_major and torch.equal(again(x), plain(x))
    monkeypatch.setattr(dispatch, "fp8_tile_major", lambda w: False)
    again.to("cpu", torch.bfloat16)  # a move settles the order again: packed where dispatch says so
    assert not again.gate_up_interleaved.tile_major and torch.equal(again(x), plain(x))


def test_ops_take_a_tile_major_fp8_weight_for_gate_up_only():
    from swiglu_fused import quant
    from swiglu_fused.kernels import ops, reference

    g = torch.Generator().manual_seed(4)
    w, ws = quant.quantize_fp8_block(torch.randn(512, 256, generator=g))
    x, xs = reference.quant_x(torch.randn(3, 256, generator=g).to(torch.bfloat16))
    h, hs = ops.gate_up(x, fp8_layout.to_tile_major(w), ws, xs, None, tile_major=True, h_format="fp8_group128")
    h0, hs0 = ops.gate_up(x, w, ws, xs, None, h_format="fp8_group128")
    assert torch.equal(h.view(torch.uint8), h0.view(torch.uint8)) and torch.equal(hs, hs0)
    with pytest.raises(ValueError, match="tile_major: only an fp8 weight with N a multiple of 256"):
        ops.gate_up(x, w[:256 + 128], ws[:3], xs, None, tile_major=True, h_format="fp8_group128")
    dw, dws = quant.quantize_fp8_block(torch.randn(256, 256, generator=g))
    with pytest.raises(ValueError, match="tile_major: only an nvfp4 weight"):  # down's backends read it packed
        ops.down(x, fp8_layout.to_tile_major(dw), dws, xs, tile_major=True)
