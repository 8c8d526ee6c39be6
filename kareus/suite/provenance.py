"""What made a result: content hashes of the code behind a cell, who made it, and why a stored cell
no longer matches.

A cell's key (:func:`kareus.suite.sweep.cell_key`) holds, beside the suite's version, the preset
and the settings, the content hash of the optimizer's module and of the backend's module (for the
simulator, ``kareus.backends.sim``), each with every module of the project it imports, directly or
not, at the top of a file or inside a function. "The project" is the packages ``kareus``,
``baselines`` and ``workloads`` plus the optimizer's own top-level package, so a third-party
plugin's code counts as much as a built-in's; the standard library and other installed packages
do not. Editing any of those files changes the hash, and the cell is recomputed; editing a module
the cell never imports (the command line, the report) does not.

The hashes are of file contents (SHA-256, first 16 hex digits), so they are the same in every
clone of the same code, whatever the files' times.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

#: Top-level packages whose modules count as the project's code.
PROJECT_PACKAGES = ("kareus", "baselines", "workloads")

#: The modules that implement each backend (their imports are followed): the GPU backend's
#: worker is started by name, so nothing imports it.
BACKEND_MODULES = {"sim": ("kareus.backends.sim",),
                   "gpu": ("kareus.backends.gpu", "kareus.backends.gpu.worker")}

#: The code every cell runs through besides the optimizer and the backend: the graph builder,
#: the knob space, and the harness that evaluates and Pareto-filters the plans.
HARNESS_MODULES = ("kareus.suite.harness", "workloads.graph_builder", "kareus.hardware.knobs")

#: Harness code hashed by its own file alone: how a cell's problem is made (the GPU's overrides,
#: the knob space). Its imports are the backends' (every one, so following them would tie a
#: simulator cell to the GPU backend's code) and the harness's, hashed above.
HARNESS_FILES = ("kareus.suite.problem",)

#: Hex digits kept of a SHA-256 digest.
DIGEST_LEN = 16

#: The repository (for the git commit recorded beside a cell).
REPO = Path(__file__).resolve().parents[2]


def digest(data: bytes) -> str:
    """The first :data:`DIGEST_LEN` hex digits of ``data``'s SHA-256."""
    return hashlib.sha256(data).hexdigest()[:DIGEST_LEN]


def json_digest(obj: object) -> str:
    """:func:`digest` of ``obj`` as canonical JSON (sorted keys)."""
    return digest(json.dumps(obj, sort_keys=True, default=str).encode())


@dataclass
class CodeHasher:
    """Content hashes of modules together with the project modules they import. One instance per
    run; it caches file lookups and parsed imports."""

    _paths: dict[str, Path | None] = field(default_factory=dict)
    _roots: dict[str, list[Path] | Path | None] = field(default_factory=dict)
    _imports: dict[tuple[Path, bool], list[str]] = field(default_factory=dict)

    def module_digest(self, *modules: str, roots: tuple[str, ...] = PROJECT_PACKAGES,
                      alone: tuple[str, ...] = ()) -> str:
        """Hash of ``modules`` and their import closure within ``roots`` (top-level package
        names; each module's own top-level package always counts), and of the modules
        ``alone`` without their imports. Raises :class:`ModuleNotFoundError` when a module
        cannot be found."""
        files: dict[str, Path] = {}
        for module in modules:
            files.update(self.closure(module, roots))
        for module in alone:
            path = self._path(module)
            if path is None:
                raise ModuleNotFoundError(f"no source file for module {module!r}")
            files[module] = path
        h = hashlib.sha256()
        for name in sorted(files):
            h.update(name.encode() + b"\0" + files[name].read_bytes() + b"\0")
        return h.hexdigest()[:DIGEST_LEN]

    def closure(self, module: str, roots: tuple[str, ...] = PROJECT_PACKAGES) -> dict[str, Path]:
        """``module name -> source file`` of ``module``, its parent packages and every module of
        ``roots`` they import, transitively. A module that is imported is followed into every
        import it holds, function bodies included (a lazy import is still a dependency); a
        package reached only as the parent of an imported module is followed into the imports
        its own import runs (those outside function bodies)."""
        roots = tuple(dict.fromkeys((*roots, module.split(".")[0])))
        if self._path(module) is None:
            raise ModuleNotFoundError(f"no source file for module {module!r}")
        found: dict[str, Path] = {}
        followed: set[tuple[str, bool]] = set()
        todo = [(module, True)]
        while todo:
            name, whole = todo.pop()
            if (name, whole) in followed or (name, True) in followed \
                    or name.split(".")[0] not in roots:
                continue
            path = self._path(name)
            if path is None:
                continue  # an attribute imported with ``from``, or a compiled module
            followed.add((name, whole))
            found[name] = path
            parts = name.split(".")
            todo += [(".".join(parts[:i]), False) for i in range(1, len(parts))]  # parents
            todo += [(n, True) for n in self._imported(name, path, whole)]
        return found

    def _path(self, module: str) -> Path | None:
        """The source file of ``module`` (a ``.py`` file or a package's ``__init__.py``), found
        from its top-level package's location without importing anything."""
        if module in self._paths:
            return self._paths[module]
        top, *rest = module.split(".")
        if top not in self._roots:
            try:
                spec = find_spec(top)
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                self._roots[top] = None
            elif spec.submodule_search_locations:
                self._roots[top] = [Path(p) for p in spec.submodule_search_locations]
            else:
                self._roots[top] = Path(spec.origin) if spec.origin else None
        where = self._roots[top]
        path: Path | None = None
        if isinstance(where, Path):
            path = where if not rest and where.suffix == ".py" else None
        elif where is not None:
            for base in where:
                for cand in (base.joinpath(*rest).with_suffix(".py") if rest else None,
                             base.joinpath(*rest, "__init__.py")):
                    if cand is not None and cand.is_file():
                        path = cand
                        break
                if path is not None:
                    break
        self._paths[module] = path
        return path

    def _imported(self, module: str, path: Path, whole: bool = True) -> list[str]:
        """Every module name an ``import`` of ``path`` may load (``from a import b`` gives ``a``
        and ``a.b``; ``import a.b`` gives ``a`` and ``a.b``), relative imports resolved; with
        ``whole`` false, only the imports outside function bodies (what importing it runs)."""
        if (path, whole) in self._imports:
            return self._imports[(path, whole)]
        names: list[str] = []
        is_package = path.name == "__init__.py"
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):  # hashed as it is; importing it fails its cell alone
            tree = ast.Module(body=[], type_ignores=[])
        todo: list[ast.AST] = [tree]
        while todo:
            node = todo.pop()
            if not whole and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                               ast.Lambda)):
                continue
            todo.extend(ast.iter_child_nodes(node))
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = import_from_base(module, node, is_package)
                names.append(base)
                names += [f"{base}.{a.name}" for a in node.names if a.name != "*"]
        self._imports[(path, whole)] = names
        return names


