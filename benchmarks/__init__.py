"""GPU benchmarks of swiglu-fused (benchmarks/README.md): run from the repository root as modules,
``python -m benchmarks.bench_mlp ...``; they share benchmarks/harness.py."""
