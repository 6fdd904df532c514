"""Serve a packed checkpoint with vLLM and print the greedy tokens as JSON (run as a script by
test_vllm_serving.py: vLLM runs one engine per process, and its engine needs a __main__ guard).

    python vllm_serve_tokens.py MODEL_DIR TENSOR_PARALLEL_SIZE [--eager] [--tile-major-anywhere] [--reload DIR]

Prints one line ``RESULT {"tokens": [[...], ...], "gate_up_calls": N, "down_calls": D, "tile_major_weights": W}``: N and D
count the calls of our gate_up and down dispatch (swiglu_fused.kernels.dispatch.gate_up_backend /
down_backend: run by our ops' implementations, so counted in eager and in compiled graphs alike) in
this process, the proof that vLLM's forward ran our ops: each packed MLP runs gate_up and down once
per forward, each shard of a packed linear (q, k, v, o) one down (with T > 1 the ranks run in
worker processes: nothing is then counted). ``--tile-major-anywhere`` tells the plugin that the
kernels read nvfp4 weights and fp8 gate_up weights tile-major on this device too
(dispatch.nvfp4_tile_major / fp8_tile_major without their sm90 condition: on the CPU the reference
reads that order), and W counts the weights it was told so of (once each time it settles them).
``--reload DIR``: after generating, reload the weights in place from DIR (a packed checkpoint of the
same model: vLLM's ``reload_weights``, what RL trainers use to sync weights) and generate again:
``reloaded_tokens`` (and ``tile_major_weights_after_reload``, W then); ``new_multipliers`` counts the packed linears' per-tensor multipliers (those
made from a divisor) that are not the tensors held before the reload (a CUDA graph captured before
it would read those).
"""

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: 4 s to start, not 20-30

PROMPTS = 2
PROMPT_LEN = 12
NEW_TOKENS = 8
VOCAB = 128


def prompts():
    import torch

    return torch.randint(0, VOCAB, (PROMPTS, PROMPT_LEN), generator=torch.Generator().manual_seed(0))


def main(model: str, tp: int, eager: bool, tile_major_anywhere: bool = False, reload: str | None = None) -> None:
    import torch
    from vllm import LLM, SamplingParams

    from swiglu_fused.kernels import dispatch

    calls = {"gate_up_calls": 0, "down_calls": 0, "tile_major_weights": 0}

    def counting(key, backend):
        def counted(*args, **kwargs):
            calls[key] += 1
            return backend(*args, **kwargs)
        return counted

    dispatch.gate_up_backend = counting("gate_up_calls", dispatch.gate_up_backend)
    dispatch.down_backend = counting("down_calls", dispatch.down_backend)
    if tile_major_anywhere:
        from swiglu_fused.kernels import fp8_layout, nvfp4_layout

        def anywhere(w):
            major = w.dim() == 2 and (w.dtype == torch.uint8 and nvfp4_layout.fits(w.shape[0], 2 * w.shape[1])
                                      or w.dtype == torch.float8_e4m3fn and fp8_layout.fits(*w.shape))
            calls["tile_major_weights"] += int(major)
            return major
        dispatch.nvfp4_tile_major = dispatch.fp8_tile_major = anywhere
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", tensor_parallel_size=tp,
              enforce_eager=eager, max_model_len=64, seed=0)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    def tokens():
        out = llm.generate([{"prompt_token_ids": p.tolist()} for p in prompts()], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in out]
    result = {"tokens": tokens(), **calls}
    if reload:
        held = _multipliers(llm)
        llm.collective_rpc("reload_weights", kwargs={"weights_path": reload})
        result["reloaded_tokens"] = tokens()
        result["tile_major_weights_after_reload"] = calls["tile_major_weights"]
        after = _multipliers(llm)
        result["multipliers"] = len(after)
        result["new_multipliers"] = sum(a is not b for a, b in zip(held, after)) + abs(len(held) - len(after))
    print("RESULT " + json.dumps(result), flush=True)


def _multipliers(llm) -> list:
    """The packed linears' per-tensor multipliers that are tensors of their own (made from a divisor)."""
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
    return [mult for m in model.modules() for mult in getattr(m, "swiglu_multipliers", ()) if mult is not None]


if __name__ == "__main__":
    flags = sys.argv[3:]
    main(sys.argv[1], int(sys.argv[2]), "--eager" in flags, "--tile-major-anywhere" in flags,
         flags[flags.index("--reload") + 1] if "--reload" in flags else None)
