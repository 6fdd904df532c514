"""The launches between kernels (DISPATCH D20): programmatic dependent launch of the fp8 MLP at
decode sizes. It changes nothing a kernel computes, so the check is bit-equality with the plain
launches, on chains where each kernel reads what the one before it wrote."""

import pytest
import torch

from swiglu_fused import FusedSwiGLUMLP
from swiglu_fused.kernels import dispatch

H, I = 2048, 4096


def _mlp(fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = [torch.randn(*s, generator=g) / s[1] ** 0.5 for s in ((I, H), (I, H), (H, I))]
    module = FusedSwiGLUMLP.from_linear(*w, weight_format=fmt).cuda()
    module.eager_graph_rows = 0  # (eager calls run the ops: these tests capture their own graphs)
    return module


def _chain(module, x, links=4):
    """links calls, each on the previous one's output: every quant_x / gate_up reads what the down
    before it wrote."""
    for _ in range(links):
        x = module(x)
    return x


def _graph(fn, x):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(x)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fn(x)
    return graph, y


@pytest.mark.parametrize("m", [1, 16, 64])
def test_fp8_decode_with_pdl_is_bit_identical(m, monkeypatch):
    """The fp8 MLP at M ≤ PDL_M launches quant_x, gate_up and down with PDL (each kernel's weights
    loaded before it waits for the previous one): a graph of a chain of calls gives exactly what
    the plain launches give."""
    module = _mlp("fp8_block128")
    x = torch.randn(m, H, device="cuda").to(torch.bfloat16)
    assert dispatch.pdl_applies(m, dispatch.FP8_MAINLOOP)
    with torch.no_grad():
        graph, y = _graph(lambda t: _chain(module, t), x)
        y.fill_(float("nan"))
        graph.replay()
        eager = _chain(module, x)
        torch.cuda.synchronize()
        monkeypatch.setattr(dispatch, "PDL_M", 0)
        plain = _chain(module, x)
    assert torch.equal(y, plain) and torch.equal(eager, plain)
