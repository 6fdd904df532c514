"""benchmarks/bench_marlin.py on the host: the fp32 reference it checks both MLPs against is the
nvfp4 MLP our module computes (on the CPU, its reference path), the rotation moves more than twice
the L2 in nvfp4 weights, a folder without the peer is refused with its name, and the table reads
its rows."""

import pytest
import torch

from benchmarks import bench_marlin
from swiglu_fused import bench


def test_the_reference_is_the_modules_nvfp4_mlp():
    mlp = bench.hf_mlp(256, 512, seed=0, device="cpu")
    ours = bench.fused(mlp, "nvfp4")
    x = torch.randn(5, 256).to(torch.bfloat16)
    ref = bench_marlin.reference_mlp(ours, x)
    assert bench_marlin.rel_frobenius(ours(x), ref) < 5e-3  # bf16 rounding of h and y
    assert bench_marlin.rel_frobenius(mlp(x), ref) > 5e-2  # (and not the unquantized MLP: the check can fail)
    h = bench_marlin.our_gate_up(ours, "natural")(x)
    assert bench_marlin.rel_frobenius(bench_marlin.our_down(ours, "natural")(h), ref) < 5e-3


def test_the_layers_move_more_than_twice_the_l2():
    l2 = 60 << 20
    for hidden, inter in ((4096, 14336), (1024, 8192), (8192, 3584)):
        n = bench_marlin.layer_count(hidden, inter, l2)
        assert n >= 2 and (n - 1) * bench_marlin.nvfp4_bytes(hidden, inter) >= 2 * l2


def test_a_folder_without_the_peer_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no marlin_peer.py"):
        bench_marlin.load_peer(str(tmp_path))
    (tmp_path / "marlin_peer.py").write_text("raise ImportError('libmarlin_fp4.so: not built')\n")
    with pytest.raises(SystemExit, match="not built"):
        bench_marlin.load_peer(str(tmp_path))


def test_the_table_has_a_row_per_point():
    names = ("hf_bf16", "ours_bf16", "ours_nvfp4", "marlin_nvfp4", "ours_gate_up", "marlin_gate_up", "ours_down",
             "marlin_down")
    rows = [dict(hidden=8192, inter=3584, m=m, floor_us=11.8, **{f"{n}_us": 10.0 + i for i, n in enumerate(names)})
            for m in (1, 16)]
    lines = bench_marlin.table(dict(rows=rows)).splitlines()
    assert len(lines) == 4 and lines[2].startswith("| 8192×3584 | 1 | 11.8 |")
    assert lines[2].endswith(f"| {13 / 12:.2f} | {15 / 14:.2f} | {17 / 16:.2f} |")
