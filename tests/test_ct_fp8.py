"""compressed-tensors FP8 block sources (issue 21, item 3): ``format: float-quantized`` with block
[128, 128] weights and dynamic group-128 activations, what llm-compressor's FP8_BLOCK scheme
writes, holds the numbers of our fp8_block128 (``weight_scale`` multiplies, like
``weight_scale_inv``), so convert repacks it by moving bytes, MLPs and attention alike. Other FP8
strategies are refused with a message that names what is supported."""

import hashlib
import json
import shutil

import pytest
import torch

import swiglu_fused  # noqa: F401  (registers the swiglu_fused quantization method)
from swiglu_fused import verify
from swiglu_fused.cli import main
from swiglu_fused.linear import PackedLinear
from swiglu_fused.weight_packing import safetensors_io as sio

from conftest import _causal_lm, make_ct_fp8_block
from test_whole_model import ATTENTION, LOGITS_BOUND, _load, _rel

BOUND = LOGITS_BOUND["fp8_block128"]


def _logits_and_tokens(model):
    tokens = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(tokens).logits, model.generate(tokens, max_new_tokens=8, do_sample=False, pad_token_id=0)


def _same_tokens(model, source, seed):
    """Greedy tokens of ``model`` equal the source's. At this size (random weights, flat logits) the
    top-2 gap of some steps is ~0.01, below what e4m3 activations (ours; the source's CPU path runs
    bf16 activations) move a logit, so the full greedy equality is asserted at a seed without such
    a near tie, and at every seed each step whose top-2 gap exceeds 0.06 must agree teacher-forced."""
    got, got_tokens = _logits_and_tokens(model)
    expected, expected_tokens = _logits_and_tokens(source)
    assert _rel(got, expected) < BOUND, _rel(got, expected)
    with torch.no_grad():  # next-token choices along the source's sequence, prompt included
        ours, theirs = model(expected_tokens).logits, source(expected_tokens).logits.float()
    top2 = theirs.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 0.06
    assert clear.sum() >= clear.numel() // 3, clear  # not vacuous
    assert torch.equal(ours.argmax(-1)[clear], theirs.argmax(-1)[clear])
    if seed in NO_NEAR_TIE:
        assert torch.equal(got_tokens, expected_tokens)


