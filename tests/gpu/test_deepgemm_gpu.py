"""down on DeepGEMM (kernels/deepgemm.py), where deep_gemm imports (a peer built on the GPU machine
from ../shared/peers/deepgemm; never a dependency): ops.down dispatches fp8_block128 with bf16 out
and no residual to it from deepgemm.MIN_M rows, and its y is within DESIGN §4 of the reference;
other operands keep their paths; a FusedSwiGLUMLP runs it in eager and in a CUDA graph;
SWIGLU_FUSED_DEEPGEMM=0 (deepgemm.ENABLED) leaves it out."""

import zlib

import pytest
import torch

from swiglu_fused.kernels import deepgemm, dispatch, ops, reference

from .test_down_gpu import make_operands
from .test_layer_gpu import _mlp, _reference
from .tolerance import assert_bf16_close

pytest.importorskip("cutlass")
if deepgemm.module() is None:
    pytest.skip("deep_gemm does not import here", allow_module_level=True)


@pytest.fixture
def dg_calls(monkeypatch):
    """Counts the calls that reach DeepGEMM's GEMM."""
    calls = []
    dg = deepgemm.module()
    gemm = dg.fp8_gemm_nt

    def spy(*args, **kwargs):
        calls.append(args[0][0].shape)
        return gemm(*args, **kwargs)
    monkeypatch.setattr(dg, "fp8_gemm_nt", spy)
    return calls


def _operands(m, hidden, inter, residual=False):
    seed = zlib.crc32(repr(("deepgemm", m, hidden, inter, residual)).encode())
    return make_operands(m, hidden, inter, "fp8_block128", residual, seed)


@pytest.mark.parametrize("hidden,inter", [(4096, 14336), (8192, 3584), (2048, 8192)])
@pytest.mark.parametrize("m", [17, 40, 64, 100, 1024, 4096])  # (from deepgemm.MIN_M)
def test_down_runs_on_deepgemm_within_tolerance(m, hidden, inter, dg_calls):
    args = _operands(m, hidden, inter)
    backend, _ = dispatch.down_backend(args["h"], args["weight"], args["weight_scale"], args["h_scale"], None, None,
                                       torch.bfloat16)
    assert backend == dispatch.DEEPGEMM
    y = ops.down(args["h"], args["weight"], args["weight_scale"], args["h_scale"])
    assert dg_calls == [(m, inter)]
    assert y.shape == (m, hidden) and y.dtype == torch.bfloat16
    assert_bf16_close(y, reference.down(**args))


@pytest.mark.parametrize("m,hidden,residual,out_dtype", [(1, 4096, False, torch.bfloat16),
                                                         (16, 4096, False, torch.bfloat16),
                                                         (64, 4096, True, torch.bfloat16),
                                                         (64, 4096, False, torch.float32),
                                                         (64, 576, False, torch.bfloat16)])
def test_other_operands_keep_their_path(m, hidden, residual, out_dtype, dg_calls):
    """M below MIN_M, a residual, an fp32 y, N not whole 128-row blocks: not DeepGEMM's."""
    args = _operands(m, hidden, 1536, residual)
    y = ops.down(args["h"], args["weight"], args["weight_scale"], args["h_scale"], residual=args["residual"],
                 out_dtype=out_dtype)
    assert dg_calls == []
    assert_bf16_close(y.to(torch.bfloat16), reference.down(**args))


def test_switched_off_it_is_not_used(monkeypatch, dg_calls):
    monkeypatch.setattr(deepgemm, "ENABLED", False)
    args = _operands(64, 4096, 14336)
    assert dispatch.down_backend(args["h"], args["weight"], args["weight_scale"], args["h_scale"], None, None,
                                 torch.bfloat16)[0] != dispatch.DEEPGEMM
    ops.down(args["h"], args["weight"], args["weight_scale"], args["h_scale"])
    assert dg_calls == []


def test_module_runs_it_eager_and_in_a_cuda_graph(dg_calls):
    mlp = _mlp(2048, 8192, "fp8_block128")
    x = torch.randn(64, 2048, device="cuda").to(torch.bfloat16)
    want = _reference(mlp, x).cuda()
    y = mlp(x)  # (also DeepGEMM's JIT compile for this shape, before the capture)
    assert dg_calls and all(shape == (64, 8192) for shape in dg_calls)
    assert_bf16_close(y, want)
    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mlp(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = mlp(static_x)
    static_x.copy_(torch.randn(64, 2048, device="cuda").to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert_bf16_close(static_y, _reference(mlp, static_x).cuda())


def test_a_failing_deepgemm_warns_once_and_the_other_paths_take_over(monkeypatch):
    """Its JIT may fail where an installation lacks a CUDA toolkit: that call and the later ones
    run on our kernel or cuBLAS, with one warning."""
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("nvcc not found (a stand-in for a JIT failure)")
    monkeypatch.setattr(deepgemm.module(), "fp8_gemm_nt", broken)
    monkeypatch.setattr(deepgemm, "_failed", False)
    args = _operands(64, 4096, 14336)
    with pytest.warns(UserWarning, match="DeepGEMM failed .*RuntimeError: nvcc not found"):
        y = ops.down(args["h"], args["weight"], args["weight_scale"], args["h_scale"])
    assert_bf16_close(y, reference.down(**args))
    assert dispatch.down_backend(args["h"], args["weight"], args["weight_scale"], args["h_scale"], None, None,
                                 torch.bfloat16)[0] != dispatch.DEEPGEMM
    assert_bf16_close(ops.down(args["h"], args["weight"], args["weight_scale"], args["h_scale"]),
                      reference.down(**args))
    assert calls == [1]
