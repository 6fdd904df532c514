"""CuTe DSL kernels for Hopper (sm_90a): quant_x.py; gate_up.py and down.py, two configurations of
the one GEMM in gemm256.py (+ epilogue.py, ptx.py, compile_cache.py). Import only where
nvidia-cutlass-dsl is installed; kernels/ops.py imports these lazily and falls back to
kernels/reference.py elsewhere."""
