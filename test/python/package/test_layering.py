"""Imports go one way through the stages (README, Layout): every import in the package, function-local
ones included, reaches only its own stage or an earlier one, and the runtime never imports the compiler."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.fast  # no compiler, engine or worker process: `pytest -m fast`


#: The stages in import order; a module may import its own stage and the ones before it.
STAGES = ["__init__", "errors", "processes", "ir", "dialects", "frontends", "graph", "activations", "onnx", "backends",
          "plan", "measure", "search", "passes", "artifact", "shaped", "iree", "entry", "torch", "jax", "zoo", "bench", "tools"]


def imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every ``import``/``from`` in the file, wherever it stands."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def package_of(path: Path, top: Path) -> str:
    return ".".join(path.relative_to(top.parent).with_suffix("").parts[:-1])


def test_stages_import_only_earlier_stages():
    top = ROOT / "collage_mlir"
    wrong = []
    for path in sorted(top.rglob("*.py")):
        own = stage_of(".".join(path.relative_to(top.parent).with_suffix("").parts))
        for line, target in imports(path, package_of(path, top)):
            if target.split(".")[0] != "collage_mlir":
                continue
            other = stage_of(target)
            if other != own and STAGES.index(other) > STAGES.index(own):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {own} imports {target} (a later stage)")
    assert not wrong, "\n".join(wrong)


def test_runtime_does_not_import_the_compiler():
    top = ROOT / "runtime" / "collage_runtime"
    wrong = [f"{path.relative_to(ROOT)}:{line}: {target}"
             for path in sorted(top.rglob("*.py")) for line, target in imports(path, package_of(path, top))
             if target.split(".")[0] == "collage_mlir"]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_function_local_upward_import(tmp_path):
    pkg = tmp_path / "collage_mlir" / "measure"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("def f():\n    from ..artifact import compile_module\n")
    found = imports(pkg / "x.py", package_of(pkg / "x.py", tmp_path / "collage_mlir"))
    assert found == [(2, "collage_mlir.artifact")]
    assert STAGES.index(stage_of(found[0][1])) > STAGES.index("measure")
