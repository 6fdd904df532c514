"""One home per idea (issue 20): formats.py registers the weight formats, activations and h
formats; the reference and the sm90 epilogue implement exactly those names; no code outside
formats.py compares a registered name as a string literal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import swiglu_fused
from swiglu_fused import formats, interleave as il
from swiglu_fused.kernels import reference

ROOT = Path(swiglu_fused.__file__).parent


def test_reference_implements_the_registered_names():
    assert set(reference.ACTIVATIONS) == set(formats.ACTIVATIONS)
    assert set(reference.H_STORES) == set(formats.H_FORMATS)


def test_sm90_epilogue_implements_the_registered_names():
    pytest.importorskip("cutlass")
    from swiglu_fused.kernels.sm90 import activations_and_h, tile_config

    assert set(activations_and_h.ACTIVATIONS) == set(formats.ACTIVATIONS)
    assert set(activations_and_h.H_FORMATS) == set(formats.H_FORMATS)
    for name, spec in formats.H_FORMATS.items():  # the kernel stores what the spec says
        impl = activations_and_h.h_spec(name)
        assert getattr(torch, impl.torch_dtype) == spec.dtype and impl.scaled == spec.scaled
    assert set(tile_config.MAINLOOPS) == {f.name for f in formats.WEIGHT_FORMATS.values() if f.sm90_kernels}


def test_every_weight_format_feeds_a_registered_h_format():
    for fmt in formats.WEIGHT_FORMATS.values():
        assert fmt.h_format in formats.H_FORMATS
        assert formats.format_of_weight(torch.empty(0, dtype=fmt.weight_dtype)) is fmt


def test_lookup_names_the_argument_and_the_backend():
    with pytest.raises(ValueError, match="^act: unknown activation 'relu'; expected one of"):
        formats.implementation(reference.ACTIVATIONS, "relu", "act", "reference")
    with pytest.raises(ValueError, match="^h_format: no reference implementation of h format 'bf16'"):
        formats.implementation({}, "bf16", "h_format", "reference")


@pytest.mark.parametrize("fmt", list(formats.WEIGHT_FORMATS))
@pytest.mark.parametrize("g", [16, 128])
def test_each_format_quantizes_packs_and_dequantizes_through_its_class(fmt, g):
    """The class's tensors have the spec's dtypes and shapes, its round trip stays in its bound,
    and pack / unpack of gate_up is exact."""
    spec = formats.weight_format(fmt)
    if formats.interleave_problem(g, spec):
        pytest.skip(f"{fmt} needs g a multiple of {spec.interleave_multiple}")
    torch.manual_seed(0)
    rows, cols = 256, 200
    kind = formats.DIVISOR if spec.global_scale_name else None
    w = {n: torch.randn(rows, cols) for n in ("gate", "up")}
    q = {n: spec.quantize(w[n], n, kind) for n in w}
    assert {k: (t.dtype, tuple(t.shape)) for k, t in q["gate"].items()} == spec.tensors(rows, cols, 1)
    assert spec.cols_of(q["gate"][spec.weight_name]) == cols
    err = (spec.dequantize(q["gate"], kind) - w["gate"]).norm() / w["gate"].norm()
    assert 0 < err <= spec.roundtrip_bound
    packed = il.pack_gate_up(q["gate"], q["up"], g, spec)
    assert {k: (t.dtype, tuple(t.shape)) for k, t in packed.items()} == spec.tensors(2 * rows, cols, 2)
    gate, up = il.unpack_gate_up(packed, g, spec)
    for k in q["gate"]:
        assert torch.equal(gate[k].view(torch.uint8), q["gate"][k].view(torch.uint8))
        assert torch.equal(up[k].view(torch.uint8), q["up"][k].view(torch.uint8))


# A comparison (==, !=, in / not in a literal tuple, list or set) with a string literal that is a
# registered weight format, h format, activation or global-scale kind.
_NAMES = sorted({*formats.WEIGHT_FORMATS, *formats.H_FORMATS, *formats.ACTIVATIONS, *formats.GLOBAL_SCALE_KINDS})
_LIT = r"""['"](?:%s)['"]""" % "|".join(map(re.escape, _NAMES))
_COMPARISON = re.compile(
    rf"""(?:==|!=)\s*{_LIT}|{_LIT}\s*(?:==|!=)|\bin\s*[(\[{{][^)\]}}]*{_LIT}""")


def _comparisons(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if _COMPARISON.search(line.split("#")[0])]


def test_the_grep_finds_what_it_should():
    assert len(_comparisons('if fmt == "nvfp4":\n x = a if h_format != \'bf16\' else b\n if w in ("bf16", "x"):')) == 3
    assert not _comparisons('ACTIVATIONS = {"silu": silu}\nname = "nvfp4"\nif fmt == FP8:  # == "nvfp4"')


def test_no_format_name_comparisons_outside_the_registry():
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "formats.py":
            continue
        hits = _comparisons(path.read_text())
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}
