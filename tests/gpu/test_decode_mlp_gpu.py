"""The fp8 MLP at decode in one launch (kernels/sm90/decode_mlp.py; measured, not dispatched): h within
DESIGN §4 of reference.gate_up, y within bf16 rounding of reference.down on that h, the same bits at
every launch and in a CUDA graph's replays, and the counters left zero (conftest) — with gate_up's
tiles whole or stream-K, with PDL, and where H leaves down a partial last tile (1152)."""

import zlib

import pytest
import torch

from swiglu_fused import quant
from swiglu_fused.kernels import fp8_layout, reference
from . import test_gate_up_gpu as gate_up_tests
from .tolerance import assert_bf16_close

pytest.importorskip("cutlass")

SHAPES = [(4096, 14336), (8192, 3584), (1152, 4608)]
PLANS = [dict(gate_up_stream_k=True), dict(gate_up_stream_k=False, down_split=4), dict(down_split=2, pdl=True),
         dict(gate_up_split=2, fixup_unroll=4)]


def make_operands(m, hidden, inter):
    seed = zlib.crc32(repr(("decode_mlp", m, hidden, inter)).encode())
    args = gate_up_tests.make_operands(m, hidden, inter, "fp8_block128", seed=seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    wd, wds = quant.quantize_fp8_block(torch.randn(hidden, inter, device="cuda", generator=g) * 0.05)
    return args, wd, wds


def poisoned(m, hidden, inter):
    h = torch.full((m, inter), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)  # e4m3 NaN
    hs = torch.full((inter // 128, m), float("nan"), device="cuda").t()
    y = torch.full((m, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    return h, hs, y


@pytest.mark.parametrize("plan", PLANS, ids=["sk", "whole-d4", "sk-d2-pdl", "g2-u4"])
@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 16])
def test_decode_mlp_matches_the_reference(m, hidden, inter, plan):
    from swiglu_fused.kernels.sm90.decode_mlp import decode_mlp

    args, wd, wds = make_operands(m, hidden, inter)
    w_tiled = fp8_layout.to_tile_major(args["weight"])
    h, hs, y = poisoned(m, hidden, inter)
    decode_mlp(args["x"], args["x_scale"], w_tiled, args["weight_scale"], wd, wds, out=y, h_out=(h, hs), **plan)
    gate_up_tests.assert_matches_reference(h, hs, args, "silu", "fp8_group128")
    assert_bf16_close(y, reference.down(h, wd, wds, hs))
    for _ in range(3):  # the same bits at every launch (the counts start at zero each time)
        again = decode_mlp(args["x"], args["x_scale"], w_tiled, args["weight_scale"], wd, wds, **plan)
        assert torch.equal(again, y)


def test_decode_mlp_replays_in_a_cuda_graph():
    """Captured once, replayed: each replay computes the MLP of the current x (the counts the
    capture's launch left at zero serve every replay)."""
    from swiglu_fused.kernels.sm90.decode_mlp import decode_mlp

    m, hidden, inter = 4, 4096, 14336
    args, wd, wds = make_operands(m, hidden, inter)
    w_tiled = fp8_layout.to_tile_major(args["weight"])
    x, xs = args["x"].clone(), args["x_scale"].clone()
    want = decode_mlp(x, xs, w_tiled, args["weight_scale"], wd, wds)  # (compiles; the counters' buffer)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        y = decode_mlp(x, xs, w_tiled, args["weight_scale"], wd, wds)
    torch.cuda.current_stream().wait_stream(s)
    for i in range(3):
        x.copy_(args["x"] if i % 2 == 0 else torch.flip(args["x"].view(torch.uint8), (0,)).view(x.dtype))
        xs.copy_(args["x_scale"] if i % 2 == 0 else torch.flip(args["x_scale"], (0,)))
        graph.replay()
        expect = want if i % 2 == 0 else torch.flip(want, (0,))
        assert torch.equal(y, expect)


def test_decode_mlp_refuses_what_it_cannot_run():
    from swiglu_fused.kernels.sm90.decode_mlp import decode_mlp

    args, wd, wds = make_operands(17, 4096, 14336)
    with pytest.raises(ValueError, match="17 rows"):
        decode_mlp(args["x"], args["x_scale"], fp8_layout.to_tile_major(args["weight"]), args["weight_scale"], wd, wds)
