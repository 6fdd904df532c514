"""The launches between kernels: programmatic dependent launch of the fp8 MLP at decode sizes
(DISPATCH D20), and the stream-K tile counters kept zeroed (a buffer a stream, one a CUDA graph
capture) instead of a memset a launch (D19, schedule.stream_k_counters). Neither changes what a
kernel computes, so the check is bit-equality with plain launches, on chains where each kernel reads
what the one before it wrote, eager, in CUDA graphs replayed in any order, on two streams at once
(eager and graphs) and under torch.compile's CUDA-graph trees. (conftest.py checks after every GPU
test that the counters are back at zero.)"""

import pytest
import torch

from swiglu_fused import FusedSwiGLUMLP
from swiglu_fused.kernels import dispatch, dispatch_nvfp4

from benchmarks.harness import with_configs

from .tolerance import rel_frobenius

pytest.importorskip("cutlass")
from swiglu_fused.kernels.sm90 import schedule  # noqa: E402

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


@pytest.mark.parametrize("m", [1, 16, 64, 200])
def test_nvfp4_with_pdl_is_bit_identical(m):
    """The nvfp4 MLP with PDL (each kernel prefetching its first k tiles into L2 before it waits
    for the one before): a graph of chained calls, and the eager calls, give exactly the plain
    launches' output."""
    module = _mlp("nvfp4")
    pdl = with_configs(module, {"gate_up": {"pdl": True}, "down": {"pdl": True}})  # (not dispatched for nvfp4)
    x = torch.randn(m, H, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        plain = _chain(module, x)
        graph, y = _graph(lambda t: _chain(pdl, t), x)
        y.fill_(float("nan"))
        graph.replay()
        eager = _chain(pdl, x)
        torch.cuda.synchronize()
    assert torch.equal(y, plain) and torch.equal(eager, plain)


def _memset_counters(monkeypatch):
    """What every launch did before: a zeroed counter tensor of its own."""
    monkeypatch.setattr(schedule, "REUSE_COUNTERS", False)


def _nvfp4_stream_k(m):
    """Whether this nvfp4 MLP's gate_up or down at M rows runs stream-K, with counters (else a test
    of them would test nothing)."""
    from swiglu_fused.kernels.sm90.tile_config import DownConfig, GateUpConfig

    nvfp4 = dispatch.NVFP4_MAINLOOP
    g = GateUpConfig(act="silu", h_format="bf16", mainloop=nvfp4, **dispatch_nvfp4.nvfp4_tile_for(m))
    d = DownConfig(mainloop=nvfp4, **dispatch_nvfp4.nvfp4_tile_for(m, "down"))
    sms = schedule.sm_count(torch.device("cuda"))
    return schedule.schedule(g, m, 2 * I, H, sms)[1] > 0 or schedule.schedule(d, m, H, I, sms)[1] > 0


@pytest.mark.parametrize("m", [1, 16, 200])
def test_counters_kept_a_stream_are_bit_identical_to_a_memset_a_launch(m, monkeypatch):
    """Eager chains on one stream share its counter buffer: same output as a zeroed tensor a
    launch, and the buffer back at zero after."""
    assert _nvfp4_stream_k(m)
    module = _mlp("nvfp4")
    x = torch.randn(m, H, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        y = _chain(module, x)
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        assert not schedule._EAGER_COUNTERS[(stream.device_index, stream.cuda_stream)].any()
        _memset_counters(monkeypatch)
        plain = _chain(module, x)
    assert torch.equal(y, plain)


def test_graphs_with_counters_replay_in_any_order():
    """Each capture takes counters of its own (zero, and left at zero by every replay), eager calls
    their stream's: graphs of the same module replayed in any order, between eager calls, give what
    eager calls give."""
    module = _mlp("nvfp4")
    xs = [torch.randn(m, H, device="cuda").to(torch.bfloat16) for m in (16, 200)]
    with torch.no_grad():
        graphs = []
        for x in xs:
            graphs.append(_graph(lambda t: _chain(module, t), x))
            assert schedule._CAPTURE_COUNTERS and None not in schedule._CAPTURE_COUNTERS.values()  # (no memset)
        expected = [_chain(module, x) for x in xs]
        for i in (1, 0, 0, 1):
            graphs[i][1].fill_(float("nan"))
            graphs[i][0].replay()
            eager = _chain(module, xs[1 - i])
            torch.cuda.synchronize()
            assert torch.equal(graphs[i][1], expected[i]) and torch.equal(eager, expected[1 - i])


def _on_two_streams(fns, rounds=8):
    """fns[i]() run on stream i, ``rounds`` times each, the two streams free to overlap: the outputs."""
    streams = [torch.cuda.Stream() for _ in fns]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = [[], []]
    for _ in range(rounds):
        for s, fn, out in zip(streams, fns, outs):
            with torch.cuda.stream(s):
                out.append(fn())
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return outs


def test_graphs_of_one_module_replayed_on_two_streams_at_once():
    """Two graphs holding the same weights, replayed at once on two streams, do not share counters."""
    module = _mlp("nvfp4")
    xs = [torch.randn(16, H, device="cuda").to(torch.bfloat16) for _ in range(2)]
    with torch.no_grad():
        graphs = [_graph(lambda t: _chain(module, t), x) for x in xs]
        expected = [_chain(module, x) for x in xs]
        outs = _on_two_streams([lambda g=g, y=y: (g.replay(), y.clone())[1] for g, y in graphs])
    for out, e in zip(outs, expected):
        assert all(torch.equal(o, e) for o in out)


def test_counters_on_two_streams_at_once():
    """Eager launches on two streams that may overlap use a buffer each."""
    module = _mlp("nvfp4")
    xs = [torch.randn(16, H, device="cuda").to(torch.bfloat16) for _ in range(2)]
    with torch.no_grad():
        expected = [_chain(module, x) for x in xs]
        outs = _on_two_streams([lambda x=x: _chain(module, x) for x in xs])
    for out, e in zip(outs, expected):
        assert all(torch.equal(o, e) for o in out)


def test_counters_under_cuda_graph_trees():
    """torch.compile(mode="reduce-overhead") records and replays CUDA-graph trees, whose warm-up
    runs take the current stream's allocations into the trees' pool: eager calls of the same module
    before, between and after still match, and the counters stay at zero."""
    module = _mlp("nvfp4")
    compiled = torch.compile(module, mode="reduce-overhead", fullgraph=True)
    xs = [torch.randn(m, H, device="cuda").to(torch.bfloat16) for m in (1, 16, 200)]
    with torch.no_grad():
        expected = [module(x) for x in xs]
        for _ in range(3):
            for x, e in zip(xs, expected):
                y = compiled(x).clone()
                assert torch.equal(module(x), e)
                assert rel_frobenius(y, e) < 1e-6  # (as test_nvfp4_gpu's torch.compile test)
