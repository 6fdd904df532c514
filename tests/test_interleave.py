"""Interleave / de-interleave: exact inverses for any g dividing I, for every tensor kind."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swiglu_fused.formats import FormatError
from swiglu_fused import interleave as il
from swiglu_fused.weight_packing import pack
from swiglu_fused import quant


@st.composite
def gate_up_pair(draw):
    chunks = draw(st.integers(1, 6))
    g = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    cols = draw(st.integers(1, 9))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float32, torch.uint8, torch.float8_e4m3fn]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    def t():
        x = torch.randn(chunks * g, cols, generator=gen) * 10
        return x.to(torch.uint8) if dtype == torch.uint8 else x.to(dtype)
    return t(), t(), g


def _bytes(t):
    return t.contiguous().view(torch.uint8)


@settings(max_examples=60, deadline=None)
@given(gate_up_pair())
def test_interleave_round_trip_is_exact(pair):
    gate, up, g = pair
    packed = il.interleave_rows(gate, up, g)
    assert packed.shape == (2 * gate.shape[0], gate.shape[1])
    g2, u2 = il.deinterleave_rows(packed, g)
    assert torch.equal(_bytes(g2), _bytes(gate)) and torch.equal(_bytes(u2), _bytes(up))


@settings(max_examples=60, deadline=None)
@given(gate_up_pair())
def test_packed_layout_is_chunks_of_gate_then_up(pair):
    gate, up, g = pair
    packed = il.interleave_rows(gate, up, g)
    for j in range(gate.shape[0] // g):
        assert torch.equal(_bytes(packed[2 * j * g:2 * j * g + g]), _bytes(gate[j * g:(j + 1) * g]))
        assert torch.equal(_bytes(packed[2 * j * g + g:2 * (j + 1) * g]), _bytes(up[j * g:(j + 1) * g]))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_h_columns_keep_the_original_intermediate_order(chunks, g):
    """Tile j of the fused GEMM reads packed rows [2jg, 2jg+2g) and writes h columns [jg, (j+1)g):
    follow the original row indices through the packing and check they come out in order."""
    inter = chunks * g
    idx = torch.arange(inter)
    packed = il.interleave_rows(idx, idx + inter, g)  # up rows tagged with + I
    for j in range(chunks):
        tile = packed[2 * j * g:2 * (j + 1) * g]
        assert torch.equal(tile[:g], idx[j * g:(j + 1) * g])  # gate of h columns jg..
        assert torch.equal(tile[g:] - inter, idx[j * g:(j + 1) * g])  # and their up
    assert torch.equal(il.h_column_order(inter, g), idx)


@pytest.mark.parametrize("g", [128, 256, 384])
def test_fp8_block_scales_move_with_their_rows(g):
    inter, cols = 768, 320
    gate, up = torch.randn(inter, cols), torch.randn(inter, cols) * 3
    (gq, gs), (uq, us) = quant.quantize_fp8_block(gate), quant.quantize_fp8_block(up)
    packed_w = il.interleave_rows(gq, uq, g)
    packed_s = il.interleave_block_scales(gs, us, g)
    # Quantizing the packed matrix directly gives the same bytes: blocks stayed whole.
    direct_w, direct_s = quant.quantize_fp8_block(il.interleave_rows(gate, up, g))
    assert torch.equal(_bytes(packed_w), _bytes(direct_w)) and torch.equal(packed_s, direct_s)
    back = il.deinterleave_block_scales(packed_s, g)
    assert torch.equal(back[0], gs) and torch.equal(back[1], us)


def test_fp8_block_scales_need_whole_blocks():
    s = torch.ones(6, 3)
    with pytest.raises(FormatError, match="multiple of 128"):
        il.interleave_block_scales(s, s, 64)


@pytest.mark.parametrize("g", [1, 16, 128])
def test_nvfp4_pack_unpack_round_trip(g):
    inter, cols = 256, 96
    gate = pack.quantize(torch.randn(inter, cols), "nvfp4", "gate")
    up = pack.quantize(torch.randn(inter, cols) * 5, "nvfp4", "up")
    packed = pack.pack_gate_up(gate, up, g)
    assert packed["weight_global_scale"].shape == (2,)
    g2, u2 = pack.unpack_gate_up(packed, "nvfp4", g, "divisor")
    for a, b in ((g2, gate), (u2, up)):
        for k in b.tensors:
            assert torch.equal(_bytes(a.tensors[k]), _bytes(b.tensors[k].reshape(a.tensors[k].shape))), k


def test_mismatched_gate_and_up_are_refused():
    with pytest.raises(FormatError, match="same shape"):
        il.interleave_rows(torch.zeros(4, 3), torch.zeros(4, 2), 2)
    with pytest.raises(FormatError, match="dividing I"):
        il.interleave_rows(torch.zeros(6, 3), torch.zeros(6, 3), 4)
