"""The import flow of docs/DESIGN.md, enforced: import-linter's contracts (pyproject.toml
[tool.importlinter]) hold, and an import inside a function defers a heavy package.

The rooms install from the repository root (`[tool.setuptools.package-dir]` maps
groklens.trainers to trainers/, ...), while import-linter reads a package from one directory;
the tests lay the installed layout out as links to the real files and lint that.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"

# Third-party packages whose import costs start-up time (tens of ms to seconds); an import inside
# a function must defer one of them, directly or through the internal module it imports.
HEAVY = {"torch", "numpy", "h5py", "matplotlib", "scipy", "sklearn", "transformer_lens", "devinterp", "ray",
         "submitit", "pandas", "tqdm", "yaml", "threadpoolctl"}
# groklens/_tl.py arranges TransformerLens' import (docs/DESIGN.md): a module importing it is heavy.
HEAVY_INTERNAL = {"groklens._tl"}
# Named exceptions: the CLI's commands import what they run (`--help` and `info` stay under their
# start-up bar; its imports are nobody's import time but the user's); groklens.experiments awaits
# its public API (issue 30, items 3 and 4), which moves its imports.
LAZY_EXEMPT = ("groklens.cli", "groklens.experiments")


def installed_modules() -> dict[str, Path]:
    """Module name -> file, as the package installs (pyproject's package-dir)."""
    dirs = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    rooms = {pkg.split(".")[1] for pkg in dirs if "." in pkg}
    out = {}
    for pkg, src in dirs.items():
        for path in sorted((REPO / src).rglob("*.py")):
            rel = path.relative_to(REPO / src).with_suffix("")
            if pkg == "groklens" and rel.parts[0] in rooms:
                continue
            out[".".join([pkg, *(p for p in rel.parts if p != "__init__")])] = path
    return out


def lay_out(dest: Path) -> Path:
    """The installed layout of groklens under dest, as links to the repository's files."""
    for name, path in installed_modules().items():
        parts = name.split(".")
        target = dest.joinpath(*parts, "__init__.py") if path.name == "__init__.py" else \
            dest.joinpath(*parts[:-1], parts[-1] + ".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(path)
    return dest


def lint(root: Path, tmp: Path) -> subprocess.CompletedProcess:
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(PYPROJECT)!r}, no_cache=True))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})


def test_the_import_contracts_hold(tmp_path):
    proc = lint(lay_out(tmp_path / "site"), tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout and "3 kept" in proc.stdout
    assert f"Analyzed {len(installed_modules())} files" in proc.stdout  # every room was read


def test_an_import_against_the_flow_breaks_them(tmp_path):
    """The check itself: a checkpoint module importing an analysis is reported, with its line."""
    site = lay_out(tmp_path / "site")
    (site / "groklens" / "checkpoints" / "upward.py").write_text(
        "def f():\n    from groklens.analyses.grokking import grokking_times\n")
    proc = lint(site, tmp_path)
    assert proc.returncode == 1
    assert "groklens.checkpoints.upward -> groklens.analyses.grokking (l.2)" in proc.stdout


def test_the_contracts_are_whole_rooms_without_exceptions():
    """No contract carries an exception list, and the layers name every room the package installs."""
    config = tomllib.loads(PYPROJECT.read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    assert not [c["name"] for c in contracts if c.get("ignore_imports")]
    layered = {room.strip() for c in contracts if c["type"] == "layers" for layer in c["layers"]
               for room in layer.replace("|", ":").split(":")}
    assert set(config["tool"]["setuptools"]["package-dir"]) - {"groklens"} <= layered


def test_the_old_module_names_are_the_moved_modules():
    """groklens.trainers.models, .losses and .sweep* (the names before the rooms of issue 44) import
    as the very modules of their new rooms, submodules and attributes included, in a fresh interpreter."""
    code = ("import importlib, json, sys\n"
            "from groklens.trainers.models.transformer import Transformer\n"
            "from groklens.trainers import sweeps, sweep_tasks\n"
            "import groklens.trainers as t\n"
            "pairs = [('groklens.trainers.models', 'groklens.models'),\n"
            "         ('groklens.trainers.models.transformer', 'groklens.models.transformer'),\n"
            "         ('groklens.trainers.losses', 'groklens.models.losses'),\n"
            "         ('groklens.trainers.sweeps', 'groklens.sweeps'),\n"
            "         ('groklens.trainers.sweep_executors', 'groklens.sweeps.executors'),\n"
            "         ('groklens.trainers.sweep_files', 'groklens.sweeps.files'),\n"
            "         ('groklens.trainers.sweep_grid', 'groklens.sweeps.grid'),\n"
            "         ('groklens.trainers.sweep_tasks', 'groklens.sweeps.tasks')]\n"
            "same = [importlib.import_module(o) is importlib.import_module(n) for o, n in pairs]\n"
            "spec = [importlib.import_module(o).__spec__.name == n for o, n in pairs]\n"
            "print(json.dumps({'same': same, 'spec': spec, 'names': [Transformer.__module__, sweeps.__name__,\n"
            "    sweep_tasks.__name__, t.sweep_grid.__name__], 'copies': sorted(m for m in sys.modules\n"
            "    if m.startswith('groklens.') and sys.modules[m].__name__ != m and m not in dict(pairs))}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got == {"same": [True] * 8, "spec": [True] * 8, "copies": [],
                   "names": ["groklens.models.transformer", "groklens.sweeps", "groklens.sweeps.tasks",
                             "groklens.sweeps.grid"]}


# ---------------------------------------------------------------------- imports inside functions
def _imports(name: str, path: Path, modules: dict[str, Path]):
    """(module-level imports, [(imported, line)] inside functions), TYPE_CHECKING blocks left out."""
    top: set[str] = set()
    inner: list[tuple[str, int]] = []

    def targets(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module
        if node.level:
            parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
        return subs or [base]

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for t in targets(child):
                    (inner.append((t, child.lineno)) if in_function else top.add(t))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text()), False)
    return top, inner


def test_imports_inside_functions_defer_a_heavy_package():
    """An internal import inside a function is there for start-up time, never to dodge a cycle
    (the contracts forbid cycles): the module it imports must load, at import time, a heavy
    package that the importing module does not."""
    modules = installed_modules()
    parsed = {name: _imports(name, path, modules) for name, path in modules.items()}

    def internal(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    def heavy(name: str) -> set[str]:
        seen, todo, found = set(), [name], set()
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            found |= {m} & HEAVY_INTERNAL
            parents = [".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1)]
            for t in [*parsed[m][0], *parents]:
                if t.split(".")[0] in HEAVY:
                    found.add(t.split(".")[0])
                elif internal(t):
                    todo.append(internal(t))
        return found

    unjustified = []
    for name, (_, inner) in parsed.items():
        if name.startswith(LAZY_EXEMPT):
            continue
        for target, line in inner:
            module = internal(target) if target.startswith("groklens") else None
            if module is not None and not heavy(module) - heavy(name):
                unjustified.append(f"{modules[name].relative_to(REPO)}:{line} imports {module}")
    assert not unjustified, "move to the top of the module:\n" + "\n".join(unjustified)


if __name__ == "__main__":  # `make lint`: the contracts on the installed layout (a bare lint-imports in
    import tempfile         # the checkout cannot see the package-dir mapping: "module does not exist")

    with tempfile.TemporaryDirectory() as tmp:
        proc = lint(lay_out(Path(tmp) / "site"), Path(tmp))
        print(proc.stdout + proc.stderr)
        sys.exit(proc.returncode)
