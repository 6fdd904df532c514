"""The package's imports run one way (issue 20): no module imports itself back through others, and
the runtime (kernels, the layer, eager graphs, integrations) never imports the offline packer.

Imports are read with ``ast`` from the source, those inside functions included (a deferred import
is still a dependency), so this runs without a GPU or CuTe DSL.
"""

from __future__ import annotations

import ast
from pathlib import Path

import swiglu_fused

ROOT = Path(swiglu_fused.__file__).parent
PKG = "swiglu_fused"

# Runtime modules: what a model's forward runs. They may import formats, quant, interleave and
# each other, never weight_packing (the converter, its readers and writers) ...
RUNTIME = ("swiglu_fused.kernels", "swiglu_fused.layer", "swiglu_fused.eager_graphs", "swiglu_fused.integrations")
# ... except these, each for a stated reason:
ALLOWED = {
    # patch_model finds a model's gate/up/down through the family adapters (model-family facts,
    # no converter code); the transformers quantizer checks a packed directory's headers before
    # from_pretrained reads a byte (packed_checkpoint.check_files_match_config, safetensors_io.read_header).
    "swiglu_fused.integrations.transformers": {
        "swiglu_fused.weight_packing.adapters", "swiglu_fused.weight_packing.packed_checkpoint",
        "swiglu_fused.weight_packing.safetensors_io",
    },
    # the same header checks before diffusers' from_pretrained reads a byte
    "swiglu_fused.integrations.diffusers": {
        "swiglu_fused.weight_packing.packed_checkpoint", "swiglu_fused.weight_packing.safetensors_io",
    },
}
# the converter proper: nothing outside weight_packing, cli and the package's public API may reach it
OFFLINE = ("swiglu_fused.weight_packing.convert", "swiglu_fused.weight_packing.pack",
           "swiglu_fused.weight_packing.verify", "swiglu_fused.weight_packing.destination",
           "swiglu_fused.weight_packing.source")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports (``from . import x`` resolves to the module x when it
    is one, else to the package)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(PKG)}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(PKG):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in known else target)
    # a module imports its parent packages too, but those edges say nothing about layering
    return {m for m in out if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_is_read():
    graph = _graph()
    assert "swiglu_fused.formats" in graph["swiglu_fused.weight_packing.pack"]
    assert "swiglu_fused.kernels.sm90.activations_and_h" in graph["swiglu_fused.kernels.sm90.tile_config"]
    assert "swiglu_fused.kernels.dispatch" in graph["swiglu_fused.kernels.sm90.gate_up"]
    assert "swiglu_fused.kernels.sm90.tile_config" in graph["swiglu_fused.kernels.dispatch"]  # (deferred)
    assert "swiglu_fused.kernels.ops" in graph["swiglu_fused.layer"]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_cycle_detection_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_runtime_does_not_import_weight_packing():
    graph = _graph()
    bad = []
    for name, deps in graph.items():
        if not name.startswith(RUNTIME):
            continue
        for dep in deps:
            if dep.startswith("swiglu_fused.weight_packing") and not any(
                    dep == a or dep.startswith(a + ".") for a in ALLOWED.get(name, ())):
                bad.append(f"{name} imports {dep}")
    assert bad == []


def _reachable(graph, start):
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_runtime_never_reaches_the_converter():
    """Not even through the allowed imports: what they import does not reach convert or pack."""
    graph = _graph()
    for name in graph:
        if name.startswith(RUNTIME):
            reached = _reachable(graph, name) & set(OFFLINE)
            assert not reached, f"{name} reaches {sorted(reached)}"


def test_the_format_spec_sits_below_the_packer_and_the_runtime():
    """formats imports quant and format_names only (its torch-free names); those two nothing of the
    package; interleave formats only."""
    graph = _graph()
    assert graph["swiglu_fused.quant"] == graph["swiglu_fused.format_names"] == set()
    assert graph["swiglu_fused.formats"] == {"swiglu_fused.quant", "swiglu_fused.format_names"}
    assert graph["swiglu_fused.interleave"] == {"swiglu_fused.formats"}
