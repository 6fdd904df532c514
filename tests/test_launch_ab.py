"""benchmarks/launch_ab.py's variants, on the host: what a --set variant changes while it runs (and
so while its CUDA graphs are captured), and that the constants are back after it, even when it
raises; bad specs name the part that is wrong."""

import pytest

pytest.importorskip("cutlass")
from benchmarks import launch_ab  # noqa: E402
from swiglu_fused.kernels.sm90 import schedule  # noqa: E402


def _seen(x=None):
    return schedule.HBM_BYTES_PER_US, schedule.FIXUP_US, schedule.REUSE_COUNTERS


def test_a_set_variant_changes_the_constants_only_while_it_runs():
    before = _seen()
    wraps = launch_ab.variants({}, {"set1": launch_ab.parse_set("schedule.HBM_BYTES_PER_US=1.05e7; "
                                                                "schedule.FIXUP_US=(1.0, 0.5)"),
                                    "set2": launch_ab.parse_set("schedule.REUSE_COUNTERS=False")})
    assert wraps["set1"](_seen)(None) == (1.05e7, (1.0, 0.5), before[2]) and _seen() == before
    assert wraps["memset"](_seen)(None) == (*before[:2], False) and _seen() == before

    def fails(x):
        raise RuntimeError("launch failed")
    with pytest.raises(RuntimeError):
        wraps["set2"](fails)(None)
    assert _seen() == before


@pytest.mark.parametrize("spec,says", [("schedul.X=1", "MODULE one of"), ("schedule.NOPE=1", "NAME one of"),
                                       ("schedule.FIXUP_US=(1,", "not a Python literal"),
                                       ("dispatch.NVFP4_RS=False", "NAME one of")])  # (nvfp4's: dispatch_nvfp4)
def test_bad_set_specs_say_what_is_wrong(spec, says):
    with pytest.raises(SystemExit, match=says):
        launch_ab.parse_set(spec)


def test_nvfp4_constants_are_set_in_their_own_module():
    from swiglu_fused.kernels import dispatch_nvfp4

    (key, value), = launch_ab.parse_set("dispatch_nvfp4.NVFP4_RS=False").items()
    assert key == (dispatch_nvfp4, "NVFP4_RS") and value is False


def test_a_set_variant_settles_the_modules_layout_under_its_constants():
    """--set dispatch.FP8_TILE_MAJOR=False must reach the module's weight order, which is settled
    when the module is made or moved: the wrap settles it once under the changed constants."""
    import torch

    from swiglu_fused.kernels import dispatch

    class Held(torch.nn.Module):
        seen = None

        def settle_layout(self):
            self.seen = dispatch.FP8_TILE_MAJOR

        def forward(self, x):
            return dispatch.FP8_TILE_MAJOR

    held = Held()
    run = launch_ab.variants({}, {"set1": launch_ab.parse_set("dispatch.FP8_TILE_MAJOR=False")})["set1"](held)
    assert held.seen is False and dispatch.FP8_TILE_MAJOR is True and run(None) is False


def test_skip_names_only_the_standing_variants():
    """--skip leaves out no_pdl / memset (e.g. a bf16 sweep, where no launch has PDL); anything else is
    refused before a GPU is asked for."""
    with pytest.raises(SystemExit, match="only no_pdl and memset"):
        launch_ab.main(["--skip", "shipped"])


def test_no_pdl_also_drops_gate_ups_late_trigger():
    """no_pdl on a dispatched nvfp4 gate_up that triggers late (D58) is a valid config without PDL,
    not a ValueError (a late trigger means nothing without PDL)."""
    import dataclasses

    from swiglu_fused.kernels import dispatch_nvfp4

    late = dispatch_nvfp4.warp_mma_config("gate_up", 1, 16384, 2048, True)
    assert late.late_trigger
    plain = dataclasses.replace(late, **launch_ab.NO_PDL["warp_mma_gate_up"])
    assert not plain.pdl and not plain.late_trigger
    assert dataclasses.replace(dispatch_nvfp4.warp_mma_config("down", 1, 2048, 8192, True), **launch_ab.NO_PDL["warp_mma_down"])


def test_outputs_are_compared_at_m_itself_not_an_eager_graph_bucket():
    """The DIFFERS flag compares the variants with the module's eager graphs off (at M ≤ 64 a plain eager
    call would replay a graph of a power-of-two bucket of rows, 48 as 64), and leaves them as they were."""
    import torch
    from swiglu_fused import eager_graphs

    before = eager_graphs.ENABLED
    seen = []

    def variant(offset):
        def forward(x):
            seen.append(eager_graphs.ENABLED)
            return x + offset
        return forward
    layer = {"shipped": variant(0), "set1": variant(0), "set2": variant(1)}
    same = launch_ab.same_as_shipped(layer, ("shipped", "set1", "set2"), torch.ones(48, 8))
    assert same == {"set1": True, "set2": False} and seen == [False] * 3 and eager_graphs.ENABLED == before
