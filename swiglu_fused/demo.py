"""The built-in demo: a tiny random LLaMA, converted to every format, run on the reference path.

No download and no GPU: the model is built from a config with random weights, saved with
``save_pretrained``, converted with ``convert``, checked with ``verify``, and its MLPs replaced by
FusedSwiGLUMLP modules read back from the packed checkpoint. The table compares each format's MLP
outputs and logits with the unconverted model's.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from . import formats
from .layer import FusedSwiGLUMLP
from .weight_packing.convert import convert
from .weight_packing.packed_checkpoint import PackedCheckpoint
from .weight_packing.verify import verify

# hidden 320 is not a multiple of 128 (partial scale blocks); I = 768 holds 6 chunks of g = 128.
TINY_LLAMA = dict(hidden_size=320, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, tie_word_embeddings=False)


@dataclass
class DemoRow:
    weight_format: str
    mlp_max_abs: float
    mlp_mean_abs: float
    mlp_rel: float
    logits_max_abs: float
    logits_rel: float
    top1_agree: float


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**TINY_LLAMA, architectures=["LlamaForCausalLM"])
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _mlp_io(model, tokens) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) of every MLP of the unconverted model on ``tokens``."""
    seen = []
    hooks = [layer.mlp.register_forward_hook(lambda m, i, o: seen.append((i[0].detach(), o.detach())))
             for layer in model.model.layers]
    with torch.no_grad():
        model(tokens)
    for h in hooks:
        h.remove()
    return seen


def run_demo(formats_to_run=tuple(formats.WEIGHT_FORMATS), seed: int = 0, workdir: str | Path | None = None,
             progress: bool = False, echo=print) -> list[DemoRow]:
    model = tiny_llama(seed)
    tokens = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref_logits = model(tokens).logits.float()
    mlp_io = _mlp_io(model, tokens)
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        src = Path(tmp) / "tiny-llama"
        _save_quietly(model, src)
        echo(f"tiny LLaMA: hidden {TINY_LLAMA['hidden_size']}, intermediate {TINY_LLAMA['intermediate_size']}, "
             f"{TINY_LLAMA['num_hidden_layers']} layers, random weights, saved to {src} (a temporary directory, "
             f"removed when the demo ends)")
        for fmt in formats_to_run:
            dst = Path(tmp) / f"tiny-llama-{fmt}"
            report = convert(src, dst, weight_format=fmt, progress=progress)
            echo(report.summary())
            checked = verify(dst, against=src)
            if not checked.ok:
                raise RuntimeError(checked.summary())
            rows.append(_evaluate(fmt, dst, tokens, ref_logits, mlp_io, seed))
    echo(format_rows(rows))
    echo("(errors against the original model, same inputs; a random tiny model's logits are nearly tied, "
         "so its top-1 agreement is a stress test of the quantized formats)")
    return rows


def _save_quietly(model, path: Path) -> None:
    """save_pretrained without transformers' shard progress bar (the demo prints its own lines)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _evaluate(fmt: str, dst: Path, tokens, ref_logits, mlp_io, seed: int) -> DemoRow:
    ckpt = PackedCheckpoint(dst)
    model = tiny_llama(seed)  # same seed → same non-MLP weights as the reference model
    mlps = [FusedSwiGLUMLP.from_packed(ckpt, m) for m in ckpt.config.modules]
    errs = []
    with torch.no_grad():
        for mlp, (x, y_ref) in zip(mlps, mlp_io):
            errs.append((mlp(x).float() - y_ref.float(), y_ref.float()))
        for layer, mlp in zip(model.model.layers, mlps):
            layer.mlp = mlp
        logits = model(tokens).logits.float()
    diff = torch.cat([d.flatten() for d, _ in errs])
    ref = torch.cat([r.flatten() for _, r in errs])
    return DemoRow(
        fmt, diff.abs().max().item(), diff.abs().mean().item(), (diff.norm() / ref.norm()).item(),
        (logits - ref_logits).abs().max().item(), ((logits - ref_logits).norm() / ref_logits.norm()).item(),
        (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item())


def format_rows(rows: list[DemoRow]) -> str:
    head = f"{'format':<14}{'MLP max|err|':>14}{'MLP mean|err|':>15}{'MLP rel':>10}{'logits max|err|':>17}" \
           f"{'logits rel':>12}{'top-1 agree':>13}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.weight_format:<14}{r.mlp_max_abs:>14.4g}{r.mlp_mean_abs:>15.4g}{r.mlp_rel:>10.4f}"
                     f"{r.logits_max_abs:>17.4g}{r.logits_rel:>12.4f}{r.top1_agree:>12.1%}")
    return "\n".join(lines)
