"""CuTe DSL kernels for Hopper (sm_90a): quant_x.py; gate_up.py and down.py, two configurations of
the one GEMM in gemm.py (its pieces: mainloop.py, stream_k.py, epilogue_stores.py, the swap-AB
tiles in swap_ab.py, kernel_host.py to compile; with tile_config.py, schedule.py, activations_and_h.py,
ptx.py, compile_cache.py). Import only where nvidia-cutlass-dsl is installed; kernels/ops.py
imports these lazily and falls back to kernels/reference.py elsewhere."""
