"""GPU tests: run only on an sm_90 device with CuTe DSL importable (skip cleanly elsewhere)."""

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
