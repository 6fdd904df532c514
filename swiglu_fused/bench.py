"""``swiglu-fused bench``: the whole gated MLP timed on this GPU, ours against its peers, and the
timing, peer and result helpers that the scripts in ``benchmarks/`` share (``benchmarks/harness.py``
re-exports them).

What ``run`` compares, in one process on the same bf16 input x [M, H], for each H×I and M:

  hf_bf16            transformers' ``LlamaMLP`` (built from a ``LlamaConfig``), bf16, eager
  fp8_unfused        the best separate fp8 pipeline on our packed fp8 weights: a compiled quant_x
                     (scales M-major) → cuBLAS block-scaled GEMM [M, 2I] (``torch._scaled_mm``) →
                     SiLU·up·quant (the faster of a compiled and a one-pass Triton kernel at that M)
                     → cuBLAS block-scaled GEMM (down). cuBLAS rejects some M (1 on the H100): the
                     table says so instead of a number
  fp8_unfused_deepgemm  the same pipeline with DeepGEMM's GEMMs (``deep_gemm.fp8_gemm_nt``) in place of
                     cuBLAS's, where DeepGEMM is importable: the strongest fp8 peer, measured, never
                     a dependency
  ours_<format>      ``FusedSwiGLUMLP`` in each asked weight format (bf16, fp8_block128, nvfp4: all
                     three have sm90 kernels; a format without them would time the pure-torch
                     reference: only with ``allow_reference=True``, and marked "(reference)").
                     Where DeepGEMM is installed, fp8_block128's down runs on it from 17 rows
                     (kernels/deepgemm.py), as it would in the user's model; the notes say so

How it is timed: each pipeline is captured once as a CUDA graph of ``REPS`` calls (so Python's launch
cost is not timed; ``cuda_graphs=False`` times ``REPS`` plain eager calls instead, host overhead
included) and timed with CUDA events, ``iters`` times per round: the median of those is the round's
µs per call. All pipelines are timed in turn, in a fresh random order each round, ``rounds`` times,
so that drift of the board's clocks and power state reaches every one alike; the table shows the
median over rounds and the range of the per-round speed-ups. Every pipeline cycles through enough
independent layers of its own weights that one pass moves more than twice the L2 (``layer_count``),
so no call finds its weights in cache, as in a model.
"""

from __future__ import annotations

import datetime
import functools
import importlib.util
import itertools
import json
import math
import random
import statistics
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import torch

from . import __version__, formats, quant
from .kernels import cublas, deepgemm

try:  # the unfused peer's one-pass act·quant; without Triton only the compiled one runs
    import triton
    import triton.language as tl
except ImportError:  # (a CPU build of torch has no Triton)
    triton = None

FP8 = torch.float8_e4m3fn
GROUP = 128  # act·quant group = the interleave g the unfused peer reads (gate, up halves of 128 columns)
REPS = 10  # calls per CUDA graph (or per eager timing)
L2_BYTES = 50 * 2**20  # H100 / H200; ``l2_bytes()`` asks the device where torch can
DEFAULT_SHAPES = ((4096, 14336), (8192, 3584))  # LLaMA-3-8B; LLaMA-3-70B's MLP on 8-way tensor parallelism
DEFAULT_M = (1, 16, 64, 256, 1024, 4096)
DEFAULT_FORMATS = ("bf16", "fp8_block128", "nvfp4")
HF = "hf_bf16"
UNFUSED = "fp8_unfused"
UNFUSED_FORMAT = "fp8_block128"  # the packed weights the unfused pipeline reads: ours in it is its peer
DEEPGEMM = "fp8_unfused_deepgemm"
UNFUSED_PEERS = (UNFUSED, DEEPGEMM)  # the unfused pipelines, peers of ours in UNFUSED_FORMAT


class BenchError(Exception):
    """A reason the benchmark cannot run as asked, in one line for the person who asked."""


