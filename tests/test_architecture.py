"""The layers' dependency rules (docs/architecture.md), held by an AST walk over every import.

Every ``import`` and ``from ... import`` in ``kareus/``, ``baselines/``, ``workloads/`` and
``reproduce.py`` counts, including those inside functions and under ``TYPE_CHECKING``: a lazy
import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kareus.suite.provenance import import_from_base

ROOT = Path(__file__).resolve().parent.parent

#: The data model and its formulas: everything else stands on these.
DATA_MODEL = {"kareus", "kareus.graph", "kareus.plan", "kareus.energy", "kareus.frontier",
              "kareus.errors", "kareus.atomic", "kareus.inputs", "kareus.progress",
              "kareus.json_types"}
#: The faces: command lines over the suite. Nothing below them imports them.
FACES = {"kareus.cli", "kareus.__main__", "kareus.exit_status", "kareus.reproduction",
         "reproduce"}

#: The repository's top-level folders that sit outside the layers: they use the project, and
#: nothing in it may import them (layer ``"outside"``, which no layer may import).
OUTSIDE = {"benchmarks", "tests", "examples"}

#: Layer -> the layers it may import (always itself too).
ALLOWED: dict[str, set[str]] = {
    "data": set(),
    "hardware": {"data"},
    "workloads": {"data"},
    "backends": {"data", "hardware", "workloads"},
    "plugins": {"data", "hardware", "backends", "workloads"},
    "methods": {"data", "hardware", "backends", "workloads", "plugins"},
    "optimizer": {"data", "hardware", "backends", "workloads", "plugins", "methods"},
    "baselines": {"data", "hardware", "backends", "workloads", "plugins", "methods"},
    "suite": {"data", "hardware", "backends", "workloads", "plugins", "methods", "optimizer",
              "baselines"},
    # The CLI reaches optimizers only through the registry (plugins), never their modules.
    "face": {"data", "hardware", "backends", "workloads", "plugins", "methods", "suite", "face"},
}


def layer_of(module: str) -> str | None:
    """The layer of a module of the project, or None for a third-party / standard module."""
    if module in DATA_MODEL:
        return "data"
    if module in FACES or module.startswith("kareus.cli."):
        return "face"
    head = module.split(".")
    if head[0] in ("baselines", "workloads"):
        return head[0]
    if head[0] in OUTSIDE:
        return "outside"
    if head[0] != "kareus" or len(head) < 2:
        return None
    if head[1] in ("hardware", "backends", "plugins", "methods", "optimizer", "suite"):
        return head[1]
    raise AssertionError(f"{module} belongs to no layer; add it to one (docs/architecture.md)")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in ``source``; ``from a import b`` names ``a.b`` when
    ``b`` is a module of the project, else ``a``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = import_from_base(module, node, is_package)
            for a in node.names:
                sub = f"{base}.{a.name}"
                is_mod = (ROOT / Path(*sub.split("."))).with_suffix(".py").exists() or \
                    (ROOT / Path(*sub.split("."))).is_dir()
                found.append((node.lineno, sub if is_mod else base))
    return found


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """The rule broken by each import of ``module`` (empty when it keeps every rule)."""
    mine = layer_of(module)
    assert mine is not None, module
    bad = []
    for line, target in imported_modules(module, source, is_package):
        theirs = layer_of(target)
        if theirs is None or theirs == mine and mine != "face":
            continue
        into_cli = target == "kareus.cli" or target.startswith("kareus.cli.")
        if (into_cli or target == "reproduce") and module != "kareus.__main__" \
                and not (into_cli and module.startswith("kareus.cli")):
            bad.append(f"{module}:{line} imports the face {target}")
        elif theirs not in ALLOWED[mine] and not (mine == theirs == "face"):
            bad.append(f"{module}:{line} ({mine}) imports {target} ({theirs})")
    return bad


def project_modules() -> list[Path]:
    files = [ROOT / "reproduce.py"]
    for top in ("kareus", "baselines", "workloads"):
        files += sorted((ROOT / top).rglob("*.py"))
    return files


def test_every_module_keeps_the_dependency_rules():
    bad = []
    for path in project_modules():
        bad += violations(module_name(path), path.read_text(), path.name == "__init__.py")
    assert not bad, "imports against the layers (docs/architecture.md):\n" + "\n".join(bad)


@pytest.mark.parametrize(("module", "source"), [
    ("kareus.graph", "from kareus.hardware.presets import GPUPreset"),
    ("kareus.hardware.presets", "def f():\n    from kareus.backends.sim import SimulatorBackend"),
    ("kareus.backends.gpu.calibrate", "from kareus.plugins import Problem"),
    ("kareus.backends.gpu.check", "from kareus.suite.records import frontier_object"),
    ("workloads.parallel", "from kareus.backends.base import Backend"),
    ("kareus.plugins", "from kareus.methods import tradeoff"),
    ("kareus.methods.tradeoff", "import kareus.suite.harness"),
    ("baselines.perseus", "from kareus.optimizer.compose import merge_fronts"),
    ("kareus.optimizer.kareus", "from baselines.envpipe import envpipe_clocks"),
    ("kareus.suite.harness", "from kareus import cli"),
    ("kareus.cli", "from baselines.profiles import perseus_on_profile"),
    ("kareus.cli", "from kareus.optimizer import Kareus"),
    ("reproduce", "import baselines.perseus"),
    ("kareus.suite.docs_render", "from benchmarks.fidelity import main"),
    ("workloads.models", "import tests.conftest"),
    ("kareus.cli", "from examples.uniform_clock import UniformClock"),
    ("kareus.cli.frontiers", "from kareus.optimizer import Kareus"),
    ("kareus.suite.report", "from kareus.cli.common import render"),
    ("kareus.reproduction", "from kareus.cli.simulation import breakdown_text"),
])
def test_a_forbidden_import_is_caught(module, source):
    assert violations(module, source)


@pytest.mark.parametrize(("module", "source"), [
    ("kareus.hardware.knobs", "from kareus.plan import LIBRARY_DEFAULT"),
    ("kareus.backends.gpu.runner", "from workloads.torch_model import GPTStage"),
    ("baselines.perseus", "from kareus.methods.profiling import clock_tradeoff_plans"),
    ("kareus.suite.executors", "from kareus.optimizer import Kareus"),
    ("kareus.cli", "from kareus.plugins import load_optimizer"),
    ("kareus.__main__", "from kareus.cli import main"),
    ("kareus.cli.frontiers", "from kareus.cli.common import emit"),
    ("kareus.cli", "from kareus.cli import calibration, catalog"),
])
def test_an_allowed_import_passes(module, source):
    assert not violations(module, source)


def test_tables_have_one_home():
    """Printed tables come from kareus.suite.tables alone: nothing else builds a rich Table."""
    owners = [module_name(p) for p in project_modules()
              if any(m.startswith("rich.table") for _, m in imported_modules(
                  module_name(p), p.read_text(), p.name == "__init__.py"))]
    assert owners == ["kareus.suite.tables"]


def import_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (anywhere in it, lazily too). A
    package's own ``__init__`` importing its submodules (re-exports) is not counted, nor is a
    submodule importing its enclosing package: that is one module, not two."""
    modules = {module_name(p): p for p in project_modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, target in imported_modules(name, path.read_text(), path.name == "__init__.py"):
            while target and target not in modules:  # ``a.b.name`` -> ``a.b``
                target = target.rpartition(".")[0]
            if not target or target == name:
                continue
            if target.startswith(name + ".") or name.startswith(target + "."):
                continue
            targets.add(target)
        graph[name] = targets
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles():
    circles = import_circles(import_graph())
    assert not circles, "modules importing each other (directly or through others):\n" + \
        "\n".join(" <-> ".join(c) for c in circles)


def test_an_import_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_loading_the_simulator_optimizers_leaves_pandas_unloaded():
    """pandas (a third of a second to import) is for reading profiles and writing results; the
    optimizers that plan on the simulator name it only in type hints."""
    import subprocess
    import sys

    modules = "baselines.megatron, baselines.perseus, kareus.optimizer.kareus, kareus.backends.sim"
    code = f"import sys, {modules}; print(sorted(m for m in sys.modules if m == 'pandas'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    assert out.strip() == "[]"
