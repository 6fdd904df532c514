"""``swiglu-fused bench`` on the CPU: its help says what is compared and how it is timed, it refuses
bad arguments and a machine without an sm_90 GPU with one line and exit status 2, and the table /
JSON / PNG writer turns synthetic timings into what the README quotes."""

import json
import math

import pytest
import torch

from swiglu_fused import bench, formats, quant
from swiglu_fused.cli import main

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")


def one_line_error(capsys, argv) -> str:
    """Runs the command, asserts exit status 2 and one line on stderr without a traceback; returns it."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("swiglu-fused bench: error: ")
    return last


def test_help_explains_peers_and_timing(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for words in ("hf_bf16", "LlamaMLP", "fp8_unfused", "torch._scaled_mm", "ours_FORMAT", "CUDA graph",
                  "CUDA events", "median", "--no-cuda-graphs", "L2", "--allow-reference", "--out DIR",
                  "bench.json", "bench.png", "sm_90"):
        assert words in out, words


def test_top_level_help_lists_bench(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "bench" in capsys.readouterr().out


@no_gpu
def test_without_a_gpu_exits_2_with_one_line(capsys):
    line = one_line_error(capsys, ["bench"])
    assert "no CUDA GPU" in line and "sm_90" in line


@no_gpu
def test_run_without_a_gpu_raises_bench_error():
    with pytest.raises(bench.BenchError, match="no CUDA GPU"):
        bench.run(shapes=[(256, 512)], m=[16], weight_formats=["nvfp4"], allow_reference=True, print_fn=None)


@pytest.mark.parametrize("argv, words", [
    (["--shapes", "4096"], "expected HxI"),
    (["--shapes", "4096x14000"], "multiples of 128"),
    (["--shapes", "0x128"], "multiples of 128"),
    (["--shapes", ","], "no shape"),
    (["--m", "16,-1"], "positive number of tokens"),
    (["--m", "a"], "positive number of tokens"),
    (["--format", "fp4"], "invalid choice"),
])
def test_bad_arguments_name_the_argument(capsys, argv, words):
    line = one_line_error(capsys, ["bench", *argv])
    assert argv[0] in line and words in line


def test_reference_format_needs_the_flag(capsys, monkeypatch):
    # every format has sm90 kernels now: pretend nvfp4 had none (a format added before its kernels)
    monkeypatch.setattr(formats.WEIGHT_FORMATS["nvfp4"], "sm90_kernels", False)
    line = one_line_error(capsys, ["bench", "--format", "nvfp4"])
    assert "nvfp4" in line and "--allow-reference" in line and "reference" in line


@pytest.mark.parametrize("kw, words", [
    (dict(rounds=0), "rounds = 0"),
    (dict(iters=-3), "iters = -3"),
    (dict(weight_formats=[]), "no weight format"),
    (dict(weight_formats=["int8"]), "format 'int8'"),
    (dict(shapes=[(4096, 100)]), "multiples of 128"),
    (dict(m=[0]), "positive number of tokens"),
])
def test_run_checks_its_arguments_before_the_gpu(kw, words):
    with pytest.raises(bench.BenchError, match=words):
        bench.run(print_fn=None, **kw)


def test_parsers():
    assert bench.parse_shapes("4096x14336, 8192X3584") == ((4096, 14336), (8192, 3584))
    assert bench.parse_ms("1,16,,1024") == (1, 16, 1024)
    assert bench.check_formats(["fp8_block128", "bf16", "fp8_block128"]) == ("fp8_block128", "bf16")
    assert bench.check_formats(["nvfp4"], allow_reference=True) == ("nvfp4",)


def test_layer_count_moves_twice_the_l2():
    l2 = 50 * 2**20
    assert bench.layer_count(4096, 14336, l2) == 1  # LLaMA-3-8B: 176 MB of fp8 weights a layer
    assert bench.layer_count(8192, 3584, l2) == 2  # the 70B shard: 88 MB
    assert bench.layer_count(256, 512, l2) * 3 * 256 * 512 > 2 * l2


def test_act_quant_peer_is_silu_up_quantized_per_group():
    """The unfused peer's separate epilogue (pure torch) computes the same h as the format: SiLU of the
    gate half times the up half of each 256-column chunk of the packed GEMM output, in groups of 128."""
    torch.manual_seed(0)
    y = torch.randn(5, 2 * 384).to(torch.bfloat16)
    q, s = bench.act_quant(y)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (5, 384) and s.shape == (5, 3)
    assert s.stride() == (1, 5)  # M-major, as cuBLAS's down GEMM reads the scales
    chunks = y.float().view(5, 3, 2, 128)
    h = (torch.nn.functional.silu(chunks[:, :, 0]) * chunks[:, :, 1]).reshape(5, 384)
    hq, hs = quant.quantize_fp8_groups(h)
    torch.testing.assert_close(s, hs, rtol=1e-6, atol=0)
    deq = q.float() * s.repeat_interleave(128, 1)
    assert ((deq - h).norm() / h.norm()).item() < 0.04
    torch.testing.assert_close(bench.act_mul_bf16(y).float(), h.to(torch.bfloat16).float())


def synthetic_result(weight_formats=("bf16", "fp8_block128"), reference=()):
    """A result as ``run`` returns it, from made-up timings: 3 rounds, the unfused peer missing at M = 1."""
    rows = []
    for hidden, inter in ((4096, 14336), (8192, 3584)):
        for m in (1, 4096):
            per_round = {"hf_bf16": [130.0, 132.0, 140.0], "ours_bf16": [130.0, 131.0, 138.0],
                         "ours_fp8_block128": [70.0, 66.0, 80.0], "ours_nvfp4": [900.0, 910.0, 905.0]}
            per_round = {k: v for k, v in per_round.items() if k == "hf_bf16" or k[5:] in weight_formats}
            skipped = {}
            if m == 1:
                skipped["fp8_unfused"] = "RuntimeError: cuBLAS does not take this M"
            else:
                per_round["fp8_unfused"] = [84.0, 99.0, 96.0]
            rows.append(bench.summarize_row(hidden, inter, m, per_round, weight_formats, 1,
                                            {"ours_fp8_block128": 0.031}, skipped))
    return dict(benchmark="swiglu-fused bench", device="NVIDIA H100 80GB HBM3", torch="2.11.0", cuda="13.0",
                swiglu_fused="0.1.0", date="2026-11-24T10:00:00+00:00", notes=["act·quant of fp8_unfused at M = 4096: triton"],
                settings=dict(shapes=[[4096, 14336], [8192, 3584]], m=[1, 4096], weight_formats=list(weight_formats),
                              reference_formats=list(reference), rounds=3, iters=30, reps=10, cuda_graphs=True,
                              l2_bytes=50 * 2**20, interleave=128),
                rows=rows)


def test_summarize_row_takes_medians_and_per_round_ratios():
    row = synthetic_result()["rows"][1]  # 4096×14336, M = 4096
    assert row["hf_bf16_us"] == 132.0 and row["ours_fp8_block128_us"] == 70.0
    assert row["hf_bf16_over_ours_fp8_block128_per_round"] == pytest.approx([130 / 70, 2.0, 1.75])
    assert row["hf_bf16_over_ours_fp8_block128"] == pytest.approx(130 / 70)
    assert row["fp8_unfused_over_ours_fp8_block128_per_round"] == pytest.approx([1.2, 1.5, 1.2])
    assert "fp8_unfused_over_ours_bf16" not in row  # the fp8 peer is compared with ours in fp8 only
    first = synthetic_result()["rows"][0]
    assert "fp8_unfused_us" not in first and "fp8_unfused_over_ours_fp8_block128" not in first
    assert first["skipped"] == {"fp8_unfused": "RuntimeError: cuBLAS does not take this M"}


def test_table_has_every_pipeline_and_says_what_did_not_run():
    table = bench.format_table(synthetic_result())
    lines = table.splitlines()
    head = next(line for line in lines if line.startswith("| H×I"))
    for col in ("hf_bf16 µs", "fp8_unfused µs", "ours_bf16 µs", "ours_fp8_block128 µs",
                "hf_bf16 / ours_fp8_block128", "fp8_unfused / ours_fp8_block128", "hf_bf16 / ours_bf16"):
        assert col in head, col
    assert "NVIDIA H100 80GB HBM3" in lines[0] and "median of 3 round(s) of 30 CUDA-graph replays" in lines[0]
    body = [line for line in lines if line.startswith("| 4096×14336 | 4096 |")]
    assert body == ["| 4096×14336 | 4096 | 132.0 | 96.0 | 131.0 | 70.0 | 1.01 (1.00–1.01) | 1.86 (1.75–2.00) "
                    "| 1.20 (1.20–1.50) |"]
    m1 = next(line for line in lines if line.startswith("| 8192×3584 | 1 |"))
    assert m1.split(" | ")[3] == "–" and m1.endswith("| – |")
    assert "- fp8_unfused at 8192×3584 M = 1: RuntimeError: cuBLAS does not take this M" in lines
    assert "- act·quant of fp8_unfused at M = 4096: triton" in lines


def test_table_marks_a_reference_format():
    table = bench.format_table(synthetic_result(("fp8_block128", "nvfp4"), reference=("nvfp4",)))
    assert "ours_nvfp4 (reference) µs" in table
    assert "pure-torch reference" in table


def test_write_results_json_and_png_or_a_note(tmp_path):
    result = synthetic_result()
    out = tmp_path / "new" / "dir"
    said = bench.write_results(result, out)
    data = json.loads((out / "bench.json").read_text())
    assert said[0] == f"wrote {out / 'bench.json'}"
    assert data["settings"]["weight_formats"] == ["bf16", "fp8_block128"]
    assert data["rows"][1]["ours_fp8_block128_us_per_round"] == [70.0, 66.0, 80.0]
    assert data["rows"][1]["hf_bf16_over_ours_fp8_block128"] == 1.857  # 4 significant digits
    assert data["rows"][0]["ours_fp8_block128_rel_err"] == 0.031
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert said[1].startswith("PNG skipped: matplotlib is not installed")
        assert not (out / "bench.png").exists()
    else:
        assert said[1] == f"wrote {out / 'bench.png'}"
        assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.iterdir()) == sorted(["bench.json"] + (["bench.png"] if len(said) > 1 and
                                                                              said[1].startswith("wrote") else []))


def test_compact_keeps_nan():
    assert math.isnan(bench.compact({"a": [float("nan")]})["a"][0])
    assert bench.compact((1.23456, 7)) == [1.235, 7]


def test_a_deepgemm_peer_gets_its_column_and_speed_up():
    """Where DeepGEMM was importable, run() lists its unfused pipeline among the peers: the table has
    its µs and ours fp8's speed-up over it; results from before it existed read as they did."""
    result = synthetic_result()
    for row in result["rows"]:
        per_round = {k.removesuffix("_us_per_round"): v for k, v in row.items() if k.endswith("_us_per_round")}
        if row["m"] == 4096:
            per_round[bench.DEEPGEMM] = [77.0, 70.0, 88.0]
        row.clear()
        row.update(bench.summarize_row(4096, 14336, 4096, per_round, ("bf16", "fp8_block128"), 1))
    result["settings"]["peers"] = [bench.HF, bench.UNFUSED, bench.DEEPGEMM]
    assert result["rows"][1]["fp8_unfused_deepgemm_over_ours_fp8_block128"] == pytest.approx(1.1)
    table = bench.format_table(result)
    header = table.splitlines()[2]
    assert "fp8_unfused_deepgemm µs" in header and "fp8_unfused_deepgemm / ours_fp8_block128" in header
    assert bench.result_pipelines(synthetic_result()) == ["hf_bf16", "fp8_unfused", "ours_bf16", "ours_fp8_block128"]


def test_the_cublas_peer_refuses_a_k_it_would_get_wrong():
    """cuBLAS's block-scaled GEMM returns wrong values where K/128 is not a multiple of 4 (kernels/cublas.py:
    e.g. I = 11008): the unfused peer's GEMM raises there, before any GPU work, so that the run reports
    that pipeline as not run (bench._runs) instead of timing wrong numbers."""
    fp8 = torch.float8_e4m3fn
    a, b = torch.zeros(16, 11008, dtype=fp8), torch.zeros(4096, 11008, dtype=fp8)
    with pytest.raises(ValueError, match="wrong values at K = 11008, where K/128 is not a multiple of 4"):
        bench.cublas_block_gemm(a, torch.ones(16, 86), b, torch.ones(32, 86))
    assert bench._runs(lambda x: bench.cublas_block_gemm(x, None, b, None), a).startswith("ValueError: cuBLAS")
