"""nvfp4 gate_up and down alone (W4A16; from dispatch_nvfp4.NVFP4_DEQUANT_M rows dequantized per call, then
the bf16 mainloop: DISPATCH D26), against our fp8 kernels on the same shapes and the nvfp4
weight-bandwidth floor (packed bytes + e4m3 scales at the measured copy rate, 2.96 TB/s): µs per
call, medians of CUDA-graph replays, weights rotated past the 50 MB L2 (GPU). "nvfp4" is the
weight in the tile-major order the modules hold on the GPU (kernels/nvfp4_layout.py, D27),
"nvfp4 packed" the packed format's order (what the ops read from a checkpoint's tensors).

    python -m benchmarks.bench_nvfp4 [--shapes 4096x14336,8192x3584] [--m 1,16,64,1024] [--ab stages=3 ...] [--bf16]

``--ab FIELD=VALUE,...`` also times the nvfp4 kernels on the dispatched tile-major configs with
those fields replaced (called directly; their outputs first checked bit-identical to the
dispatched ones; ``tile_major=False`` reads the packed order; ``rs_decode=True``: gate_up's
timing includes its launcher's copy of x into nvfp4_layout.rs_k_order, down's h is ordered
beforehand, as gate_up's epilogue writes it for such a down; both copies are also timed apart, as
the torch copy and as kernels/sm90/k_order.py's kernel). Repeat it to time
several variants in one process against the same dispatched kernels ("variant 1", "variant 2",
...). ``--bf16``
also times our bf16 kernels on bf16 weights of the same shapes (the prefill target's yardstick).

``--set MODULE.NAME=VALUE;...`` (launch_ab's form; repeatable) times instead gate_up and down alone
as dispatched ("shipped", tile-major weights) and with those module constants changed while they
are captured ("set1", ...), in turn, ``--rounds`` times: medians, each set's per-round ratio over
shipped (> 1: shipped faster), and the stream-K split (ctas, sk_tiles) each runs, e.g. D46's hybrid
against whole waves on the 128-token tile:

    python -m benchmarks.bench_nvfp4 --m 640,1024 --rounds 7 \
        --set "schedule.NVFP4_HYBRID_MIN_GAIN=0" --set "schedule.NVFP4_HYBRID_MIN_GAIN=1e9"
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from benchmarks.harness import parse_variant
from swiglu_fused import quant
from swiglu_fused.bench import graph_time_us, parse_ms, parse_shapes
from swiglu_fused.kernels import dispatch, nvfp4_layout, ops
from swiglu_fused.interleave import interleave_rows

COPY_TB_S = 2.96
L2_BYTES = 50 << 20


def _layers(make, nbytes: int) -> list:
    """Enough independent copies that one pass moves more than twice the L2."""
    return [make(i) for i in range(max(2, -(-2 * L2_BYTES // nbytes) + 1))]


def nvfp4_gate_up(hidden, inter, seed):
    """A random packed nvfp4 gate_up at g = 128: (weight, scales, the two global scale multipliers)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    (gp, gs, gd), (up, us, ud) = (quant.quantize_nvfp4(torch.randn(inter, hidden, device="cuda", generator=g) * 0.05)
                                  for _ in range(2))
    return interleave_rows(gp, up, 128).contiguous(), interleave_rows(gs, us, 128).contiguous(), torch.cat(
        [1 / gd, 1 / ud]).float()