# ---------------------------------------------------------------------------------------------
# arguments


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """"4096x14336,8192x3584" → ((4096, 14336), (8192, 3584)): H×I pairs, both multiples of 128
    (the fp8 formats' 128×128 blocks and the interleave g = 128 every pipeline here uses)."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        h, sep, i = item.lower().partition("x")
        if not sep or not h.isdigit() or not i.isdigit():
            raise BenchError(f"shape {item!r}: expected HxI, hidden and intermediate size, e.g. 4096x14336")
        h, i = int(h), int(i)
        if h <= 0 or i <= 0 or h % GROUP or i % GROUP:
            raise BenchError(f"shape {item!r}: H and I must be positive multiples of {GROUP} (128×128 weight "
                             f"blocks, interleave g = {GROUP})")
        out.append((h, i))
    if not out:
        raise BenchError(f"no shape in {text!r}: expected HxI[,HxI...], e.g. 4096x14336,8192x3584")
    return tuple(out)


def parse_ms(text: str) -> tuple[int, ...]:
    """"1,16,1024" → (1, 16, 1024): token counts M, positive."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        if not item.isdigit() or int(item) <= 0:
            raise BenchError(f"M {item!r}: expected a positive number of tokens, e.g. 1,16,1024")
        out.append(int(item))
    if not out:
        raise BenchError(f"no M in {text!r}: expected M[,M...], e.g. 1,16,64,1024")
    return tuple(out)


def check_formats(weight_formats: Iterable[str], allow_reference: bool = False) -> tuple[str, ...]:
    """The asked weight formats, in order, without repeats. A format the sm90 kernels do not
    implement would time the pure-torch reference: refused unless ``allow_reference``."""
    out = []
    for name in weight_formats:
        if name not in formats.WEIGHT_FORMATS:
            raise BenchError(f"format {name!r}: expected one of {', '.join(sorted(formats.WEIGHT_FORMATS))}")
        if not formats.weight_format(name).has_sm90_kernels(GROUP) and not allow_reference:
            raise BenchError(f"format {name!r}: the sm90 kernels do not implement it, so ours would time the "
                             f"pure-torch reference; add allow_reference=True to include it "
                             f"anyway")
        if name not in out:
            out.append(name)
    if not out:
        raise BenchError("no weight format to time: give at least one (e.g. fp8_block128)")
    return tuple(out)


def _check_counts(rounds: int, iters: int) -> None:
    for name, v in (("rounds", rounds), ("iters", iters)):
        if not isinstance(v, int) or v < 1:
            raise BenchError(f"{name} = {v!r}: expected a positive whole number")


def ours_name(weight_format: str) -> str:
    return f"ours_{weight_format}"


def require_gpu() -> str:
    """The device's name, or BenchError saying what is missing: an sm_90 GPU, the CuTe DSL (else
    ours would run the reference) or transformers (the hf_bf16 peer)."""
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else f"torch {torch.__version__}"
        raise BenchError(f"no CUDA GPU is visible to {build}; the benchmark needs an NVIDIA Hopper (sm_90) GPU "
                         "such as an H100 or H200")
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        raise BenchError(f"{name} is sm_{major}{minor}; the fused kernels run on sm_90 (H100, H200) only, so "
                         "there is nothing of ours to time on this GPU")
    if importlib.util.find_spec("cutlass") is None:
        raise BenchError("the CuTe DSL is not installed, so ours would run the pure-torch reference: "
                         "pip install 'swiglu-fused[cuda]'")
    if importlib.util.find_spec("transformers") is None:
        raise BenchError("the hf_bf16 peer needs transformers: pip install 'swiglu-fused[hf]'")
    return name


def l2_bytes() -> int:
    """The current device's L2 size (``L2_BYTES`` where torch does not say)."""
    try:
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size) or L2_BYTES
    except (AttributeError, RuntimeError, AssertionError):
        return L2_BYTES


# ---------------------------------------------------------------------------------------------
# timing


