"""Serve a packed checkpoint with vLLM and print the greedy tokens as JSON (run as a script by
test_vllm_serving.py: vLLM runs one engine per process, and its engine needs a __main__ guard).

    python vllm_serve_tokens.py MODEL_DIR TENSOR_PARALLEL_SIZE [--eager]

Prints one line ``RESULT {"tokens": [[...], ...], "gate_up_calls": N}``: N counts the calls of our
gate_up dispatch (swiglu_fused.kernels.dispatch.gate_up_backend) in this process, the proof that
vLLM's forward ran our op (with T > 1 the ranks run in worker processes: N is then not counted).
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


def main(model: str, tp: int, eager: bool) -> None:
    from vllm import LLM, SamplingParams

    from swiglu_fused.kernels import dispatch

    calls = [0]
    backend = dispatch.gate_up_backend

    def counting(*args, **kwargs):
        calls[0] += 1
        return backend(*args, **kwargs)

    dispatch.gate_up_backend = counting
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", tensor_parallel_size=tp,
              enforce_eager=eager, max_model_len=64, seed=0)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": p.tolist()} for p in prompts()], params, use_tqdm=False)
    print("RESULT " + json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in out], "gate_up_calls": calls[0]}),
          flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), "--eager" in sys.argv[3:])