def _nvfp4_down(hidden, inter, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    p, s, d = quant.quantize_nvfp4(torch.randn(hidden, inter, device="cuda", generator=g) * 0.03)
    return p, s, (1 / d).float()


def _nvfp4_layers(hidden, inter) -> tuple[list, list]:
    """Random packed nvfp4 gate_up and down weights (weight, scales, global scale multipliers), as
    many copies of each as _layers rotates past the L2."""
    return (_layers(lambda i: nvfp4_gate_up(hidden, inter, i), _nbytes(*nvfp4_gate_up(hidden, inter, 99))),
            _layers(lambda i: _nvfp4_down(hidden, inter, i), _nbytes(*_nvfp4_down(hidden, inter, 99))))


def _tile_major(layers: list) -> list:
    """The same layers in nvfp4_layout's tile-major order (the modules' on the GPU)."""
    return [(*nvfp4_layout.to_tile_major(w[0], w[1]), w[2]) for w in layers]


def _fp8(rows, cols, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return quant.quantize_fp8_block(torch.randn(rows, cols, device="cuda", generator=g) * 0.05)


def _nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _variant(fields: dict, x, h, gu_w, dn_w):
    """(gate_up(w), down(w)) callables running the nvfp4 kernels on the dispatched configs with
    ``fields`` replaced (None for a projection whose config does not take them)."""
    from swiglu_fused.kernels.sm90 import down as kd
    from swiglu_fused.kernels.sm90 import gate_up as kg

    major = fields.get("tile_major", True)
    rs = fields.get("rs_decode", False)
    if rs:  # (one register set, D45; down's h as gate_up's epilogue writes it for such a down, gate_up's
        fields = {"decode_buffers": 1, **fields}  # launcher orders x itself)
        h = nvfp4_layout.rs_k_order(h)

    def config(make):
        try:
            return dataclasses.replace(make(), **fields)
        except ValueError as e:
            print(f"  variant {fields}: {e}", flush=True)
            return None
    gcfg = config(lambda: dispatch.gate_up_config(x, gu_w[0], gu_w[1], None, act="silu", h_format="bf16",
                                                  tile_major=True))
    dcfg = config(lambda: dispatch.down_config(h, dn_w[0], dn_w[1], None, None, torch.bfloat16, True))

    def gate_up(w):
        return kg.gate_up(gcfg, x, w[0], w[1], None, w[2], tile_major=major)[0]

    def down(w):
        return kd.down(dcfg, h, w[0], w[1], None, None, w[2], tile_major=major, h_rs_order=rs)
    return gate_up if gcfg else None, down if dcfg else None


def _bf16(rows, cols, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(rows, cols, device="cuda", generator=g) * 0.05).to(torch.bfloat16)


def run(shapes, ms, iters=50, abs_: list[dict] = (), bf16: bool = False):
    rows = []
    for hidden, inter in shapes:
        if bf16:  # our bf16 kernels on bf16 weights: the prefill target's yardstick (issue 22)
            bf_gu = _layers(lambda i: _bf16(2 * inter, hidden, i), 4 * inter * hidden)
            bf_dn = _layers(lambda i: _bf16(hidden, inter, i), 2 * inter * hidden)
        nv_gu, nv_dn = _nvfp4_layers(hidden, inter)
        f8_gu = _layers(lambda i: _fp8(2 * inter, hidden, i), 2 * inter * hidden)
        f8_dn = _layers(lambda i: _fp8(hidden, inter, i), hidden * inter)
        tm_gu, tm_dn = _tile_major(nv_gu), _tile_major(nv_dn)  # the modules' order
        floor_gu = _nbytes(*nv_gu[0]) / COPY_TB_S / 1e6
        floor_dn = _nbytes(*nv_dn[0]) / COPY_TB_S / 1e6
        for m in ms:
            x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
            h = torch.randn(m, inter, device="cuda").to(torch.bfloat16)
            xq, xs = ops.quant_x(x)
            hq, hs = ops.quant_x(h)
            it = {"i": 0}

            def step(layers, fn):
                def call():
                    it["i"] = (it["i"] + 1) % len(layers)
                    return fn(layers[it["i"]])
                return call

            t = {}
            if abs_:
                gu_ref = ops.gate_up(x, *nv_gu[0][:2], None, nv_gu[0][2], interleave=128, h_format="bf16")[0]  # (packed)
                dn_ref = ops.down(h, *nv_dn[0][:2], None, nv_dn[0][2])
            for i, ab in enumerate(abs_, 1):
                v_gu, v_dn = (nv_gu, nv_dn) if ab.get("tile_major") is False else (tm_gu, tm_dn)
                variant = _variant(ab, x, h, v_gu[0], v_dn[0])
                label = "variant" if len(abs_) == 1 else f"variant {i}"
                for name, fn, layers, ref in (("gate_up", variant[0], v_gu, gu_ref), ("down", variant[1], v_dn, dn_ref)):
                    if fn is not None:
                        out = fn(layers[0])
                        rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                        print(f"  {label} {ab}: {name} bit-identical to the dispatched: {torch.equal(out, ref)} "
                              f"(relative Frobenius {rel:.2e})", flush=True)
                        t[f"{label} {name}"] = graph_time_us(step(layers, fn), iters)
            t |= {
                "nvfp4 gate_up": graph_time_us(step(tm_gu, lambda w: ops.gate_up(
                    x, w[0], w[1], None, w[2], interleave=128, h_format="bf16", tile_major=True)), iters),
                "nvfp4 packed gate_up": graph_time_us(step(nv_gu, lambda w: ops.gate_up(
                    x, w[0], w[1], None, w[2], interleave=128, h_format="bf16")), iters),
                "fp8 gate_up": graph_time_us(step(f8_gu, lambda w: ops.gate_up(
                    xq, w[0], w[1], xs, interleave=128, h_format="fp8_group128")), iters),
                "nvfp4 down": graph_time_us(step(tm_dn, lambda w: ops.down(h, w[0], w[1], None, w[2], tile_major=True)),
                                            iters),
                "nvfp4 packed down": graph_time_us(step(nv_dn, lambda w: ops.down(h, w[0], w[1], None, w[2])), iters),
                "fp8 down": graph_time_us(step(f8_dn, lambda w: ops.down(hq, w[0], w[1], hs)), iters),
            }
            if any(ab.get("rs_decode") for ab in abs_):  # what the activations' k order costs a call
                from swiglu_fused.kernels.sm90 import k_order

                for name, a in (("x", x), ("h", h)):
                    t[f"rs_k_order {name} (torch)"] = graph_time_us(lambda: nvfp4_layout.rs_k_order(a), iters)
                    t[f"rs_k_order {name} (kernel)"] = graph_time_us(lambda: k_order.k_order(a), iters)
            if bf16:
                t["bf16 gate_up"] = graph_time_us(step(bf_gu, lambda w: ops.gate_up(
                    x, w, interleave=128, h_format="bf16")), iters)
                t["bf16 down"] = graph_time_us(step(bf_dn, lambda w: ops.down(h, w)), iters)
            rows.append((hidden, inter, m, t, floor_gu, floor_dn))
            print(f"{hidden}×{inter} M = {m}: " + ", ".join(f"{k} {v:.1f} µs" for k, v in t.items())
                  + f"; floors: gate_up {floor_gu:.1f} µs, down {floor_dn:.1f} µs", flush=True)
    return rows


def run_sets(shapes, ms, sets: dict, rounds: int, iters: int = 20) -> None:
    """--set: gate_up and down alone, shipped and under each set of constants, interleaved."""
    import itertools
    import statistics

    from benchmarks.launch_ab import under_constants
    from swiglu_fused.bench import interleaved_us

    for hidden, inter in shapes:
        gu, dn = map(_tile_major, _nvfp4_layers(hidden, inter))
        for m in ms:
            x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
            h = torch.randn(m, inter, device="cuda").to(torch.bfloat16)
            ops_ = {"gate_up": (gu, lambda w: ops.gate_up(x, w[0], w[1], None, w[2], interleave=128, h_format="bf16",
                                                          tile_major=True)[0]),
                    "down": (dn, lambda w: ops.down(h, w[0], w[1], None, w[2], tile_major=True))}
            fns, plans = {}, {}
            for name, constants in {"shipped": {}, **sets}.items():
                for op, (layers, fn) in ops_.items():
                    def call(fn=fn, constants=constants, it=itertools.cycle(layers)):
                        return under_constants(constants, lambda: fn(next(it)))
                    fns[f"{op} {name}"] = call
                plans[name] = under_constants(constants, lambda: _plans(x, h, gu[0], dn[0]))
            res = interleaved_us(fns, iters, rounds)
            line = []
            for op in ops_:
                base = res[f"{op} shipped"]
                parts = [f"shipped {statistics.median(base):.1f}"]
                for name in sets:
                    r = [v / b for v, b in zip(res[f"{op} {name}"], base)]
                    parts.append(f"{name} {statistics.median(res[f'{op} {name}']):.1f} ({min(r):.3f}-{max(r):.3f}x)")
                line.append(f"{op} " + " | ".join(parts))
            print(f"{hidden}x{inter} M={m}: " + " || ".join(line) + "  [" + "; ".join(
                f"{k}: {v}" for k, v in plans.items()) + "]", flush=True)


def _plans(x, h, gu_w, dn_w) -> str:
    """The dispatched tiles and stream-K splits (ctas, sk_tiles) of gate_up and down, as the ops run them."""
    from swiglu_fused.kernels.sm90 import schedule

    g = dispatch.gate_up_config(x, gu_w[0], gu_w[1], None, act="silu", h_format="bf16", tile_major=True)
    d = dispatch.down_config(h, dn_w[0], dn_w[1], None, None, torch.bfloat16, True)
    sms = schedule.sm_count(x.device)
    m, hidden, inter = x.shape[0], x.shape[1], h.shape[1]
    return (f"gate_up {g.tile_m} {schedule.schedule(g, m, 2 * inter, hidden, sms)}, "
            f"down {d.tile_m} {schedule.schedule(d, m, hidden, inter, sms)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x14336,8192x3584")
    ap.add_argument("--m", default="1,16,64,1024")
    ap.add_argument("--bf16", action="store_true", help="also time our bf16 gate_up and down on bf16 weights")
    ap.add_argument("--ab", action="append", default=[], metavar="FIELD=VALUE,...",
                    help="time this config variant too (repeat for several, one process)")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="MODULE.NAME=VALUE;...",
                    help="time gate_up and down as dispatched and with these constants changed (repeatable)")
    ap.add_argument("--rounds", type=int, default=5, help="with --set: rounds of interleaved timings")
    args = ap.parse_args()
    if args.sets:
        from benchmarks.launch_ab import parse_set

        sets = {f"set{i + 1}": parse_set(spec) for i, spec in enumerate(args.sets)}
        return run_sets(parse_shapes(args.shapes), parse_ms(args.m), sets, args.rounds)
    run(parse_shapes(args.shapes), parse_ms(args.m), abs_=[f for f in (parse_variant(f"ab:{v}")[1] for v in args.ab) if f],
        bf16=args.bf16)


if __name__ == "__main__":
    main()
