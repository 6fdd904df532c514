"""GPU tests (sm_90 + CuTe DSL); a package so that its conftest does not shadow tests/conftest.py."""
