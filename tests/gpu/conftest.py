"""GPU tests: run only on an sm_90 device with CuTe DSL importable (skip cleanly elsewhere)."""

import os
import sys

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    reason = None
    if not torch.cuda.is_available():
        reason = "needs a CUDA GPU"
    elif torch.cuda.get_device_capability() != (9, 0):
        reason = f"needs an sm_90 GPU, found sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    else:
        try:
            import cutlass.cute  # noqa: F401
        except Exception as e:  # pragma: no cover - depends on the machine
            reason = f"needs nvidia-cutlass-dsl (import cutlass failed: {e})"
    if reason:
        here = str(config.rootpath / "tests" / "gpu")
        for item in items:
            if str(item.fspath).startswith(here):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def stream_k_counters_left_at_zero():
    """Every launch leaves the stream-K tile counters it used at zero, which is what lets a buffer
    serve every launch of a stream, and a CUDA graph's every replay, without a memset
    (kernels/sm90/schedule.stream_k_counters): checked after every GPU test over every buffer made,
    so that the first test after which one is not zero fails; zeroed again for the next."""
    yield
    schedule = sys.modules.get("swiglu_fused.kernels.sm90.schedule")
    if schedule is None or not schedule._ALL_SLABS:
        return
    torch.cuda.synchronize()
    words = schedule.COUNTER_WORDS
    dirty = {(i, int(j) // words): int(j) % words for i, slab in enumerate(schedule._ALL_SLABS)
             for j in slab.nonzero().flatten()[:8].tolist()}
    for slab in schedule._ALL_SLABS:
        slab.zero_()
    assert not dirty, f"stream-K counters left non-zero ((slab, buffer): word): {dirty}"


@pytest.fixture(autouse=True)
def cached_gpu_memory_given_back_under_xdist():
    """With pytest-xdist (``-n 14``) the workers share the one GPU, and each worker's caching
    allocator keeps what its tests freed: 9-18 GiB a worker filled the H200's 140 GiB and four random
    tests a run failed with CUDA out of memory (2026-12-03). Under xdist each test gives its cache back."""
    yield
    if os.environ.get("PYTEST_XDIST_WORKER") and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
