"""Run a registration as soon as a library imports one of its modules, without importing the
library ourselves: ``import swiglu_fused`` stays fast (transformers alone takes ≈ 3 s) and still
registers our quantization method with transformers and diffusers before their loaders run."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable


class _RunAfterImport(importlib.abc.MetaPathFinder):
    """A one-shot finder: when ``module`` is imported, let the real finders load it, then call
    ``then()``."""

    def __init__(self, module: str, then: Callable[[], None]):
        self.module, self.then = module, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # one shot; and lets the real finders answer below
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            sys.modules[fullname] = module  # then() imports it: make the import see it done
            self.then()
        spec.loader.exec_module = exec_then_register
        return spec


def run_when_imported(module: str, package: str, then: Callable[[], None]) -> None:
    """``then()`` now if ``module`` is loaded, else right after it is (if ``package`` is installed;
    once: a second call while the hook waits adds none)."""
    if module in sys.modules:
        then()
    elif importlib.util.find_spec(package) is not None and not any(
            isinstance(f, _RunAfterImport) and f.module == module for f in sys.meta_path):
        sys.meta_path.insert(0, _RunAfterImport(module, then))


# The libraries whose from_pretrained reads our quantization method from a registry module of
# theirs: library → (that module, our integration module whose register() adds us to it)
REGISTRIES = {
    "transformers": ("transformers.quantizers.auto", "swiglu_fused.integrations.transformers"),
    "diffusers": ("diffusers.quantizers.auto", "swiglu_fused.integrations.diffusers"),
}


def register_integrations() -> None:
    """Each integration registers itself as soon as its library loads its registry (now, if it
    has): what ``import swiglu_fused`` does, importing neither library nor torch itself."""
    for library, (registry, integration) in REGISTRIES.items():
        run_when_imported(registry, library, lambda integration=integration: importlib.import_module(integration).register())
