"""eager_graphs on the CPU: where it must stay out of the way (the replay path is in tests/gpu)."""

import copy

import pytest
import torch

from swiglu_fused import FusedSwiGLUMLP, eager_graphs


@pytest.mark.parametrize("rows,expected", [(1, 1), (2, 2), (3, 4), (5, 8), (33, 64), (64, 64)])
def test_bucket_is_the_next_power_of_two(rows, expected):
    assert eager_graphs.bucket(rows) == expected


def _mlp(fmt):
    g = torch.Generator().manual_seed(0)
    w = [torch.randn(*s, generator=g) / s[1] ** 0.5 for s in ((256, 128), (256, 128), (128, 256))]
    return FusedSwiGLUMLP.from_linear(*w, weight_format=fmt)


@pytest.mark.parametrize("fmt", ["fp8_block128", "bf16", "nvfp4"])
def test_cpu_modules_run_directly_and_copy(fmt):
    mlp = _mlp(fmt)
    assert mlp.eager_graph_rows == 64  # every format has sm90 kernels: graphs on CUDA, not here
    before = dict(eager_graphs.stats)
    x = torch.randn(2, 128).to(torch.bfloat16)
    y = mlp(x)
    assert eager_graphs.stats == before
    assert eager_graphs.run(mlp, x, mlp._ops_forward) is None  # a CPU tensor is never captured
    assert "eager_graph_rows" not in repr(mlp)  # shown only where it applies (sm90 backend)
    twin = copy.deepcopy(mlp)  # the graph cache lives outside the module
    assert twin.eager_graph_rows == 64 and torch.equal(twin(x), y)
