"""The ``swiglu-fused`` command: a thin shell over the Python API (same parameter names)."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys

from . import __version__  # (the package's names load on use: this module imports no torch)
from .format_names import DEFAULT_INTERLEAVE, WEIGHT_FORMAT_NAMES

EPILOG = """examples:
  swiglu-fused demo
  swiglu-fused convert ./Llama-3-8B ./Llama-3-8B-fused --format fp8_block128
  swiglu-fused convert ./Qwen3-8B-FP8 ./Qwen3-8B-fused --format fp8_block128   # repacks bit-exactly
  swiglu-fused verify ./Llama-3-8B-fused --against ./Llama-3-8B
  swiglu-fused inspect ./Llama-3-8B-fused
  swiglu-fused bench --out bench-results      # on an H100 / H200
"""


# The package's messages name the Python API's keywords (interleave=64, weight_format='bf16',
# force=True); the command shows them as its flags.
_KEYWORD = re.compile(r"\b(interleave|weight_format|source_format|allow_reference|force)=('?)([\w.-]+)\2")
_FLAGS = {"interleave": "--interleave", "weight_format": "--format", "source_format": "--source-format"}
_SWITCHES = {"allow_reference": "--allow-reference", "force": "--force"}  # (=True)


def cli_spelling(message: str) -> str:
    """``message`` with the Python API's keyword arguments written as this command's flags."""
    def flag(m: re.Match) -> str:
        name, value = m.group(1), m.group(3)
        if name in _SWITCHES:
            return _SWITCHES[name] if value == "True" else m.group(0)
        if name == "interleave" and not value.isdigit():  # (a type error's repr: not a flag's value)
            return m.group(0)
        return f"{_FLAGS[name]} {value}"
    return _KEYWORD.sub(flag, message)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="swiglu-fused",
        description="Pack the gated MLPs of LLaMA-family and Flux.2 checkpoints for one fused gate_up GEMM "
                    "(interleaved gate/up rows, optional FP8 or NVFP4 quantization).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("convert", help="convert a Hugging Face / diffusers checkpoint into the packed format",
                       description="Convert SRC (a directory with config.json and safetensors, single or sharded) "
                                   "into a packed checkpoint in DST. Existing fine-grained FP8 and NVFP4 checkpoints "
                                   "are repacked by moving bytes; other weights are quantized. Non-MLP tensors and "
                                   "side files (tokenizer, generation config, code) are copied unchanged; other "
                                   "weight files, directories and links out of SRC are left out and listed. DST appears only when complete and verified; "
                                   "SRC is never written. Exit status 2 on an error, 128+N on signal N.")
    c.add_argument("src", help="source checkpoint directory")
    c.add_argument("dst", help="output directory (must not exist unless --force)")
    c.add_argument("--format", dest="weight_format", choices=sorted(WEIGHT_FORMAT_NAMES), default=None,
                   help="packed weight format (default: the source's, so bytes are moved: nvfp4 for an NVFP4 "
                        "source, fp8_block128 for a fine-grained FP8 or a dense one; another format re-quantizes)")
    c.add_argument("--interleave", type=int, default=DEFAULT_INTERLEAVE, metavar="G",
                   help="interleave granularity g in rows; must divide the intermediate size, and be a multiple "
                        "of 128 for fp8_block128 (default: 128)")
    c.add_argument("--source-format", choices=["auto", "dense", "fp8_block128", "nvfp4"], default="auto",
                   help="what SRC holds; auto reads its quantization_config (default: auto)")
    c.add_argument("--force", action="store_true",
                   help="replace DST if it is a previous packed output or an empty directory (anything else "
                        "there is refused: remove it yourself)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")

    v = sub.add_parser("verify", help="validate a packed checkpoint, optionally against its source",
                       description="Re-read DST and report every format violation; with --against SRC also compare "
                                   "every MLP weight with the source (bit-exact where bytes were moved, within the "
                                   "format's error bound where quantized). Exit status 1 on any failure.")
    v.add_argument("dst", help="packed checkpoint directory")
    v.add_argument("--against", metavar="SRC", help="the source checkpoint DST was converted from")

    i = sub.add_parser("inspect", help="print the packed MLPs and linears of a packed checkpoint",
                       description="Print format, interleave, shapes and bytes of every packed MLP in DST, then "
                                   "every packed non-MLP linear (the source's quantized attention projections, ...: "
                                   "quantization_config.linears) with its shape, format and bias.")
    i.add_argument("dst", help="packed checkpoint directory")

    d = sub.add_parser("demo", help="convert a tiny random LLaMA to every format and compare outputs (CPU, offline)",
                       description="Build a tiny LLaMA with random weights (no download), convert it to each format, "
                                   "run the reference MLP on the CPU and print errors against the original model.")
    d.add_argument("--format", dest="weight_formats", action="append", choices=sorted(WEIGHT_FORMAT_NAMES),
                   help="format to run (repeatable; default: all)")
    d.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs (default: 0)")
    _add_bench(sub)
    return p


BENCH_DESCRIPTION = """\
Time the whole gated MLP (gate/up, SiLU·up, down) on this GPU, ours against its peers, in one
process on the same random bf16 input x [M, H] and the same random weights:

  hf_bf16             transformers' LlamaMLP (from a LlamaConfig), bf16, eager
  fp8_unfused         the best separate fp8 pipeline on the same packed fp8 weights: compiled quant_x
                      -> cuBLAS block-scaled GEMM (torch._scaled_mm) -> SiLU·up·quant (the faster of a
                      compiled and a Triton kernel) -> cuBLAS block-scaled GEMM; "–" where cuBLAS
                      rejects M (M = 1 on the H100)
  fp8_unfused_deepgemm  the same pipeline on DeepGEMM's GEMMs (deep_gemm.fp8_gemm_nt), only where
                      DeepGEMM is installed: timed as a peer, never needed
  ours_FORMAT         FusedSwiGLUMLP in each --format (default: bf16, fp8_block128 and nvfp4, all on
                      sm90 kernels; nvfp4 is W4A16: its 4-bit weight decoded to bf16 in the kernel,
                      or above 1408 tokens dequantized to bf16 for the call, then the bf16 kernels;
                      bf16 gate_up runs as cuBLAS's GEMM + our act·mul kernel at the M where that is
                      predicted faster, DISPATCH D53/D54)

