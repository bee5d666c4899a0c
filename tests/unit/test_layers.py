"""The layers of docs/ARCHITECTURE.md, ``engine < stores < agents < scenarios``: a module imports
its own layer and those below it only (house style, Layers). Every import statement of every
module is read with :mod:`ast`, those inside functions and ``TYPE_CHECKING`` blocks included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("engine", "stores", "agents", "scenarios")
"""Bottom to top."""


def imported(path: Path) -> set[str]:
    """The top-level package of every absolute import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the project uses absolute ones)"
            assert node.module is not None
            names.add(node.module.split(".")[0])
    return names


def modules(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_itself_and_the_layers_below(layer: str) -> None:
    above = set(LAYERS[LAYERS.index(layer) + 1 :])
    found = modules(layer)
    assert found, f"no modules under {layer}/"
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported(path) & above)
        for path in found
        if imported(path) & above
    }
    assert not wrong, f"imports from a layer above {layer}: {wrong}"


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from scenarios.assemble import assemble\n    import agents.x\n"
    )
    assert imported(module) == {"scenarios", "agents"}
