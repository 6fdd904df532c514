import pytest, torch

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield
    from swiglu_fused.kernels.sm90 import schedule
    torch.cuda.synchronize()
    for key, buf in list(schedule._COUNTERS.items()):
        nz = buf.nonzero().flatten().tolist()
        if nz:
            print(f"\nCTRDIRTY after {item.nodeid}: key={key} idx={nz[:10]} vals={buf[nz[:10]].tolist()}", flush=True)
            buf.zero_()