def capture(fn: Callable[[], object], reps: int = REPS) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``reps`` calls of fn (after 3 warm-up calls on a side stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def _event_us(launch: Callable[[], None], reps: int) -> float:
    """µs per call of one timed ``launch`` of ``reps`` calls, between two CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    launch()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def replay_us(graph: torch.cuda.CUDAGraph, iters: int, reps: int = REPS) -> float:
    """Median µs per call over ``iters`` timed replays of a graph of ``reps`` calls."""
    return statistics.median(_event_us(graph.replay, reps) for _ in range(iters))


def graph_time_us(fn: Callable[[], object], iters: int, reps: int = REPS) -> float:
    """Median µs per call of fn, from CUDA-graph replays of ``reps`` calls."""
    return replay_us(capture(fn, reps), iters, reps)


def _eager_timer(fn: Callable[[], object], reps: int) -> Callable[[], None]:
    """``reps`` plain calls of fn (warmed up first): what a graph replay is, with the host's launch
    cost left in."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()

    def launch():
        for _ in range(reps):
            fn()
    return launch


def interleaved_us(fns: Mapping[str, Callable[[], object]], iters: int, rounds: int, reps: int = REPS,
                   cuda_graphs: bool = True, seed: int = 0) -> dict[str, list[float]]:
    """{name: [µs per call, one per round]}: every fn captured once (or warmed up, without
    ``cuda_graphs``), then timed in turn, ``rounds`` times, each round's value the median of
    ``iters`` timings. The order within a round is a fresh seeded permutation, so that no pipeline
    always follows the same one (with a fixed order, a bimodal point, 4096×14336 M = 256, put one
    pipeline in its slow state every round; benchmarks/history/mlp.md), and drift of the board's
    clocks reaches all alike: per-round ratios cancel most of it."""
    launch = {name: (capture(fn, reps).replay if cuda_graphs else _eager_timer(fn, reps)) for name, fn in fns.items()}
    out: dict[str, list[float]] = {name: [] for name in fns}
    order = random.Random(seed)
    for _ in range(rounds):
        for name in order.sample(list(launch), len(launch)):
            out[name].append(statistics.median(_event_us(launch[name], reps) for _ in range(iters)))
    return out


def rotation(make: Callable[[int], object], one_set_bytes: int, l2: int = L2_BYTES) -> list:
    """Enough operand sets (``make(seed)``) that one pass over them moves more than twice the L2,
    so no peer is timed on operands the previous launch left in cache."""
    return [make(seed) for seed in range(max(1, -(-2 * l2 // one_set_bytes)))]


def cycling(fn: Callable, sets: Sequence[tuple]) -> Callable[[], object]:
    """A no-argument callable running ``fn`` on the next operand set at each call."""
    it = itertools.cycle(sets)
    return lambda: fn(*next(it))


def layer_count(hidden: int, inter: int, l2: int = L2_BYTES) -> int:
    """How many independent MLPs (own weights, as a model's layers have) one pass must cycle
    through to move more than twice the L2 in fp8 weights (3·H·I bytes a layer), so no pipeline is
    timed on weights its previous call left in cache. In a model, attention and the other layers
    run between two calls of one MLP."""
    return max(1, -(-2 * l2 // (3 * hidden * inter)))


def rotating(layers: Sequence[Mapping[str, Callable]], name: str, x: torch.Tensor) -> Callable[[], object]:
    """One no-argument callable that runs ``layer[name](x)`` for the next of ``layers`` at each call."""
    it = itertools.cycle([layer[name] for layer in layers])
    return lambda: next(it)(x)


# ---------------------------------------------------------------------------------------------
# peers


def hf_mlp(hidden: int, inter: int, seed: int = 0, device: str | torch.device = "cuda"):
    """transformers' ``LlamaMLP`` (SiLU), bf16, weights normal with std 1/sqrt(fan-in)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(seed)
    with torch.device(device):
        mlp = LlamaMLP(LlamaConfig(hidden_size=hidden, intermediate_size=inter)).to(torch.bfloat16)
    for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        torch.nn.init.normal_(lin.weight, std=lin.in_features ** -0.5)
    return mlp.eval()


def fused(mlp, weight_format: str = "fp8_block128"):
    """Our ``FusedSwiGLUMLP`` from a transformers MLP's three projections (interleave g = 128)."""
    from .layer import FusedSwiGLUMLP

    return FusedSwiGLUMLP.from_linear(mlp.gate_proj, mlp.up_proj, mlp.down_proj, weight_format=weight_format,
                                      interleave=GROUP)


def act_quant(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed gate/up GEMM output y [M, 2I] (g = 128) → e4m3 h [M, I] + scales [M, I/128] M-major
    (as a cuBLAS down GEMM reads them; inductor writes them so): the fp8 pipeline's SiLU·up·quant."""
    m = y.shape[0]
    y = y.view(m, -1, 2, GROUP).float()
    h = torch.nn.functional.silu(y[:, :, 0]) * y[:, :, 1]
    amax = h.abs().amax(-1)
    s = torch.where(amax > 0, amax / quant.FP8_MAX, torch.ones_like(amax))
    q = (h / s[..., None]).clamp(-quant.FP8_MAX, quant.FP8_MAX).to(FP8)
    return q.view(m, -1), quant.m_major(s)


def act_mul_bf16(y: torch.Tensor) -> torch.Tensor:
    """Packed [M, 2I] bf16 GEMM output → bf16 h [M, I] (the bf16 pipeline's separate SiLU·up)."""
    m = y.shape[0]
    y = y.view(m, -1, 2, GROUP).float()
    return (torch.nn.functional.silu(y[:, :, 0]) * y[:, :, 1]).to(torch.bfloat16).view(m, -1)


if triton is not None:
    @triton.jit
    def _act_quant_kernel(y_ptr, h_ptr, s_ptr, M, I, BLOCK_M: tl.constexpr, FP8_OUT: tl.constexpr):
        # program (row block, h group j): gate = y columns [256j, 256j + 128), up = the next 128
        pid_m = tl.program_id(0)
        j = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, 128)
        ok = rows[:, None] < M
        y_off = rows[:, None].to(tl.int64) * (2 * I) + j * 256 + cols[None, :]
        g = tl.load(y_ptr + y_off, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(y_ptr + y_off + 128, mask=ok, other=0.0).to(tl.float32)
        h = g / (1.0 + tl.exp(-g)) * u
        h_off = rows[:, None].to(tl.int64) * I + j * 128 + cols[None, :]
        if FP8_OUT:
            amax = tl.max(tl.abs(h), axis=1)
            s = tl.where(amax > 0, amax / 448.0, 1.0)
            q = tl.clamp(h / s[:, None], -448.0, 448.0)
            tl.store(h_ptr + h_off, q.to(tl.float8e4nv), mask=ok)
            tl.store(s_ptr + j.to(tl.int64) * M + rows, s, mask=rows < M)  # M-major: [I/128, M]
        else:
            tl.store(h_ptr + h_off, h.to(tl.bfloat16), mask=ok)


def act_quant_triton(y: torch.Tensor, fp8: bool = True, block_m: int = 32):
    """One pass of Triton: y [M, 2I] bf16 → (h e4m3 [M, I], s fp32 [M, I/128] M-major), or bf16 h
    (``fp8=False``). A program forms h for a block of rows of one group and reduces the row amax in
    registers."""
    if triton is None:
        raise RuntimeError("Triton is not installed")
    m, n = y.shape
    i_cols = n // 2
    h = torch.empty((m, i_cols), dtype=FP8 if fp8 else torch.bfloat16, device=y.device)
    s = torch.empty((i_cols // GROUP, m), dtype=torch.float32, device=y.device) if fp8 else h
    _act_quant_kernel[(triton.cdiv(m, block_m), i_cols // GROUP)](y, h, s, m, i_cols, BLOCK_M=block_m,
                                                                  FP8_OUT=fp8, num_warps=4)
    return (h, s.t()) if fp8 else h


def act_quant_bytes(m: int, i_cols: int, fp8: bool) -> int:
    """The act·quant step's traffic: y read once, h (and its scales) written once."""
    return m * 2 * i_cols * 2 + m * i_cols * (1 if fp8 else 2) + (m * (i_cols // GROUP) * 4 if fp8 else 0)


def check_act_quant_same(a, b, fp8: bool) -> None:
    """Two act·quant results agree: scales to 1e-5 relative, h within one e4m3 step (or bf16 rounding)."""
    if fp8:
        (ha, sa), (hb, sb) = a, b
        torch.testing.assert_close(sa, sb, rtol=1e-5, atol=0)
        da, db = ha.float() * sa.repeat_interleave(GROUP, 1), hb.float() * sb.repeat_interleave(GROUP, 1)
        err = ((da - db).norm() / db.norm()).item()
        if not err < 1e-3:
            raise RuntimeError(f"act·quant implementations differ: rel err {err:.2e}")
    else:
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)


def best_act_quant(y_example: torch.Tensor, fp8: bool, compiled: Callable, time_us: Callable | None = None):
    """(name, callable y → h (, s)) of the faster of ``compiled`` (act_quant / act_mul_bf16 under
    torch.compile) and the Triton kernel on this shape, after checking that both agree;
    ``time_us(fn)`` times a no-argument callable (default: graph_time_us over 10 replays)."""
    if triton is None:
        return "compiled", compiled
    time_us = time_us or (lambda f: graph_time_us(f, 10))
    tri = functools.partial(act_quant_triton, fp8=fp8)
    check_act_quant_same(tri(y_example), compiled(y_example), fp8)
    t_tri, t_cmp = time_us(lambda: tri(y_example)), time_us(lambda: compiled(y_example))
    return ("triton", tri) if t_tri < t_cmp else ("compiled", compiled)


def quant_x_m_major(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference quant_x with the scales M-major, the layout cuBLAS's block-scaled GEMM reads
    (compiled: as fast as our quant_x kernel from M = 4096, faster below)."""
    from .kernels import reference

    q, s = reference.quant_x(x)
    return q, quant.m_major(s)


def cublas_block_gemm(a, a_scale, b, b_scale):
    """a [M, K] @ b [N, K]^T in bf16 by cuBLAS's block-scaled GEMM (a_scale [M, K/128] M-major,
    b_scale [N/128, K/128]). Refuses a K where it would return wrong values (kernels/cublas.py), so
    that the unfused peer is reported as not run there instead of timed."""
    if not cublas.reads_scales_right(a.shape[1]):
        raise ValueError(f"cuBLAS's block-scaled GEMM returns wrong values at K = {a.shape[1]}, where K/{GROUP} is "
                         f"not a multiple of {cublas.SCALE_STRIDE_BLOCKS}")
    return torch._scaled_mm(a, b.t(), scale_a=a_scale, scale_b=b_scale.t(), out_dtype=torch.bfloat16)


def deep_gemm():
    """DeepGEMM's module where it is importable (a peer we time, never a dependency), else None."""
    return deepgemm.module()


def deep_gemm_block_gemm(dg):
    """cublas_block_gemm's twin on DeepGEMM's ``fp8_gemm_nt`` (same operands; a_scale laid out as it
    asks, M-major with TMA-aligned columns: a no-op for our M-major scales where M % 4 == 0)."""
    def gemm(a, a_scale, b, b_scale):
        out = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16, device=a.device)
        dg.fp8_gemm_nt((a, dg.get_mn_major_tma_aligned_tensor(a_scale)), (b, b_scale), out)
        return out
    return gemm


class UnfusedFP8:
    """The separate fp8 pipeline, its compiled pieces shared by every layer it runs:
    ``pipeline(module)`` → callable x → out on ``module``'s packed fp8_block128 weights (g = 128).
    The act·quant step is the faster of inductor's and the Triton kernel at each M (picked on the
    first call at that M; ``picked`` records which). ``gemm``: cublas_block_gemm, or its twin on
    another library (deep_gemm_block_gemm)."""

    def __init__(self, gemm: Callable = cublas_block_gemm):
        self.gemm = gemm
        self.quantize = torch.compile(quant_x_m_major, dynamic=False)  # one graph per M: faster than dynamic
        self.compiled_act = torch.compile(act_quant, dynamic=False)
        self.picked: dict[int, tuple[str, Callable]] = {}

    def act(self, y: torch.Tensor):
        m = y.shape[0]
        if m not in self.picked:
            self.picked[m] = best_act_quant(y, True, self.compiled_act)
        return self.picked[m][1](y)

    def pipeline(self, module) -> Callable[[torch.Tensor], torch.Tensor]:
        fmt = formats.weight_format(UNFUSED_FORMAT)
        if module.weight_format != fmt.name or module.interleave != GROUP:
            raise ValueError(f"the unfused fp8 pipeline reads {UNFUSED_FORMAT} weights at g = {GROUP}, not "
                             f"{module.weight_format} at g = {module.interleave}")
        gu, dn = module.gate_up_interleaved.tensors(), module.down_proj.tensors()
        w, s = fmt.weight_name, fmt.scale_name

        def run(x):
            xq, xs = self.quantize(x)
            hq, hs = self.act(self.gemm(xq, xs, gu[w], gu[s]))
            return self.gemm(hq, hs, dn[w], dn[s])
        return run


# ---------------------------------------------------------------------------------------------
# results: JSON, table, chart


def compact(obj):
    """obj with every float rounded to 4 significant digits (NaN and inf kept)."""
    if isinstance(obj, float):
        return float(f"{obj:.4g}")
    if isinstance(obj, dict):
        return {k: compact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [compact(v) for v in obj]
    return obj


def header() -> dict:
    """When (UTC, ISO), on which GPU and with which torch / CUDA / CuTe DSL / Triton a result was measured."""
    def version(module):
        try:
            return __import__(module).__version__
        except Exception:  # not installed, or no __version__
            return None

    return dict(device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                torch=torch.__version__, cuda=torch.version.cuda, cutlass_dsl=version("cutlass"),
                triton=version("triton"), swiglu_fused=__version__,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def save_json(path: str | Path, data: Mapping) -> Path:
    """``data`` as compact JSON (4 significant digits, no spaces; NaN stays NaN)."""
    path = Path(path)
    path.write_text(json.dumps(compact(dict(data)), separators=(",", ":")))
    return path


def _median_range(values: Sequence[float]) -> tuple[float, float, float]:
    good = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not good:
        return math.nan, math.nan, math.nan
    return statistics.median(good), min(good), max(good)


def summarize_row(hidden: int, inter: int, m: int, per_round: Mapping[str, Sequence[float]],
                  weight_formats: Sequence[str], layers: int = 1, rel_err: Mapping[str, float] | None = None,
                  skipped: Mapping[str, str] | None = None) -> dict:
    """One result row from the per-round µs of each pipeline (``per_round``: name → [µs]; a
    pipeline that did not run is absent and listed in ``skipped`` with the reason): the medians
    (``NAME_us``), the per-round values, and each of ours' speed-up over the peers, per round
    (``PEER_over_OURS_per_round``) and its median (``PEER_over_OURS``). A pure function."""
    row: dict = dict(hidden=hidden, inter=inter, m=m, layers=layers)
    for name, values in per_round.items():
        row[f"{name}_us"] = _median_range(values)[0]
        row[f"{name}_us_per_round"] = list(values)
    for fmt in weight_formats:
        ours = ours_name(fmt)
        peers = [HF] + ([p for p in UNFUSED_PEERS if p in per_round] if fmt == UNFUSED_FORMAT else [])
        for peer in peers:
            if ours in per_round and peer in per_round:
                ratios = [p / o for p, o in zip(per_round[peer], per_round[ours])]
                row[f"{peer}_over_{ours}_per_round"] = ratios
                row[f"{peer}_over_{ours}"] = _median_range(ratios)[0]
    if rel_err:
        row.update({f"{name}_rel_err": e for name, e in rel_err.items()})
    row["skipped"] = dict(skipped or {})
    return row


def pipelines(weight_formats: Sequence[str], peers: Sequence[str] = (HF, UNFUSED)) -> list[str]:
    """The table's pipelines, in column order."""
    return [*peers] + [ours_name(f) for f in weight_formats]


def speedup_columns(weight_formats: Sequence[str], peers: Sequence[str] = (HF, UNFUSED)) -> list[tuple[str, str]]:
    """(peer, ours) of each speed-up column."""
    cols = [(HF, ours_name(f)) for f in weight_formats]
    if UNFUSED_FORMAT in weight_formats:
        cols += [(p, ours_name(UNFUSED_FORMAT)) for p in peers if p in UNFUSED_PEERS]
    return cols


def result_pipelines(result: Mapping) -> list[str]:
    """``pipelines`` of a result (written before DeepGEMM was a peer: transformers' and the unfused one)."""
    s = result["settings"]
    return pipelines(s["weight_formats"], s.get("peers", (HF, UNFUSED)))


def _us(v) -> str:
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return "–"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _ratio(row: Mapping, peer: str, ours: str) -> str:
    med, lo, hi = _median_range(row.get(f"{peer}_over_{ours}_per_round", []))
    if not math.isfinite(med):
        return "–"
    return f"{med:.2f}" if len(row.get(f"{peer}_over_{ours}_per_round", [])) < 2 else f"{med:.2f} ({lo:.2f}–{hi:.2f})"


def _label(name: str, reference: Sequence[str]) -> str:
    return name + (" (reference)" if name.removeprefix("ours_") in reference else "")


def format_table(result: Mapping) -> str:
    """The result as a Markdown table (readable as it is in a terminal; pastes into a README): µs
    per call of each pipeline (medians over rounds), and ours' speed-ups over the peers, median
    (and range) of the per-round ratios; then one line per pipeline that did not run, and why. A
    pure function of ``run``'s result."""
    s = result["settings"]
    fmts, ref = s["weight_formats"], s.get("reference_formats", [])
    names = result_pipelines(result)
    ratio_cols = speedup_columns(fmts, names)
    how = (f"{s['iters']} CUDA-graph replays of {s['reps']} calls" if s["cuda_graphs"]
           else f"{s['iters']} timings of {s['reps']} eager calls")
    lines = [f"{result['device']}, torch {result['torch']}, swiglu-fused {result['swiglu_fused']}, "
             f"{result['date'][:10]}: µs per MLP call, median of {s['rounds']} round(s) of {how}; "
             f"speed-ups: median (range) of the per-round ratios",
             "",
             "| H×I | M | " + " | ".join(f"{_label(n, ref)} µs" for n in names) + " | "
             + " | ".join(f"{p} / {o}" for p, o in ratio_cols) + " |",
             "|---|---:|" + "---:|" * len(names) + "---:|" * len(ratio_cols)]
    notes = []
    for r in result["rows"]:
        cells = [f"{r['hidden']}×{r['inter']}", str(r["m"])]
        cells += [_us(r.get(f"{n}_us")) for n in names]
        cells += [_ratio(r, p, o) for p, o in ratio_cols]
        lines.append("| " + " | ".join(cells) + " |")
        notes += [f"- {n} at {r['hidden']}×{r['inter']} M = {r['m']}: {why}" for n, why in r.get("skipped", {}).items()]
    if ref:
        notes.append(f"- {', '.join(ours_name(f) for f in ref)}: no sm90 kernels for this format yet, so these "
                     "are the pure-torch reference's times")
    notes += [f"- {n}" for n in result.get("notes", [])]
    return "\n".join(lines + ([""] + notes if notes else []))


def plot_panels(rows: Sequence[Mapping], series: Mapping[str, str], title: str, out: str | Path,
                dpi: int = 60) -> Path:
    """A chart of ``rows`` (dicts with hidden, inter, m and the ``series`` keys): one panel per H×I,
    x = tokens M, y = µs, both log; ``series``: label → key, one colour per series across panels
    (dashed where the label has "floor" or "alone"). Needs matplotlib; the PNG is written with a
    64-colour palette where Pillow is present (a quarter of the bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(r["hidden"], r["inter"]) for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4.2), squeeze=False)
    for ax, (h, i) in zip(axes[0], shapes):
        sel = sorted((r for r in rows if (r["hidden"], r["inter"]) == (h, i)), key=lambda r: r["m"])
        for n, (label, key) in enumerate(series.items()):
            pts = [(r["m"], r[key]) for r in sel
                   if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label, color=f"C{n}",
                        linestyle="--" if "floor" in label or "alone" in label else "-")
        ax.legend(fontsize=7)
        ax.set(xscale="log", yscale="log", xlabel="tokens M", ylabel="µs", title=f"H={h}, I={i}")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    try:
        from PIL import Image
    except ImportError:
        return out
    Image.open(out).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    return out


def write_results(result: Mapping, out: str | Path) -> list[str]:
    """``run``'s result as ``OUT/bench.json`` and ``OUT/bench.png`` (the directory is made if
    missing; both files are replaced): one line each of what was written, or why the PNG was
    skipped (matplotlib not installed; the JSON has every number)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    said = [f"wrote {save_json(out / 'bench.json', result)}"]
    if importlib.util.find_spec("matplotlib") is None:
        return said + ["PNG skipped: matplotlib is not installed (pip install matplotlib; the JSON has every number)"]
    s = result["settings"]
    series = {_label(n, s.get("reference_formats", [])): f"{n}_us" for n in result_pipelines(result)}
    title = f"whole gated MLP — {result['device']}, torch {result['torch']}, {result['date'][:10]}"
    return said + [f"wrote {plot_panels(result['rows'], series, title, out / 'bench.png')}"]


# ---------------------------------------------------------------------------------------------
# the benchmark


def _runs(fn: Callable, x: torch.Tensor) -> str | None:
    """None if fn(x) runs, else the first line of why not (cuBLAS's block-scaled GEMM rejects M = 1;
    an installed DeepGEMM whose JIT cannot build raises its own errors): a peer's failure is
    reported in the table, never fatal to the run."""
    try:
        fn(x)
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001 (any peer failure is reported, see above)
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def run(shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES, m: Sequence[int] = DEFAULT_M,
        weight_formats: Sequence[str] = DEFAULT_FORMATS, rounds: int = 3, iters: int = 30,
        out: str | Path | None = None, cuda_graphs: bool = True, allow_reference: bool = False,
        print_fn: Callable[[str], None] | None = print) -> dict:
    """Time the whole gated MLP on this GPU: transformers' bf16 LlamaMLP, the unfused fp8 pipeline
    and ours in each of ``weight_formats``, at every H×I of ``shapes`` and every token count in
    ``m`` (module docstring: what each is and how it is timed). Prints the table (``print_fn``;
    None: quiet), writes ``OUT/bench.json`` and ``OUT/bench.png`` if ``out`` is given, and
    returns the result (``format_table`` prints it). BenchError: a bad argument, or no sm_90 GPU /
    CuTe DSL / transformers here."""
    shapes = tuple((int(h), int(i)) for h, i in shapes)
    parse_shapes(",".join(f"{h}x{i}" for h, i in shapes))  # the same checks as the command line
    ms = parse_ms(",".join(str(v) for v in m))
    fmts = check_formats(weight_formats, allow_reference)
    _check_counts(rounds, iters)
    device = require_gpu()
    say = print_fn or (lambda _line: None)
    reference = [f for f in fmts if not formats.weight_format(f).has_sm90_kernels(GROUP)]
    l2 = l2_bytes()
    for name in ("recompile_limit", "cache_size_limit"):  # one compiled graph per M for the unfused peer
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    unfused = {UNFUSED: UnfusedFP8()}
    dg = deep_gemm()
    if dg is not None:
        unfused[DEEPGEMM] = UnfusedFP8(deep_gemm_block_gemm(dg))
    peers = [HF, *unfused]
    rows = []
    say(f"timing {', '.join(pipelines(fmts, peers))} on {device} ({len(shapes)} shape(s) × {len(ms)} M, "
        f"{rounds} round(s)); the first calls compile kernels, which takes a while")
    for hidden, inter in shapes:
        layers = []
        for seed in range(layer_count(hidden, inter, l2)):
            mlp = hf_mlp(hidden, inter, seed)
            ours = {f: fused(mlp, f) for f in fmts}
            for f, module in ours.items():
                if f not in reference and module.backend != "sm90":
                    raise BenchError(f"ours in {f} would run on the {module.backend} backend here, not the sm90 "
                                     "kernels (is SWIGLU_FUSED_DISABLE_KERNELS set?)")
            fp8 = ours.get(UNFUSED_FORMAT) or fused(mlp, UNFUSED_FORMAT)
            layers.append({HF: mlp, **{n: u.pipeline(fp8) for n, u in unfused.items()},
                           **{ours_name(f): ours[f] for f in fmts}})
        for m_ in ms:
            x = torch.randn(m_, hidden, device="cuda").to(torch.bfloat16)
            skipped = {}
            with torch.no_grad():
                for n in unfused:
                    why = _runs(layers[0][n], x)
                    if why:
                        skipped[n] = why
                names = [n for n in layers[0] if n not in skipped]
                ref = layers[0][HF](x).float()
                errs = {n: _rel_err(layers[0][n](x), ref) for n in names if n != HF}
                fns = {n: rotating(layers, n, x) for n in names}
                per_round = interleaved_us(fns, iters, rounds, REPS, cuda_graphs)
            row = summarize_row(hidden, inter, m_, per_round, fmts, len(layers), errs, skipped)
            rows.append(row)
            say(f"  {hidden}×{inter} M = {m_}: " + ", ".join(f"{n} {_us(row.get(f'{n}_us'))} µs" for n in names))
        del layers
        torch.cuda.empty_cache()
    notes = [f"act·quant of {n} at M = {k}: {v[0]}" for n, u in unfused.items() for k, v in sorted(u.picked.items())]
    if triton is None:
        notes.append("Triton is not installed: fp8_unfused's act·quant is the compiled one only")
    if UNFUSED_FORMAT in fmts and deepgemm.ENABLED and dg is not None:
        notes.append(f"{ours_name(UNFUSED_FORMAT)}'s down ran on DeepGEMM from M = {deepgemm.MIN_M} "
                     "(installed here; SWIGLU_FUSED_DEEPGEMM=0 leaves it out)")
    result = dict(benchmark="swiglu-fused bench", **header(), notes=notes,
                  settings=dict(shapes=[list(s) for s in shapes], m=list(ms), weight_formats=list(fmts), peers=peers,
                                reference_formats=reference, rounds=rounds, iters=iters, reps=REPS,
                                cuda_graphs=cuda_graphs, l2_bytes=l2, interleave=GROUP),
                  rows=rows)
    say("")
    say(format_table(result))
    if out is not None:
        for line in write_results(result, out):
            say(line)
    return result
