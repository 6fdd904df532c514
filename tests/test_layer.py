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
    return reference.mlp(x, mlp.gate_up_interleaved.tensors(), mlp.down_proj.tensors(), weight_format=mlp.weight_format,
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


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cast", ["to_bf16", "half", "float", "to_fp16"])
def test_dtype_casts_leave_the_packed_tensors_as_stored(fmt, cast):
    """model.to(dtype) / .half() / .float() cast every floating tensor; the packed weights and scales
    keep their dtypes and bytes (a cast would break the kernels and overflow nvfp4's fp16 scale)."""
    mlp = _mlp(fmt)
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y = mlp(x)
    wrapped = torch.nn.Sequential(mlp)  # as inside a model
    {"to_bf16": lambda: wrapped.to(torch.bfloat16), "half": wrapped.half, "float": wrapped.float,
     "to_fp16": lambda: wrapped.to("cpu", torch.float16)}[cast]()
    for k, v in mlp.state_dict().items():
        assert v.dtype == before[k].dtype and torch.equal(v.view(torch.uint8), before[k].view(torch.uint8)), k
    assert torch.equal(mlp(x), y)


def test_integer_input_is_refused_by_name():
    with pytest.raises(TypeError, match="x: FusedSwiGLUMLP takes floating-point activations"):
        _mlp("bf16")(torch.ones(2, 256, dtype=torch.int64))


def test_wrong_hidden_size_is_refused_even_when_empty():
    with pytest.raises(ValueError, match="x: last dimension is 257, but this MLP's hidden size is 256"):
        _mlp("bf16")(torch.empty(0, 257))


def test_from_linear_refuses_biases():
    from swiglu_fused.formats import FormatError

    lin = [torch.nn.Linear(256, 384), torch.nn.Linear(256, 384, bias=False), torch.nn.Linear(384, 256, bias=False)]
    with pytest.raises(FormatError, match="gate: projections with a bias are not supported"):
        FusedSwiGLUMLP.from_linear(*lin, weight_format="bf16")


def test_backward_says_the_module_is_inference_only():
    x = torch.randn(2, 256, dtype=torch.bfloat16, requires_grad=True)
    y = _mlp("fp8_block128")(x)
    with pytest.raises(RuntimeError, match="has no gradient: FusedSwiGLUMLP and its ops are inference-only"):
        y.sum().backward()


def _nvfp4_mlp(kind):
    """_mlp("nvfp4") with its per-tensor scales stored as ``kind`` (from_linear stores divisors)."""
    src = _mlp("nvfp4")

    def stored(t):
        return {k: (1.0 / v if k == "weight_global_scale" and kind == "multiplier" else v).clone() for k, v in t.items()}
    return FusedSwiGLUMLP(stored(src.gate_up_interleaved.tensors()), stored(src.down_proj.tensors()),
                          weight_format="nvfp4", global_scale_kind=kind)


@pytest.mark.parametrize("kind", ["divisor", "multiplier"])
def test_global_scale_multiplier_follows_reloads_and_reassigned_buffers(kind):
    """The module turns nvfp4's per-tensor scales into the ops' fp32 multipliers once (not a kernel
    launch a call); a state dict loaded in place and a buffer assigned directly must reach forward,
    for both kinds (a multiplier stored as fp32 is the buffer itself)."""
    mlp, other = _nvfp4_mlp(kind), _nvfp4_mlp(kind)
    with torch.no_grad():  # the same weights, other per-tensor scales
        for p in (other.gate_up_interleaved, other.down_proj):
            p.weight_global_scale.mul_(1.5)
            p.settle_layout()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    assert torch.equal(mlp(x), _expected(mlp, x)) and not torch.equal(mlp(x), other(x))
    mlp.load_state_dict(other.state_dict())  # copies into the buffers in place
    assert torch.equal(mlp(x), _expected(other, x)) and torch.equal(mlp(x), other(x))
    new = mlp.down_proj.weight_global_scale * 2  # a new tensor assigned, settle_layout not called
    mlp.down_proj.weight_global_scale = new
    assert torch.equal(mlp(x), _expected(mlp, x)) and not torch.equal(mlp(x), other(x))
