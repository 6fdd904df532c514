"""premises.py plans meta tensors as on a GPU (schedule.planned_sms); here, on the GPU, that gives the
configs the dispatch picks for the GPU's own tensors, so that the CPU's check of the GPU tests'
premises (tests/test_gpu_premises.py) checks what the GPU tests run."""

import pytest
import torch

from swiglu_fused.kernels import dispatch

from . import premises

pytest.importorskip("cutlass")

E4M3 = torch.float8_e4m3fn
WIDTHS = [(4096, 14336), (8192, 3584), (2048, 8192), (16384, 2560), (1024, 8192)]
M = [1, 17, 48, 64, 100, 137, 300, 600, 1024, 2080]


def _sms() -> int:
    from swiglu_fused.kernels.sm90 import schedule

    return schedule.sm_count(torch.device("cuda"))


def _empty(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


@pytest.mark.parametrize("hidden,inter", WIDTHS)
def test_meta_planning_is_the_dispatch_on_the_gpu(hidden, inter):
    """For each format and M, gate_up's config (and nvfp4's down's) from premises equals the dispatch's
    on CUDA tensors of those shapes (uninitialized: the config reads shapes and dtypes only)."""
    sms = _sms()
    for m in M:
        x, w = _empty(m, hidden), _empty(2 * inter, hidden)
        assert premises.gate_up_config("bf16", m, hidden, inter, sms=sms) == dispatch.gate_up_config(
            x, w, None, None, act="silu", h_format="bf16"), ("bf16", m)
        xq, wq = _empty(m, hidden, dtype=E4M3), _empty(2 * inter, hidden, dtype=E4M3)
        ws, xs = _empty(2 * inter // 128, hidden // 128, dtype=torch.float32), _empty(m, hidden // 128, dtype=torch.float32)
        for h_format in ("fp8_group128", "bf16"):
            assert premises.gate_up_config("fp8_block128", m, hidden, inter, h_format=h_format, sms=sms) == \
                dispatch.gate_up_config(xq, wq, ws, xs, act="silu", h_format=h_format), ("fp8", h_format, m)
        wp, wsp = _empty(2 * inter, hidden // 2, dtype=torch.uint8), _empty(2 * inter, hidden // 16, dtype=E4M3)
        assert premises.gate_up_config("nvfp4", m, hidden, inter, sms=sms) == dispatch.gate_up_config(
            x, wp, wsp, None, act="silu", h_format="bf16", tile_major=True), ("nvfp4", m)
        h, dw, dws = _empty(m, inter), _empty(hidden, inter // 2, dtype=torch.uint8), _empty(hidden, inter // 16, dtype=E4M3)
        assert premises.nvfp4_down_config(m, hidden, inter, sms=sms) == dispatch.down_config(
            h, dw, dws, None, _empty(m, hidden), torch.bfloat16, True), ("nvfp4 down", m)
