"""Whole gated MLP on the GPU: ours against transformers and the best unfused fp8 pipeline.

Peers, in one process on the same inputs, each timed as a CUDA graph (median of --iters replays).
Each peer cycles through enough layers of its own weights (``layer_count``: 2 for the 70B TP-8
shard, 1 for LLaMA-3-8B) that no call finds its weights in L2, as in a model:
  hf_bf16        transformers LlamaMLP, bf16, eager
  hf_compiled    the same under torch.compile
  fp8_unfused    compiled quant_x → cuBLAS block-scaled GEMM [M, 2I] → SiLU·up·quant (the faster
                 of inductor's and a Triton kernel at that M, swiglu_fused/bench.py)
                 → cuBLAS block-scaled GEMM (down); both quantizations write their scales M-major,
                 the layout cuBLAS reads (quant.m_major), so no transpose copy is timed
  fp8_unfused_deepgemm  (--interleave, where DeepGEMM is importable) the same with DeepGEMM's GEMMs
  ours_fp8       FusedSwiGLUMLP fp8_block128: quant_x + fused gate_up kernels, down as ops.down
                 dispatches it (sm90 kernel at M ≤ 16 and from a full wave of tiles, cuBLAS between)
  ours_bf16      FusedSwiGLUMLP bf16: fused gate_up kernel (bf16 mainloop), down as ops.down

    python -m benchmarks.bench_mlp [--shapes 4096x14336,8192x3584] [--m 1,16,...] [--json out.json]
    python -m benchmarks.bench_mlp --generate      # also tokens/s of generate(), patched vs unpatched
    python -m benchmarks.bench_mlp --generate-only # only that
    python -m benchmarks.bench_mlp --generate-only --gen-batch 64  # a batch where decode is MLP-bound
    python -m benchmarks.bench_mlp --interleave 8  # ours vs unfused vs hf in alternation, per-round ratios
    python -m benchmarks.bench_mlp --interleave 8 --pdl-ab  # and ours with PDL on (TileConfig.pdl)
    python -m benchmarks.bench_mlp --interleave 5 --ab gate_up:l2_hint=w_first  # and ours with a config change

--json NAME.json writes the results (with the date, GPU and torch) and NAME.png (benchmarks/plot.py).
`swiglu-fused bench` runs the same comparison (hf_bf16, fp8_unfused, ours) from a normal install.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.harness import (
    ALL_PDL, DEEPGEMM, UnfusedFP8, deep_gemm, deep_gemm_block_gemm, fused, graph_time_us, hf_mlp, interleaved_us, layer_count, parse_ab, rotating, unfused_fp8,
    with_configs, write_json,
)
from swiglu_fused import patch_model

PEERS = ("hf_bf16", "hf_compiled", "fp8_unfused", "ours_fp8", "ours_bf16")



def bench_interleaved(shapes, ms, iters, rounds, variants=None):
    """ours_fp8 against fp8_unfused (and hf_bf16), timed in alternation ``rounds`` times
    (harness.interleaved_us): per-round ratios, to tell margins of a few % from drift.
    Every pipeline cycles through ``layer_count`` layers of its own weights. ``variants``: name →
    kernel config changes (parse_ab's form), each one more pipeline of ours, timed in the same rounds."""
    variants = variants or {}
    dg = deep_gemm()  # where importable, its unfused pipeline is timed beside the cuBLAS one
    dg_unfused = UnfusedFP8(deep_gemm_block_gemm(dg)) if dg is not None else None
    rows = []
    print(f"{'H':>5} {'I':>6} {'M':>6} {'fp8_unfused':>12} {'ours_fp8':>12} {'hf_bf16':>12}  unfused/ours per round")
    for hidden, inter in shapes:
        layers = []
        for seed in range(layer_count(hidden, inter)):
            mlp = hf_mlp(hidden, inter, seed)
            ours = fused(mlp)
            layer = dict(hf_bf16=mlp, ours_fp8=ours, fp8_unfused=unfused_fp8(ours))
            if dg_unfused is not None:
                layer[DEEPGEMM] = dg_unfused.pipeline(ours)
            for name, fields in variants.items():
                layer[name] = with_configs(fused(mlp), fields)
            layers.append(layer)
        for m in ms:
            x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
            names = [n for n in layers[0] if not n.startswith("fp8_unfused") or unfused_runs(layers[0][n], x, m, n)]
            fns = {n: rotating(layers, n, x) for n in names}
            t = interleaved_us(fns, iters, rounds)
            t.setdefault("fp8_unfused", [float("nan")] * rounds)
            ratios = [u / o for u, o in zip(t["fp8_unfused"], t["ours_fp8"])]
            med = {k: statistics.median(v) for k, v in t.items()}
            rows.append(dict(hidden=hidden, inter=inter, m=m, rounds=rounds, layers=len(layers),
                             **{f"{k}_us": v for k, v in med.items()},
                             **{f"{k}_us_per_round": v for k, v in t.items()}, unfused_over_ours_per_round=ratios))
            print(f"{hidden:>5} {inter:>6} {m:>6} {med['fp8_unfused']:>12.1f} {med['ours_fp8']:>12.1f} "
                  f"{med['hf_bf16']:>12.1f}  " + " ".join(f"{r:.3f}" for r in ratios)
                  + "".join(f"   {n} {med[n]:.1f} (ours/it {statistics.median(o / v for o, v in zip(t['ours_fp8'], t[n])):.3f})"
                            for n in variants)
                  + "".join(f"   {n} {med[n]:.1f} (it/ours {statistics.median(v / o for o, v in zip(t['ours_fp8'], t[n])):.3f})"
                            for n in (DEEPGEMM,) if n in med), flush=True)
        del layers
        torch.cuda.empty_cache()
    return rows


def unfused_runs(unfused, x, m, name="fp8_unfused"):
    """Whether the GEMM library takes this M (cuBLAS's block-scaled GEMM rejects M = 1): reported, not hidden."""
    try:
        unfused(x)
        return True
    except RuntimeError as e:
        print(f"  {name} M={m}: {str(e).splitlines()[0][:90]}")
        return False


def bench_shapes(shapes, ms, iters):
    """Every peer at every M, each cycling through ``layer_count`` layers of its own weights."""
    rows = []
    print(f"{'H':>5} {'I':>6} {'M':>6} " + " ".join(f"{p:>12}" for p in PEERS) + f" {'vs hf_bf16':>10} {'vs unfused':>10}")
    for hidden, inter in shapes:
        layers = []
        for seed in range(layer_count(hidden, inter)):
            mlp = hf_mlp(hidden, inter, seed)
            ours = {fmt: fused(mlp, fmt) for fmt in ("fp8_block128", "bf16")}
            layers.append(dict(hf_bf16=mlp, hf_compiled=torch.compile(mlp, dynamic=True),
                               fp8_unfused=unfused_fp8(ours["fp8_block128"]), ours_fp8=ours["fp8_block128"],
                               ours_bf16=ours["bf16"]))
        for m in ms:
            x = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
            t = {}
            for name in PEERS:
                try:
                    t[name] = graph_time_us(rotating(layers, name, x), iters)
                except Exception as e:  # a peer that does not run this M is reported, not hidden
                    print(f"  {name} M={m}: {type(e).__name__}: {str(e)[:100]}")
                    t[name] = float("nan")
            ref = layers[0]["hf_bf16"](x).float()
            err = ((layers[0]["ours_fp8"](x).float() - ref).norm() / ref.norm()).item()
            row = dict(hidden=hidden, inter=inter, m=m, layers=len(layers), fp8_rel_err_vs_bf16=err,
                       **{f"{k}_us": v for k, v in t.items()})
            rows.append(row)
            print(f"{hidden:>5} {inter:>6} {m:>6} " + " ".join(f"{t[p]:>12.1f}" for p in PEERS)
                  + f" {t['hf_bf16'] / t['ours_fp8']:>10.2f} {t['fp8_unfused'] / t['ours_fp8']:>10.2f}", flush=True)
        del layers
        torch.cuda.empty_cache()
    return rows


def generate_models(layers):
    """A random LLaMA of LLaMA-3-8B width with ``layers`` layers: unpatched, patched (fp8_block128), and
    patched with the fused ops launched one by one (eager_graph_rows = 0)."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=32000)
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    patched = copy.deepcopy(base)
    print(patch_model(patched, weight_format="fp8_block128"))
    no_graphs = copy.deepcopy(patched)
    for m in no_graphs.modules():
        if hasattr(m, "eager_graph_rows"):
            m.eager_graph_rows = 0
    return {"unpatched": base, "patched_fp8": patched, "patched_fp8_no_graphs": no_graphs}


def generate_s(model, prompt, new_tokens):
    """Seconds of one greedy generate() of exactly ``new_tokens`` tokens per sequence, after a short
    warm-up. The mask and pad token are what generate() picks itself without them (all ones: no
    padding; EOS), given so that it does not warn at every call."""
    kw = dict(attention_mask=torch.ones_like(prompt), pad_token_id=model.config.eos_token_id, do_sample=False)
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=4, **kw)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def tokens_per_s(seconds, batch, prompt_len, new_tokens):
    """(new tokens/s, processed tokens/s) of one generate(): B·N and B·(P + N) tokens over its time."""
    return batch * new_tokens / seconds, batch * (prompt_len + new_tokens) / seconds


def bench_generate(layers=8, batch=1, prompt_len=128, new_tokens=64, rounds=3):
    """tokens/s of greedy generate() on a (batch, prompt_len) random prompt (generate_models): the
    three models timed in alternation ``rounds`` times (the first measurement of this benchmark ran
    unpatched-then-patched once, and its unpatched figure looked suspiciously low). At batch 1 eager
    decode is host-bound and patched and unpatched come out even; a larger batch makes it MLP-bound."""
    models = generate_models(layers)
    prompt = torch.randint(0, 32000, (batch, prompt_len), device="cuda")
    new, processed = ({name: [] for name in models} for _ in range(2))
    for _ in range(rounds):
        for name, model in models.items():
            n, p = tokens_per_s(generate_s(model, prompt, new_tokens), batch, prompt_len, new_tokens)
            new[name].append(n)
            processed[name].append(p)
            print(f"generate {name} (B={batch}, P={prompt_len}, N={new_tokens}): {n:.1f} new tokens/s, "
                  f"{p:.1f} processed tokens/s", flush=True)
    return dict(layers=layers, batch=batch, prompt=prompt_len, new=new_tokens, new_tokens_per_s=new,
                processed_tokens_per_s=processed)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="4096x14336,8192x3584")
    p.add_argument("--m", default="1,16,64,256,1024,4096,16384")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--generate", action="store_true", help="also measure generate() tokens/s")
    p.add_argument("--generate-only", action="store_true", help="only measure generate() tokens/s")
    p.add_argument("--rounds", type=int, default=3, help="generate(): alternating rounds of the three models")
    p.add_argument("--gen-batch", type=int, default=1, metavar="B", help="generate(): prompts in the batch")
    p.add_argument("--gen-prompt", type=int, default=128, metavar="P", help="generate(): prompt tokens per sequence")
    p.add_argument("--gen-new", type=int, default=64, metavar="N", help="generate(): new tokens per sequence")
    p.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                   help="instead of the full table: ours_fp8, fp8_unfused and hf_bf16 timed in alternation, ROUNDS times")
    p.add_argument("--pdl-ab", action="store_true",
                   help="with --interleave: also ours with programmatic dependent launch on at every M "
                        "(ours_fp8_pdl; dispatched only up to dispatch.PDL_M rows)")
    p.add_argument("--ab", action="append", default=[], metavar="FAMILY:FIELD=VALUE,...",
                   help="with --interleave: also ours with these kernel config fields changed, e.g. "
                        "'gate_up:l2_hint=w_first' (repeat the option for more variants)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch._dynamo.config.cache_size_limit = 1024
    shapes = [tuple(map(int, s.split("x"))) for s in a.shapes.split(",")]
    result = {}
    ms = [int(m) for m in a.m.split(",")]
    if a.interleave:
        variants = {f"ours_fp8_{spec}": parse_ab(spec) for spec in a.ab}
        if a.pdl_ab:
            variants["ours_fp8_pdl"] = ALL_PDL
        result["interleaved"] = bench_interleaved(shapes, ms, a.iters, a.interleave, variants)
    elif not a.generate_only:
        result["rows"] = bench_shapes(shapes, ms, a.iters)
    if a.generate or a.generate_only:
        result["generate"] = bench_generate(batch=a.gen_batch, prompt_len=a.gen_prompt, new_tokens=a.gen_new,
                                            rounds=a.rounds)
    # plot.py draws the per-M tables; generate() alone has none
    write_json(a.json, chart=bool(result.get("rows") or result.get("interleaved")), **result)


if __name__ == "__main__":
    main()
