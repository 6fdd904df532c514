"""CUDA graphs for eager, decode-sized calls of FusedSwiGLUMLP.

Why: eager decode (transformers' ``generate()`` without torch.compile, batch 1) is host-bound.
The three ops of the fused MLP cost 0.6–1 ms of host time per call against about 90 µs of GPU
time (benchmarks/history/mlp.md, "generate() and host overhead"), so a patched model decoded *slower*
than the unpatched one. Replaying a captured graph costs a few µs of host time whatever it holds.

What: the first eager call with a given number of rows (rounded up to a power of two, at most
``MAX_ROWS``) on a given stream warms the path up, captures quant_x → gate_up → down into a CUDA
graph, and later calls copy x into the graph's static input, replay, and return a copy of the
static output. Rows are independent in the MLP, so the padding rows (whatever an earlier call
left in the static input) cannot change the real rows.

When: only plain eager calls on the sm90 backend. Inside torch.compile, inside another CUDA graph
capture (vLLM, torch.compile's cudagraphs: the ops are captured there as usual), under a dispatch
mode, for tensor subclasses or inputs that require grad, the ops run directly. Turn it off per
module with ``module.eager_graph_rows = 0`` or for the process with
``SWIGLU_FUSED_EAGER_GRAPHS=0``.

Safety:
- Graphs are keyed by (rows bucket, dtype, stream). Graphs replayed on one stream run one after
  another, so all graphs of one (device, stream) share one memory pool: their temporaries
  (h, stream-K partials) are allocated once, not per module.
- The weights' data pointers are recorded at capture. If a buffer is replaced (``.to()``,
  ``load_state_dict`` of a new tensor, ...) the module's graphs are dropped and re-captured.
  In-place weight updates need nothing: a replay reads the weights' current values.
- The cache lives outside the module (a weak dictionary), so ``copy.deepcopy`` and pickling of
  the module are unaffected.
- A capture that fails turns graphs off for that module with one warning; the call then runs the
  ops directly. An error in the warm-up run before it (bad input) is raised as a direct call
  would raise it, and the graphs stay on.
"""

from __future__ import annotations

import os
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from .kernels import ops

MAX_ROWS = 64  # the decode tile's rows: the largest bucket still costs the GPU what one row does
ENABLED = os.environ.get("SWIGLU_FUSED_EAGER_GRAPHS", "1").strip().lower() not in ("0", "false", "off", "no")

stats = {"captures": 0, "replays": 0, "invalidations": 0}  # for tests and benchmarks


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor  # static input [rows, H]
    y: torch.Tensor  # static output [rows, H]


@dataclass
class _ModuleGraphs:
    weights: tuple[int, ...]  # data pointers of the buffers at capture
    graphs: dict[tuple, _Graph] = field(default_factory=dict)


_per_module: "weakref.WeakKeyDictionary[torch.nn.Module, _ModuleGraphs]" = weakref.WeakKeyDictionary()
_pools: dict[tuple[int, int], tuple] = {}  # (device index, raw stream) → graph memory pool handle


def bucket(rows: int) -> int:
    """The graph's row count for ``rows``: the next power of two."""
    return 1 << (rows - 1).bit_length()


def _raw_stream(device_index: int) -> int:
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # private, 10x cheaper than current_stream()
    if get is not None:
        return get(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _plain_eager(x: torch.Tensor) -> bool:
    """A call the ops would run directly (ops.runs_directly: not compiling, no dispatch mode, a plain
    tensor that needs no autograd), and no graph capture under way."""
    return ops.runs_directly(x) and not torch.cuda.is_current_stream_capturing()


def run(module: torch.nn.Module, x2: torch.Tensor, forward: Callable[[torch.Tensor], torch.Tensor],
        buffers: tuple[torch.Tensor, ...] | None = None):
    """``forward(x2)`` through a cached CUDA graph, or None when this call should run directly.
    ``x2`` is [M, H]; ``forward`` is the module's direct path on a [rows, H] tensor; ``buffers``
    are the tensors the graph reads (default: ``module.buffers()``, whose traversal costs ~9 µs)."""
    rows = x2.shape[0]
    if not ENABLED or rows > getattr(module, "eager_graph_rows", 0) or x2.device.type != "cuda":
        return None
    if not _plain_eager(x2):
        return None
    if buffers is None:
        buffers = tuple(module.buffers())
    if any(b.device != x2.device for b in buffers):
        return None  # the ops raise a clear device error
    weights = tuple(b.data_ptr() for b in buffers)
    state = _per_module.get(module)
    if state is None or state.weights != weights:
        if state is not None:
            stats["invalidations"] += 1
        state = _per_module[module] = _ModuleGraphs(weights)
    dev = x2.device.index if x2.device.index is not None else torch.cuda.current_device()
    key = (bucket(rows), x2.dtype, _raw_stream(dev))
    g = state.graphs.get(key)
    if g is None:
        static_x, side = _warm_up(forward, key[0], x2, dev)  # bad input raises here, as directly
        try:
            g = state.graphs[key] = _record(forward, static_x, side, dev, key[2])
        except Exception as e:  # not capturable here: run directly from now on
            module.eager_graph_rows = 0
            warnings.warn(f"swiglu_fused: CUDA graph capture of {type(module).__name__} failed "
                          f"({type(e).__name__}: {e}); running its ops directly", RuntimeWarning, stacklevel=3)
            return None
    g.x[:rows].copy_(x2)
    g.graph.replay()
    stats["replays"] += 1
    return g.y[:rows].clone()


def _warm_up(forward, rows: int, x2: torch.Tensor, dev: int):
    """The static input (x2 in its first rows) and one run of ``forward`` on it, on a side stream:
    it compiles / loads the kernels and initializes cuBLAS, none of which may be captured."""
    with torch.inference_mode(False):  # a normal tensor, so later copy_ works in and out of inference mode
        static_x = torch.zeros((rows, x2.shape[1]), dtype=x2.dtype, device=x2.device)
    static_x[: x2.shape[0]].copy_(x2)
    side = torch.cuda.Stream(device=dev)
    caller = torch.cuda.current_stream(dev)
    side.wait_stream(caller)
    with torch.cuda.stream(side):
        forward(static_x)
    caller.wait_stream(side)
    return static_x, side


def _record(forward, static_x: torch.Tensor, side, dev: int, stream: int) -> _Graph:
    """Capture ``forward(static_x)`` into a graph in the (device, stream)'s shared pool."""
    pool = _pools.get((dev, stream))
    if pool is None:
        pool = _pools[(dev, stream)] = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        static_y = forward(static_x)
    stats["captures"] += 1
    return _Graph(graph, static_x, static_y)


def clear(module: torch.nn.Module | None = None) -> None:
    """Drop the graphs of ``module`` (all modules when None); the next eager call re-captures."""
    if module is None:
        _per_module.clear()
    else:
        _per_module.pop(module, None)
