"""md5 of the PTX of every shipped sm_90a kernel configuration: the check that a change to the
kernel code (kernels/sm90/) is a pure refactor.

Compiles on the CPU (no GPU needed) every configuration the dispatch can pick (quant_x, gate_up
and down ``shipped_configs()``, the split projection's ``dispatch.split_shipped()`` and its
variant with the pair tiles off the 256-row grid), plus the ones measured but not dispatched that
tests/test_kernels_cpu.py also compiles (pdl, TMA stores of h, the 64-row tile's K pairs, the
swap-AB tile's K in four parts), plus a few compiled variants that reach the code paths no shipped
configuration does (the one-warpgroup 64-row fp8 swiglu tile with and without the overlapped
promotion, the 32/64-token swap-AB tiles, promote_k = 64, both L2 hints), and prints one line per
configuration, sorted:

    family  repr(config)  md5(PTX)

Run it before a refactor and after each step, and diff the two outputs: any line that differs
means the change is not a pure refactor (the PTX is what ptxas turns into the binary; identical
PTX means an identical kernel, whatever the Python around it looks like).

    python -m benchmarks.ptx_md5 --out /tmp/ptx_before.txt
    ... edit ...
    python -m benchmarks.ptx_md5 --out /tmp/ptx_after.txt && diff /tmp/ptx_before.txt /tmp/ptx_after.txt

``--match TEXT`` compiles only the configurations whose line contains TEXT (e.g. ``swap_ab=True``
or ``down``); ``-j N`` compiles in N processes. The PTX is taken from the compiled function
(``fn.__ptx__``, which CuTe DSL keeps when ``CUTE_DSL_KEEP=ptx``; set here before cutlass is
imported, dumping into a temporary directory). Nothing in the PTX depends on the run (no source
paths, addresses or line numbers without ``CUTE_DSL_LINEINFO``): two runs print the same lines.
The kernel's entry name is in the PTX and is built from the kernel class's module and name, so a
class that moves module changes every md5 of its configurations.

``--normalize NAME [NAME ...]`` makes a rename comparable: every PTX identifier that contains one
of the NAMEs (the entry name, which embeds module and class, e.g. ``...sm90gemmGemmKernel_...``,
and its ``<entry>_param_<i>`` parameters) is replaced, before hashing, by ``NORMALIZED<j>`` (j
numbering the distinct identifiers in order of first appearance; a ``_param_<i>`` suffix is kept).
The entry name is truncated by the DSL, so a shorter or longer name also changes which argument
text it carries: replacing the whole identifier, not the name inside it, hides that too. Hash the
old code with the old names and the new code with the new ones, then diff:

    python -m benchmarks.ptx_md5 --normalize OldKernel --out /tmp/before.txt
    ... rename OldKernel to NewKernel ...
    python -m benchmarks.ptx_md5 --normalize NewKernel --out /tmp/after.txt
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

# The DSL writes the PTX to <dump dir>/<function name>.sm_90a.ptx (the same name for every config of
# a kernel class) and reads it back into fn.__ptx__: each process (workers are spawned, so they run
# this again) needs a dump directory of its own, under one the first process removes at exit.
if "PTX_MD5_DUMP_ROOT" not in os.environ:
    os.environ["PTX_MD5_DUMP_ROOT"] = tempfile.mkdtemp(prefix="ptx_md5_")
    atexit.register(shutil.rmtree, os.environ["PTX_MD5_DUMP_ROOT"], True)
_DUMP = tempfile.mkdtemp(dir=os.environ["PTX_MD5_DUMP_ROOT"])
os.environ["CUTE_DSL_KEEP"] = "ptx"
os.environ["CUTE_DSL_DUMP_DIR"] = _DUMP


def configurations():
    """(family, config) for every configuration to check, in a fixed order."""
    from swiglu_fused.kernels import dispatch, dispatch_nvfp4
    from swiglu_fused.kernels.sm90 import (act_mul, down, gate_up, k_order, nvfp4_dequant, qk_norm_rope, quant_x,
                                           split, warp_mma)

    G, D = gate_up.GateUpConfig, down.DownConfig
    out = [("quant_x", c) for c in quant_x.shipped_configs()]
    out += [("k_order", c) for c in k_order.shipped_configs()]
    out += [("act_mul", c) for c in act_mul.shipped_configs()]
    out += [("qk_norm_rope", c) for c in qk_norm_rope.shipped_configs()]
    out += [("nvfp4_warp_mma", c) for c in dispatch_nvfp4.warp_mma_shipped()]
    out += [("nvfp4_dequant", c) for c in nvfp4_dequant.shipped_configs()]
    out += [("gate_up", c) for c in gate_up.shipped_configs()]
    out += [("down", c) for c in down.shipped_configs()]
    out += [("gate_up_split", c) for c in dispatch.split_shipped()]
    # measured, not dispatched (the same list as tests/test_kernels_cpu.py's _shipped)
    out += [("gate_up", G(tile_m=16, stages=6, swap_ab=True, cluster_k=2, pdl=True)),
            ("quant_x", quant_x.QuantXConfig(pdl=True))]
    out += [("gate_up", G(tile_m=128, stages=4, tma_store=True, h_format=f)) for f in ("fp8_group128", "bf16")]
    out += [("gate_up", G(tile_m=64, stages=3, cluster_k=2))]
    out += [("gate_up", G(tile_m=16, stages=6, mainloop="nvfp4", swap_ab=True, tile_major=True, decode_buffers=1,
                          h_format="bf16", pdl=True)),
            ("down", D(**dispatch._nvfp4_prefill_tile(2048), pdl=True)),
            ("down", D(tile_m=16, stages=6, mainloop="nvfp4", swap_ab=True, tile_major=True, decode_buffers=1,
                       pdl=True, ctas_per_sm=1))]
    out += [("nvfp4_warp_mma", warp_mma.WarpMmaConfig(op, n8=2, pdl=True)) for op in ("gate_up", "down")]
    out += [("nvfp4_warp_mma", warp_mma.WarpMmaConfig(op, warps=w, n8=4, ctas_per_sm=c))
            for op in ("gate_up", "down") for w in (4, 8) for c in (0, 16 // w)]
    out += [("gate_up", G(tile_m=16, stages=5, swap_ab=True, cluster_k=4, mainloop=ml))
            for ml in ("fp8_block128", "bf16")]
    out += [("down", D(tile_major=True, **f)) for f in (  # fp8 weights tile-major (fp8_layout; gate_up's: D38)
        dict(tile_m=16, stages=5, swap_ab=True, cluster_k=4),
        dict(tile_m=128, stages=4, y_slab_cols=64, smem_scales=True, static_stages=True, uniform_ab=True))]
    # code paths no shipped configuration reaches
    out += [("gate_up", G(tile_m=64, stages=4, overlap=ov)) for ov in (True, False)]
    out += [("gate_up", G(tile_m=64, stages=4, tma_store=True))]
    out += [("gate_up", G(tile_m=tm, stages=4, swap_ab=True, mainloop=ml)) for tm in (32, 64)
            for ml in ("fp8_block128", "bf16")]
    out += [("down", D(tile_m=64, stages=4, swap_ab=True))]
    out += [("gate_up", G(tile_m=128, stages=4, promote_k=64, h_format="bf16"))]
    out += [("gate_up", G(tile_m=64, stages=4, split_n=True, split_unroll=3, l2_hint="w_first_x_last"))]
    out += [("down", D(tile_m=128, stages=4, l2_hint="w_first"))]
    out += [("gate_up_split", split.SplitConfig(tile_m=tm, mainloop=ml, h_format="bf16", prefix=384))
            for tm in (64, 128) for ml in ("fp8_block128", "bf16")]  # the pair tiles 128 rows off the grid
    seen = set()
    unique = []
    for fam, cfg in out:
        if (fam, cfg) not in seen:
            seen.add((fam, cfg))
            unique.append((fam, cfg))
    return unique


def normalize(ptx: str, names) -> str:
    """The PTX with every identifier containing one of ``names`` replaced by NORMALIZED<j> (module doc)."""
    if not names:
        return ptx
    bases = {}

    def sub(m):
        ident = m.group(0)
        if not any(n in ident for n in names):
            return ident
        base, param = re.fullmatch(r"(.*?)((?:_param_\d+)?)", ident).groups()
        return bases.setdefault(base, f"NORMALIZED{len(bases)}") + param

    return re.sub(r"[A-Za-z_$%][\w$]*", sub, ptx)


def _compile(family, cfg, names=()):
    from swiglu_fused.kernels.sm90 import (act_mul, down, gate_up, k_order, nvfp4_dequant, qk_norm_rope, quant_x,
                                           split, warp_mma)

    fn = {"quant_x": quant_x.compile_quant_x, "gate_up": gate_up.compile_gate_up, "act_mul": act_mul.compile_act_mul,
          "qk_norm_rope": qk_norm_rope.compile_qk_norm_rope,
          "gate_up_split": split.compile_split, "down": down.compile_down, "k_order": k_order.compile_k_order,
          "nvfp4_dequant": nvfp4_dequant.compile_dequant, "nvfp4_warp_mma": warp_mma.compile_warp_mma}[family](cfg)
    ptx = fn.__ptx__
    if ptx is None:
        raise RuntimeError(f"{family} {cfg!r}: no PTX kept (is CUTE_DSL_KEEP=ptx honoured?)")
    return f"{family} {cfg!r} {hashlib.md5(normalize(ptx, names).encode()).hexdigest()}"


def _compile_job(job):
    return _compile(*job)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="also write the sorted lines to this file")
    p.add_argument("--match", default="", help="only the configurations whose 'family repr' contains this")
    p.add_argument("-j", "--jobs", type=int, default=1, help="compile in this many processes")
    p.add_argument("--normalize", nargs="+", default=(), metavar="NAME",
                   help="replace each PTX identifier containing a NAME by a placeholder before hashing "
                        "(compare across a rename of a kernel class or module)")
    a = p.parse_args(argv)
    names = tuple(a.normalize)
    jobs = [(f, c, names) for f, c in configurations() if a.match in f"{f} {c!r}"]
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            lines = list(pool.map(_compile_job, jobs))
    else:
        lines = []
        for i, job in enumerate(jobs):
            lines.append(_compile(*job))
            print(f"[{i + 1}/{len(jobs)}] {lines[-1]}", file=sys.stderr, flush=True)
    lines.sort()
    text = "".join(line + "\n" for line in lines)
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(f"{len(lines)} configurations", file=sys.stderr)


if __name__ == "__main__":
    main()