def import_from_base(module: str, node: ast.ImportFrom, is_package: bool = False) -> str:
    """The absolute module ``from ... import`` in ``module`` imports from (``from .x import y``
    in ``a.b`` gives ``a.x``); ``is_package``: ``module`` is a package's ``__init__``."""
    base = node.module or ""
    if not node.level:
        return base
    pkg = module.split(".")
    pkg = pkg if is_package else pkg[:-1]
    pkg = pkg[:len(pkg) - (node.level - 1)]
    return ".".join(pkg + ([base] if base else []))


def optimizer_module(name: str) -> str:
    """The module an optimizer's entry point names (``baselines.perseus`` for ``perseus``).
    Raises :class:`~kareus.errors.InputError` for an unregistered name."""
    from kareus.errors import InputError
    from kareus.plugins import optimizer_names, registered_optimizers

    eps = registered_optimizers()
    if name not in eps:
        raise InputError(f"unknown optimizer {name!r}; registered: {', '.join(optimizer_names())}")
    return eps[name].module


def code_fields(hasher: CodeHasher, optimizer: str, backend: str) -> dict[str, str]:
    """The ``code`` part of a cell's key: hashes of the optimizer's, the backend's and the
    harness's code (:data:`HARNESS_MODULES`, :data:`HARNESS_FILES`)."""
    return {"optimizer": hasher.module_digest(optimizer_module(optimizer)),
            "backend": hasher.module_digest(*BACKEND_MODULES.get(backend, ("kareus.backends",))),
            "harness": hasher.module_digest(*HARNESS_MODULES, alone=HARNESS_FILES)}


def git_commit(repo: Path = REPO) -> str | None:
    """The repository's HEAD commit, or ``None`` outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def made_by() -> dict[str, object]:
    """Who makes a cell now: the suite's name and version and the git commit (``None`` outside a
    checkout). Recorded beside the key, for people; the key alone decides reuse."""
    from kareus import __version__

    return {"suite": f"kareus-suite {__version__}", "git_commit": git_commit()}


#: Key fields and what a change in each means, in the order reasons are listed.
_CHANGES = (("workload", "workload changed"),
            ("gpu", "GPU changed"),
            ("backend", "backend changed"),
            ("suite_version", "suite version changed"),
            ("code.optimizer", "optimizer code changed"),
            ("code.backend", "{backend} code changed"),
            ("code.harness", "harness code changed"),
            ("preset", "GPU preset changed"),
            ("model", "model config changed"))


def stale_reasons(old: dict | None, new: dict) -> list[str]:
    """Why a stored key ``old`` does not match ``new`` (empty when they are equal)."""
    if old == new:
        return []
    if not isinstance(old, dict):
        return ["unreadable cell"]
    if "code" not in old:
        return ["made before cells recorded their code"]
    backend = "simulator" if new.get("backend") == "sim" else "backend"
    reasons = []
    for path, text in _CHANGES:
        head, _, sub = path.partition(".")
        a, b = old.get(head), new.get(head)
        if sub:
            a, b = (a or {}).get(sub), (b or {}).get(sub)
        if a != b and not (head == "preset" and old.get("gpu") != new.get("gpu")):
            reasons.append(text.format(backend=backend))
    covered = {p.partition(".")[0] for p, _ in _CHANGES}
    if any(old.get(k) != new.get(k) for k in set(old) | set(new) if k not in covered):
        reasons.append("settings changed")
    return reasons
