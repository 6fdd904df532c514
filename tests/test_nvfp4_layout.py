"""nvfp4's tile-major weight order (kernels/nvfp4_layout.py) on the CPU: the reorder, the ops and
the reference reading it, and the modules that keep it. The modules take it only where the sm90
kernels read it (dispatch.nvfp4_tile_major); the ``cpu_tile_major`` fixture says yes on the CPU
too, so that everything around the kernels (state_dict, moves, loads, from_pretrained / save_pretrained)
runs here on the reference path, which reads the same order. tests/gpu/test_nvfp4_gpu.py runs the
kernels on it."""

import pytest
import torch

import swiglu_fused
from swiglu_fused import FusedSwiGLUMLP, convert, quant
from swiglu_fused.kernels import ops
from swiglu_fused.kernels import dispatch, nvfp4_layout, reference  # noqa: E402
from swiglu_fused.linear import PackedLinear

from conftest import make_causal_lm


def _codes(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    s = (torch.rand(n, k // 16, generator=g) * 4 + 0.25).to(torch.float8_e4m3fn)
    return w, s


def _bytes(t):
    return t.view(torch.uint8)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(x.dtype == b[k].dtype and torch.equal(_bytes(x), _bytes(b[k]))
                                        for k, x in a.items())


@pytest.fixture
def cpu_tile_major(monkeypatch):
    """dispatch.nvfp4_tile_major without its device condition: modules on the CPU keep the order."""
    def anywhere(w):
        return (w.dtype == torch.uint8 and w.dim() == 2 and not w.is_meta
                and nvfp4_layout.fits(w.shape[0], 2 * w.shape[1]))
    monkeypatch.setattr(dispatch, "nvfp4_tile_major", anywhere)
    return anywhere


def test_reorder_puts_each_k_tile_together_and_round_trips():
    w, s = _codes(512, 192)
    tw, ts = nvfp4_layout.to_tile_major(w, s)
    assert tw.shape == w.shape and ts.shape == s.shape and ts.dtype == s.dtype
    # k tile (row tile 1, k tile 2): 256 rows × 32 bytes in one run, their 4 scales a row in one run
    run = tw.reshape(-1)[(1 * 3 + 2) * 8192:][:8192].reshape(256, 32).clone()
    assert not torch.equal(run, w[256:512, 64:96])  # (its words' bits in the decode order)
    nvfp4_layout._move_bits_(run, nvfp4_layout._OLD_BIT)
    assert torch.equal(run, w[256:512, 64:96])
    srun = _bytes(ts).reshape(-1)[(1 * 3 + 2) * 1024:][:1024].reshape(256, 4)
    assert torch.equal(srun, _bytes(s)[256:512, 8:12])
    back = nvfp4_layout.to_packed(tw, ts)
    assert torch.equal(back[0], w) and torch.equal(_bytes(back[1]), _bytes(s))


def _shift(words, r):
    return (words << r) & 0xFFFFFFFF if r >= 0 else words >> -r


def test_tile_major_words_decode_by_shifts_to_the_packed_codes():
    """The kernels' decode of a tile-major word (ptx.e2m1x8_to_bf16x2x4: pair j = (word << s_j) &
    SIGN_MASK | (word << m_j) & MAGNITUDE_MASK, a negative shift to the right) places each code's
    bits where the packed order's decode does (ptx.e2m1x2_to_bf16x2: sign at bit 15, e1 e0 m at
    8..6 of its half), for every code in every position; and a tile that spans K whole is still a
    copy (the input untouched)."""
    w, s = _codes(256, 64, seed=3)
    w[:16] = torch.arange(256, dtype=torch.uint8).reshape(16, 16).repeat(1, 2)  # every byte at every place
    before = w.clone()
    tw, _ = nvfp4_layout.to_tile_major(w, s)
    assert torch.equal(w, before) and tw.data_ptr() != w.data_ptr()
    packed = w.view(torch.int32).to(torch.int64).reshape(-1) & 0xFFFFFFFF  # (one k tile: the same word order)
    words = tw.view(torch.int32).to(torch.int64).reshape(-1) & 0xFFFFFFFF
    for j, (sr, mr) in enumerate(nvfp4_layout.PAIR_SHIFTS):
        lo, hi = (packed >> 8 * j) & 0xF, (packed >> 8 * j + 4) & 0xF
        want = (lo & 7) << 6 | (lo & 8) << 12 | (hi & 7) << 22 | (hi & 8) << 28
        got = _shift(words, sr) & nvfp4_layout.SIGN_MASK | _shift(words, mr) & nvfp4_layout.MAGNITUDE_MASK
        assert torch.equal(got, want), j


@pytest.mark.parametrize("n,k", [(384, 128), (256, 96)])
def test_reorder_refuses_partial_tiles(n, k):
    with pytest.raises(ValueError, match="multiple of 256 and K of 64"):
        nvfp4_layout.to_tile_major(*_codes(n, k))


def test_rs_k_order_trades_group_and_pair_and_keeps_the_dot_product():
    """The activations' k order of the register-sourced decode (TileConfig.rs_decode): position
    16j + 8c + 2q + e of a k tile holds column 16q + 8c + 2j + e, it is its own inverse (bf16 by the
    4-byte path, fp32 by the general one), a weight with its columns in that order gives the same
    products, and K off the 64-column tiles is refused by name."""
    x = torch.arange(2 * 128, dtype=torch.float32).view(2, 128)
    got = nvfp4_layout.rs_k_order(x)
    for p in range(64):
        j, c, q, e = p // 16, p // 8 % 2, p // 2 % 4, p % 2
        assert got[1, 64 + p] == x[1, 64 + 16 * q + 8 * c + 2 * j + e]
    xb = torch.randn(3, 192).bfloat16()
    assert torch.equal(nvfp4_layout.rs_k_order(nvfp4_layout.rs_k_order(xb)), xb)
    assert torch.equal(nvfp4_layout.rs_k_order(xb).float(), nvfp4_layout.rs_k_order(xb.float()))
    a, w = torch.randn(2, 128, dtype=torch.float64), torch.randn(5, 128, dtype=torch.float64)
    torch.testing.assert_close(nvfp4_layout.rs_k_order(a) @ nvfp4_layout.rs_k_order(w).T, a @ w.T)
    with pytest.raises(ValueError, match="^x: .*multiple of 64"):
        nvfp4_layout.rs_k_order(torch.zeros(2, 96))


def test_ops_h_order_reorders_h_and_reads_it_back(monkeypatch):
    """ops.gate_up(h_order="rs") returns h in rs_k_order (fp8 h: its scales unchanged, the groups of
    128 stay whole), ops.down(h_order="rs") reads it so, on every backend (here the reference);
    "auto" is "rs" exactly where dispatch.nvfp4_down_reads_rs says so for an nvfp4 weight (asked by
    both ops with the same M, H and I), and the module's forward (pipeline.mlp passes "auto") gives
    the same y either way; bad values are refused by name."""
    x = torch.randn(5, 256).bfloat16()
    w = torch.randn(2 * 384, 256).bfloat16()
    h = ops.gate_up(x, w, interleave=128)[0]
    h_rs = ops.gate_up(x, w, interleave=128, h_order="rs")[0]
    assert torch.equal(h_rs, nvfp4_layout.rs_k_order(h))
    assert torch.equal(ops.gate_up(x, w, interleave=128, h_order="auto")[0], h)  # (bf16: "auto" is natural)
    wq, wqs = quant.quantize_fp8_block(w)
    xq, xs = ops.quant_x(x)
    hq, hs = ops.gate_up(xq, wq, wqs, xs, interleave=128, h_format="fp8_group128")
    hq_rs, hs_rs = ops.gate_up(xq, wq, wqs, xs, interleave=128, h_format="fp8_group128", h_order="rs")
    assert torch.equal(hq_rs.view(torch.uint8), nvfp4_layout.rs_k_order(hq.view(torch.uint8))) and torch.equal(hs_rs, hs)
    wd = torch.randn(256, 384).bfloat16()
    assert torch.equal(ops.down(h_rs, wd, h_order="rs"), ops.down(h, wd))
    with pytest.raises(ValueError, match="^h_order: 'rs' .*I = 96"):
        ops.down(torch.randn(5, 96).bfloat16(), torch.randn(256, 96).bfloat16(), h_order="rs")
    with pytest.raises(ValueError, match="^h_order: expected one of"):
        ops.gate_up(x, w, interleave=128, h_order=True)
    mlp = FusedSwiGLUMLP.from_linear(torch.randn(384, 256), torch.randn(384, 256), torch.randn(256, 384),
                                     weight_format="nvfp4")
    xm = torch.randn(3, 256)
    want = mlp(xm)
    asked = []
    monkeypatch.setattr(dispatch, "nvfp4_down_reads_rs", lambda *a: asked.append(a[:3]) or True)
    g = mlp.gate_up_interleaved.op_tensors()
    args = (xm.bfloat16(), g["weight_packed"], g["weight_scale"], None, g["weight_global_scale"])
    h_auto = ops.gate_up(*args, interleave=128, h_order="auto")[0]
    h_nat = ops.gate_up(*args, interleave=128)[0]
    assert torch.equal(h_auto, nvfp4_layout.rs_k_order(h_nat))
    assert torch.equal(mlp(xm), want) and asked and set(asked) == {(3, 256, 384)}


def test_ops_read_a_tile_major_weight_as_the_packed_one():
    w, s = _codes(512, 192)
    tw, ts = nvfp4_layout.to_tile_major(w, s)
    x = torch.randn(5, 192).to(torch.bfloat16)
    gs = torch.tensor([0.5, 2.0])
    want = reference.gate_up(x, w, s, None, gs)[0]
    assert torch.equal(ops.gate_up(x, tw, ts, None, gs, tile_major=True)[0], want)
    assert torch.equal(reference.gate_up(x, tw, ts, None, gs, tile_major=True)[0], want)
    h = torch.randn(3, 192).to(torch.bfloat16)
    want = reference.down(h, w, s, None, gs[:1])
    assert torch.equal(ops.down(h, tw, ts, None, gs[:1], tile_major=True), want)
    assert not torch.equal(ops.down(h, tw, ts, None, gs[:1]), want)  # (read as packed: another weight)


def test_tile_major_bad_input_names_the_argument():
    w, s = _codes(512, 192)
    x = torch.randn(2, 192).to(torch.bfloat16)
    gs = torch.tensor([1.0])
    with pytest.raises(TypeError, match="tile_major: expected a bool"):
        ops.down(x, w, s, None, gs, tile_major="yes")
    with pytest.raises(ValueError, match="tile_major: only an nvfp4 weight with N a multiple of 256"):
        ops.down(x, w[:384], s[:384], None, gs, tile_major=True)
    bf16 = torch.randn(512, 192).to(torch.bfloat16)
    with pytest.raises(ValueError, match="tile_major: .*got a torch.bfloat16 weight"):
        ops.down(x, bf16, tile_major=True)


def _mlp(hidden=256, inter=384, interleave=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = [torch.randn(*s, generator=g) / s[1] ** 0.5 for s in ((inter, hidden), (inter, hidden), (hidden, inter))]
    return FusedSwiGLUMLP.from_linear(*w, weight_format="nvfp4", interleave=interleave)


def test_module_computes_the_same_in_either_order(cpu_tile_major):
    mlp = _mlp()
    assert mlp.gate_up_interleaved.tile_major and mlp.down_proj.tile_major
    state = mlp.state_dict()
    x = torch.randn(7, 256).to(torch.bfloat16)
    got = mlp(x)
    mlp.gate_up_interleaved._set_tile_major(False)
    mlp.down_proj._set_tile_major(False)
    assert torch.equal(mlp(x), got)
    assert _same(mlp.state_dict(), state)  # state_dict: the packed order either way


def test_module_state_dict_tensors_and_moves(cpu_tile_major, monkeypatch):
    gate_up = _mlp().gate_up_interleaved.tensors()  # packed-order tensors (copies)
    given = {k: v.clone() for k, v in gate_up.items()}
    mlp = _mlp()
    sd = mlp.state_dict()
    assert _same({k[len("gate_up_interleaved."):]: v for k, v in sd.items() if k.startswith("gate_up")}, given)
    assert _same(mlp.gate_up_interleaved.tensors(), given)
    held = mlp.gate_up_interleaved.kernel_tensors()
    assert not torch.equal(held["weight_packed"], given["weight_packed"])  # tile-major as held
    # a module built from the caller's tensors reorders copies, never the caller's
    proj = FusedSwiGLUMLP(given, mlp.down_proj.tensors(), weight_format="nvfp4")
    assert proj.gate_up_interleaved.tile_major and _same(given, {k: v for k, v in gate_up.items()})
    # where the kernels would not read the order (another device), a move gives the packed order back
    monkeypatch.setattr(dispatch, "nvfp4_tile_major", lambda w: False)
    mlp.to("cpu")
    assert not mlp.gate_up_interleaved.tile_major
    assert _same(mlp.gate_up_interleaved.kernel_tensors(), given)


@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict_into_a_tile_major_module(cpu_tile_major, assign):
    src = _mlp(seed=3)
    dst = _mlp(seed=4)
    sd = src.state_dict()
    keep = {k: v.clone() for k, v in sd.items()}
    dst.load_state_dict(sd, assign=assign)
    assert dst.gate_up_interleaved.tile_major and dst.down_proj.tile_major
    x = torch.randn(4, 256).to(torch.bfloat16)
    assert torch.equal(dst(x), src(x))
    assert _same(dst.state_dict(), keep) and _same(sd, keep)  # the given state dict is not reordered


def test_other_interleave_and_partial_tiles_keep_the_packed_order(cpu_tile_major):
    mlp = _mlp(interleave=64)  # the kernels read g = 128 only: its gate_up stays packed
    assert not mlp.gate_up_interleaved.tile_major and mlp.down_proj.tile_major
    mlp = _mlp(hidden=192, inter=384)  # down has 192 rows: no whole tile
    assert mlp.gate_up_interleaved.tile_major and not mlp.down_proj.tile_major
    x = torch.randn(3, 192).to(torch.bfloat16)
    expected = reference.mlp(x, mlp.gate_up_interleaved.tensors(), mlp.down_proj.tensors(), weight_format="nvfp4",
                             global_scale_kind=mlp.global_scale_kind)
    assert torch.equal(mlp(x), expected)


def test_packed_linear_keeps_the_order(cpu_tile_major):
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(512, 256, generator=g) * 0.05, torch.randn(512, generator=g).to(torch.bfloat16)
    lin = PackedLinear.from_weight(w, b, weight_format="nvfp4")
    assert lin.tile_major and torch.equal(lin.bias, b)
    x = torch.randn(3, 256).to(torch.bfloat16)
    t = lin.tensors()
    expected = reference.down(x, t["weight_packed"], t["weight_scale"], None,
                              1.0 / t["weight_global_scale"].float()) + b
    assert torch.equal(lin(x), expected.to(torch.bfloat16))
    assert set(lin.state_dict()) == {"weight_packed", "weight_scale", "weight_global_scale", "bias"}


def test_from_pretrained_settles_the_order_and_save_pretrained_writes_the_packed_one(tmp_path, cpu_tile_major):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    make_causal_lm(tmp_path / "src", "llama", hidden=256, inter=384)
    convert(tmp_path / "src", tmp_path / "packed", weight_format="nvfp4", progress=False)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "packed")
    mlp = model.model.layers[0].mlp
    assert mlp.gate_up_interleaved.tile_major and mlp.down_proj.tile_major
    model.save_pretrained(tmp_path / "again")
    assert swiglu_fused.verify(tmp_path / "again").ok
    stored, again = load_file(tmp_path / "packed" / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    mine = {k: v for k, v in stored.items() if ".mlp." in k}
    assert _same(mine, {k: again[k] for k in mine})
    tokens = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(tokens).logits
    # the same checkpoint, kept in the packed order
    for m in model.modules():
        if hasattr(m, "_set_tile_major"):
            m._set_tile_major(False)
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, got)