def _hashes(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def _convert_and_check(src, dst, capsys):
    """convert with the default format, then verify --against: everything moved bit-exactly."""
    assert main(["convert", str(src), str(dst), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "(fp8_block128," in out and "6 projections repacked bit-exactly, 0 quantized" in out, out
    assert "8 quantized non-MLP linears of the source (attention, ...): 8 repacked bit-exactly" in out, out
    qcfg = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qcfg["weight_format"] == "fp8_block128" and sorted(qcfg["linears"]) == ATTENTION
    checked = verify(dst, against=src)
    assert checked.ok and len(checked.checks) == 14, checked.summary()
    assert all(c.mode == "bit-exact" for c in checked.checks), checked.summary()
    assert main(["verify", str(dst), "--against", str(src)]) == 0
    assert "OK" in capsys.readouterr().out
    # the bytes themselves: e4m3 codes unchanged, compressed-tensors' bf16 scales widened exactly to fp32
    theirs = sio.load_file(src / "model.safetensors", ["model.layers.1.self_attn.o_proj.weight",
                                                        "model.layers.1.self_attn.o_proj.weight_scale"])
    ours = sio.load_file(dst / "model.safetensors", ["model.layers.1.self_attn.o_proj.weight",
                                                     "model.layers.1.self_attn.o_proj.weight_scale_inv"])
    assert torch.equal(ours["model.layers.1.self_attn.o_proj.weight"].view(torch.uint8),
                       theirs["model.layers.1.self_attn.o_proj.weight"].view(torch.uint8))
    s = ours["model.layers.1.self_attn.o_proj.weight_scale_inv"]
    assert s.dtype == torch.float32 and torch.equal(s, theirs["model.layers.1.self_attn.o_proj.weight_scale"].float())


def _load_packed(dst):
    model, info = _load(dst, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"], info  # nothing dropped, nothing random
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, PackedLinear) and q.weight.dtype == torch.float8_e4m3fn
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.dtype == torch.bfloat16
    return model


SEED320 = 1
NO_NEAR_TIE = {("llama", 2), ("qwen3", 1), ("llama320", SEED320)}  # (family, seed) whose greedy run meets no near tie


@pytest.mark.parametrize("family,seed", [("llama", 2), ("qwen3", 1), ("qwen3", 2)])
def test_ct_fp8_block_source_repacks_and_matches_transformers(tmp_path, capsys, family, seed):
    """hidden 128: the default format follows the source (fp8_block128), all 14 projections move
    bit-exactly, and the converted model matches transformers loading the SOURCE through
    compressed-tensors' own loader (it runs FP8 blocks on the CPU)."""
    src, dst = tmp_path / "ct", tmp_path / "dst"
    torch.manual_seed(seed)
    make_ct_fp8_block(src, _causal_lm(family, 128, 384))
    qcfg = json.loads((src / "config.json").read_text())["quantization_config"]
    assert qcfg["format"] == "float-quantized" and qcfg["config_groups"]["group_0"]["weights"]["strategy"] == "block"
    _convert_and_check(src, dst, capsys)
    _same_tokens(_load_packed(dst), _load(src), (family, seed))


def _dequantized_reference(src, family, hidden, inter):
    """The source's weights dequantized in the test itself (e4m3 code × its block's scale) in a
    plain bf16 model of the same architecture."""
    model = _causal_lm(family, hidden, inter)
    tensors = sio.load_file(src / "model.safetensors")
    state = {}
    for name, t in tensors.items():
        if name.endswith(".weight_scale"):
            continue
        scale = tensors.get(name + "_scale")
        if scale is not None:
            n, k = t.shape
            s = scale.float().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            t = (t.float() * s).to(torch.bfloat16)
        state[name] = t
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"} - set(state), (missing, unexpected)
    return model


def test_ct_fp8_block_hidden_320(tmp_path, capsys):
    """hidden 320 (not a multiple of 128: partial edge blocks in K and N). compressed-tensors
    writes it, convert repacks it bit-exactly; transformers cannot run the source on the CPU
    (compressed-tensors' group-128 activation quantization needs K a multiple of 128), so the
    converted model is compared with the source's weights dequantized here instead."""
    src, dst = tmp_path / "ct", tmp_path / "dst"
    torch.manual_seed(SEED320)
    make_ct_fp8_block(src, _causal_lm("llama", 320, 384))
    scales = sio.load_file(src / "model.safetensors", ["model.layers.0.mlp.gate_proj.weight_scale"])
    assert list(scales["model.layers.0.mlp.gate_proj.weight_scale"].shape) == [3, 3]  # 384 x 320 in 128-blocks
    _convert_and_check(src, dst, capsys)
    _same_tokens(_load_packed(dst), _dequantized_reference(src, "llama", 320, 384), ("llama320", SEED320))


def _refused(src, dst, capsys, *needles):
    before = _hashes(src)
    capsys.readouterr()
    assert main(["convert", str(src), str(dst), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(src / "config.json") in err, err
    assert ("only FP8 with block [128, 128] weights and dynamic group-128 activations (llmcompressor's FP8_BLOCK "
            "scheme) can be converted") in err, err
    for needle in needles:
        assert needle in err, err
    assert not dst.exists() and not list(dst.parent.glob(f".{dst.name}*")) and not list(dst.parent.glob("*.partial"))
    assert _hashes(src) == before
    return err


def test_per_channel_fp8_source_is_refused(tmp_path, capsys):
    """compressed-tensors' FP8_DYNAMIC (per-channel weight scales, per-token activations), made by
    its own compressor: refused, naming the strategy found and what is supported."""
    src = tmp_path / "ct"
    torch.manual_seed(0)
    make_ct_fp8_block(src, _causal_lm("llama", 128, 384), preset="FP8_DYNAMIC")
    _refused(src, tmp_path / "dst", capsys, "config_groups.group_0.weights: strategy 'channel' (per-channel scales)")


@pytest.fixture(scope="module")
def ct_fp8_block(tmp_path_factory):
    src = tmp_path_factory.mktemp("ct") / "ct"
    torch.manual_seed(0)
    make_ct_fp8_block(src, _causal_lm("llama", 128, 384))
    return src


@pytest.mark.parametrize("edit,needle", [
    (lambda g: g["weights"].update(strategy="tensor", block_structure=None), "strategy 'tensor' (per-tensor scales)"),
    (lambda g: g["weights"].update(block_structure=[64, 64]), "block_structure [64, 64]"),
    (lambda g: g["input_activations"].update(dynamic=False, strategy="tensor", group_size=None),
     "input_activations: type 'float', num_bits 8, dynamic False, strategy 'tensor'"),
    (lambda g: g.update(input_activations=None), "input_activations: absent (weight-only)"),
], ids=["per-tensor", "block-64", "static-activations", "weight-only"])
def test_other_fp8_strategies_are_refused(tmp_path, capsys, ct_fp8_block, edit, needle):
    """The same real checkpoint with its declared scheme changed: every FP8 scheme other than
    block [128, 128] + dynamic group-128 activations is refused before any tensor is read."""
    src = tmp_path / "src"
    shutil.copytree(ct_fp8_block, src)
    config = json.loads((src / "config.json").read_text())
    edit(config["quantization_config"]["config_groups"]["group_0"])
    (src / "config.json").write_text(json.dumps(config))
    _refused(src, tmp_path / "dst", capsys, needle)
