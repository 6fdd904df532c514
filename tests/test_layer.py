"""FusedSwiGLUMLP on the CPU (the reference ops): shapes, dtypes, M = 0, repr; tests/gpu/
test_layer_gpu.py runs the kernels behind it."""

import pytest
import torch

from swiglu_fused import FusedSwiGLUMLP
from swiglu_fused.kernels import reference

FORMATS = ["bf16", "fp8_block128", "nvfp4"]


def _mlp(fmt, hidden=256, inter=384, activation="silu"):
    g = torch.Generator().manual_seed(0)
    w = [torch.randn(*s, generator=g) / s[1] ** 0.5 for s in ((inter, hidden), (inter, hidden), (hidden, inter))]
    return FusedSwiGLUMLP.from_linear(*w, weight_format=fmt, activation=activation)


def _expected(mlp, x):
    return reference.mlp(x, mlp.gate_up_proj.tensors(), mlp.down_proj.tensors(), weight_format=mlp.weight_format,
                         interleave=mlp.interleave, act=mlp.activation, global_scale_kind=mlp.global_scale_kind)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_leading_dims_and_input_dtype(fmt, dtype):
    mlp = _mlp(fmt)
    x = torch.randn(2, 3, 256, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = mlp(x)
    assert y.shape == x.shape and y.dtype == dtype
    flat = _expected(mlp, x.reshape(6, 256))
    assert torch.equal(y.reshape(6, 256), flat)  # leading dims are only a reshape
    assert not y.isnan().any() and y.abs().sum() > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_input_returns_empty(fmt):
    mlp = _mlp(fmt)
    for shape in [(0, 256), (2, 0, 256)]:
        y = mlp(torch.empty(shape, dtype=torch.bfloat16))
        assert y.shape == shape and y.dtype == torch.bfloat16


def test_extra_repr_names_format_group_activation_and_backend():
    r = repr(_mlp("fp8_block128", activation="gelu_tanh"))
    for part in ("format=fp8_block128", "g=128", "activation=gelu_tanh", "backend=reference"):
        assert part in r, (part, r)