How it is timed: each pipeline is captured as a CUDA graph of 10 calls (--no-cuda-graphs: 10 plain
eager calls, host launch cost included) and timed with CUDA events --iters times a round; the median
is the round's µs per call. The pipelines are timed in turn, in a fresh random order each round,
--rounds times; the table gives the median over rounds and the median (range) of the per-round
speed-ups. Each pipeline cycles through enough layers of its own weights to move more than twice
the GPU's L2 per pass, so no call finds its weights in cache.

Needs an sm_90 GPU (H100, H200), the CuTe DSL (pip install 'swiglu-fused[cuda]') and transformers
(pip install 'swiglu-fused[hf]'); matplotlib for the PNG. Exit status 2 with one line if any is missing.
"""


def _bench_type(parse):
    """An argparse type from one of bench's parsers: its BenchError becomes argparse's usage error."""
    def convert(text):
        from . import bench

        try:
            return getattr(bench, parse)(text)
        except bench.BenchError as e:
            raise argparse.ArgumentTypeError(cli_spelling(str(e))) from None
    convert.__name__ = parse.removeprefix("parse_")
    return convert


def _add_bench(sub) -> None:
    b = sub.add_parser("bench", help="time the whole MLP on this GPU: ours vs transformers bf16 vs unfused fp8",
                       description=BENCH_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--shapes", type=_bench_type("parse_shapes"), default="4096x14336,8192x3584", metavar="HxI,...",
                   help="hidden x intermediate sizes, multiples of 128 (default: 4096x14336,8192x3584: "
                        "LLaMA-3-8B, and LLaMA-3-70B's MLP on 8-way tensor parallelism)")
    b.add_argument("--m", type=_bench_type("parse_ms"), default="1,16,64,256,1024,4096", metavar="M,...",
                   help="token counts (default: 1,16,64,256,1024,4096)")
    b.add_argument("--format", dest="weight_formats", action="append", choices=sorted(WEIGHT_FORMAT_NAMES),
                   help="our weight format to time (repeatable; default: bf16, fp8_block128 and nvfp4)")
    b.add_argument("--allow-reference", action="store_true",
                   help="allow a --format without sm90 kernels (none today): times the pure-torch reference")
    b.add_argument("--rounds", type=int, default=3, help="rounds of timing every pipeline in turn (default: 3)")
    b.add_argument("--iters", type=int, default=30, help="timings per pipeline and round, median (default: 30)")
    b.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="time plain eager calls instead of CUDA-graph replays (host launch cost included)")
    b.add_argument("--out", metavar="DIR", default=None,
                   help="write DIR/bench.json (every number, per round) and DIR/bench.png (replacing them)")


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        args = _parser().parse_args(argv)  # (no torch yet: --help and a bad flag are answered at once)
        return _run_reporting(args)
    except KeyboardInterrupt as e:  # Ctrl-C (also while torch loads); in convert also SIGTERM and SIGHUP
        signum = getattr(e, "signum", signal.SIGINT)
        if args is None or args.command != "convert":
            what = ""
        elif getattr(e, "written", False):
            what = f"; {args.dst} was already complete"
        else:
            what = f"; nothing was written to {args.dst}"
        print(f"swiglu-fused{'' if args is None else ' ' + args.command}: interrupted{what}", file=sys.stderr)
        return 128 + signum


def _run_reporting(args) -> int:
    """_run, with the package's warnings and errors as one line each (errors: exit status 2)."""
    from .formats import FormatError  # (torch)
    from .weight_packing.safetensors_io import CheckpointError

    notes = _Notes(f"swiglu-fused {args.command}: ")  # convert's "replaced …" / "removed a stale …" lines
    logger = logging.getLogger("swiglu_fused")
    logger.addHandler(notes)
    try:
        return _run(args)
    except (FormatError, CheckpointError, OSError) as e:  # OSError: missing paths, permissions, disk space
        print(f"swiglu-fused {args.command}: error: {cli_spelling(str(e))}", file=sys.stderr)
        return 2
    finally:
        logger.removeHandler(notes)


