"""Every format's module captures in a CUDA graph, on the kernels and on the reference path
(issue 22 item 4: no host → device copy, no data-dependent host sync inside any op), and the graph's
replay on fresh inputs computes what an eager call computes."""

import pytest
import torch

from swiglu_fused import FusedSwiGLUMLP
from swiglu_fused.kernels import dispatch, dispatch_nvfp4
from swiglu_fused.linear import PackedLinear

FORMATS = ["bf16", "fp8_block128", "nvfp4"]


def _weights(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) / s[1] ** 0.5 for s in shapes]


def _module(kind, fmt):
    if kind == "mlp":
        return FusedSwiGLUMLP.from_linear(*_weights((512, 256), (512, 256), (256, 512)), weight_format=fmt).cuda()
    return PackedLinear.from_weight(*_weights((384, 256)), weight_format=fmt).cuda()


def _replay_equals_eager(module, rows=16):
    static_x = torch.randn(rows, 256, device="cuda").to(torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        module(static_x)  # warm-up: kernels compile, one-time warnings fire, outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = module(static_x)
    fresh = torch.randn(rows, 256, device="cuda").to(torch.bfloat16)
    static_x.copy_(fresh)
    static_y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    expected = module(fresh)
    assert torch.isfinite(static_y).all()
    torch.testing.assert_close(static_y, expected, rtol=1e-6, atol=1e-6)  # the same kernels, the same inputs


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["mlp", "linear"])
@pytest.mark.parametrize("path", ["reference", "default"])
def test_module_captures_and_replays(fmt, kind, path, monkeypatch):
    if path == "reference":  # every op on the plain-torch reference, as on a GPU without the kernels
        monkeypatch.setattr(dispatch, "DISABLED", True)
    module = _module(kind, fmt)
    if kind == "mlp" and path == "reference":
        assert module.backend == "reference"
    with torch.no_grad():
        _replay_equals_eager(module)


@pytest.mark.parametrize("kind", ["mlp", "linear"])
def test_nvfp4_prefill_captures_and_replays(kind):
    """From dispatch_nvfp4.NVFP4_DEQUANT_M rows the nvfp4 ops dequantize the weight into a per-call bf16
    buffer first (DISPATCH D26): that allocation and kernel capture and replay as well."""
    module = _module(kind, "nvfp4")
    with torch.no_grad():
        _replay_equals_eager(module, rows=dispatch_nvfp4.NVFP4_DEQUANT_M)
