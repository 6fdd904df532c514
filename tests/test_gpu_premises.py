"""What the GPU tests take for granted about the dispatch (tests/gpu/premises.py: which tile and plan
each one's (M, H, I) gets), every case, checked on the CPU for the 132 SMs of the GPUs the rules were
measured on: a rule change that moves a GPU test off what it is about fails here."""

import pytest

pytest.importorskip("cutlass")

from gpu import premises  # noqa: E402  (tests/ is on the path: tests/gpu is a package)

CASES = [(fn, case if isinstance(case, tuple) else (case,)) for fn in premises.PREMISES for case in fn.cases]


def test_every_premise_has_cases():
    assert len(premises.PREMISES) >= 12 and all(fn.cases for fn in premises.PREMISES)


@pytest.mark.parametrize("fn,case", CASES, ids=[f"{fn.__name__}{list(case)}" for fn, case in CASES])
def test_premise_holds_on_132_sms(fn, case):
    fn(*case)
