"""FusedSwiGLUMLP on the GPU: kernels behind it, against the reference; CUDA graphs; torch.compile."""

import pytest
import torch

from swiglu_fused import FusedSwiGLUMLP
from swiglu_fused.kernels import ops, reference
from swiglu_fused.weight_packing import pack

from .tolerance import assert_bf16_close


def _mlp(hidden, inter, fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = [torch.randn(*s, generator=g) / s[1] ** 0.5 for s in ((inter, hidden), (inter, hidden), (hidden, inter))]
    return FusedSwiGLUMLP.from_linear(*w, weight_format=fmt).cuda()


def _reference(mlp, x):
    cpu = {k: v.cpu() for k, v in mlp.gate_up_interleaved.tensors().items()}, {k: v.cpu() for k, v in mlp.down_proj.tensors().items()}
    return reference.mlp(x.cpu(), *cpu, weight_format=mlp.weight_format, interleave=mlp.interleave,
                         act=mlp.activation, global_scale_kind=mlp.global_scale_kind)


@pytest.mark.parametrize("fmt", ["fp8_block128", "bf16"])
@pytest.mark.parametrize("hidden,inter,m", [(4096, 14336, 64), (4096, 14336, 1), (2048, 8192, 300)])
def test_layer_runs_the_kernels_and_matches_the_reference(fmt, hidden, inter, m):
    mlp = _mlp(hidden, inter, fmt)
    assert mlp.backend == "sm90"
    x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
    assert_bf16_close(mlp(x), _reference(mlp, x).cuda())


def test_layer_nvfp4_on_cuda_runs_the_w4a16_kernels():  # (test_nvfp4_gpu.py has the matrix)
    mlp = _mlp(512, 1024, "nvfp4")
    assert mlp.backend == "sm90"
    x = torch.randn(2, 3, 512, device="cuda").to(torch.bfloat16)
    assert_bf16_close(mlp(x), _reference(mlp, x).cuda())


@pytest.mark.parametrize("fmt", ["fp8_block128", "bf16"])
def test_leading_dims_fp16_and_empty_input(fmt):
    mlp = _mlp(1024, 2048, fmt)
    x = torch.randn(2, 5, 1024, device="cuda").to(torch.float16)
    y = mlp(x)
    assert y.shape == x.shape and y.dtype == torch.float16
    assert_bf16_close(y, _reference(mlp, x).cuda())
    assert mlp(torch.empty(0, 1024, device="cuda", dtype=torch.bfloat16)).shape == (0, 1024)


@pytest.mark.parametrize("m,residual", [(1, False), (10, True), (300, False), (300, True)])
def test_ops_down_matches_the_reference(m, residual):
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(m, 3584, device="cuda", generator=g)
    hq, hs = reference.quant_x(h)
    wq, ws = pack.quantize(torch.randn(8192, 3584, device="cuda", generator=g) * 0.02, "fp8_block128", "d").tensors.values()
    res = torch.randn(m, 8192, device="cuda", generator=g).to(torch.bfloat16) if residual else None
    y = torch.full((m, 8192), float("nan"), device="cuda", dtype=torch.bfloat16)
    y.copy_(ops.down(hq, wq, ws, hs, residual=res))
    assert_bf16_close(y, reference.down(hq, wq, ws, hs, residual=res))


@pytest.mark.parametrize("fmt", ["fp8_block128", "bf16"])
def test_cuda_graph_capture_and_replay(fmt):
    mlp = _mlp(4096, 14336, fmt)
    static_x = torch.randn(16, 4096, device="cuda").to(torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mlp(static_x)  # warm-up compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = mlp(static_x)
    fresh = torch.randn(16, 4096, device="cuda").to(torch.bfloat16)
    static_x.copy_(fresh)
    static_y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_bf16_close(static_y, mlp(fresh))


@pytest.mark.parametrize("fmt", ["fp8_block128", "bf16"])
def test_torch_compile_fullgraph(fmt):
    mlp = _mlp(2048, 8192, fmt)
    x = torch.randn(4, 2048, device="cuda").to(torch.bfloat16)
    compiled = torch.compile(mlp, fullgraph=True)
    assert_bf16_close(compiled(x), mlp(x))