class _Notes(logging.Handler):
    """Prints the package's warnings as one line each on stderr, prefixed like the errors."""

    def __init__(self, prefix: str):
        super().__init__(logging.WARNING)
        self.prefix = prefix

    def emit(self, record: logging.LogRecord) -> None:
        print(f"{self.prefix}{record.getMessage()}", file=sys.stderr)


def _run(args) -> int:
    if args.command == "convert":
        from .weight_packing.convert import convert

        report = convert(args.src, args.dst, weight_format=args.weight_format, interleave=args.interleave,
                         source_format=args.source_format, force=args.force, progress=not args.no_progress)
        print(report.summary())
        if report.dropped:
            print(f"dropped {len(report.dropped)} activation-scale tensors the weight-only packed format does not "
                  f"use (first: {report.dropped[0]})")
        return 0
    if args.command == "verify":
        from .weight_packing.verify import verify

        report = verify(args.dst, against=args.against)
        print(report.summary())
        return 0 if report.ok else 1
    if args.command == "inspect":
        from .weight_packing.verify import format_table, inspect, inspect_linears, inspect_splits

        cfg, rows = inspect(args.dst)  # validates first
        print(format_table(cfg, rows, inspect_linears(args.dst), inspect_splits(args.dst)))
        return 0
    if args.command == "bench":
        from . import bench

        try:
            bench.run(shapes=args.shapes, m=args.m, weight_formats=tuple(args.weight_formats or bench.DEFAULT_FORMATS),
                      rounds=args.rounds, iters=args.iters, out=args.out, cuda_graphs=args.cuda_graphs,
                      allow_reference=args.allow_reference)
        except bench.BenchError as e:
            print(f"swiglu-fused bench: error: {cli_spelling(str(e))}", file=sys.stderr)
            return 2
        return 0
    from .demo import run_demo

    run_demo(tuple(args.weight_formats or WEIGHT_FORMAT_NAMES), seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
