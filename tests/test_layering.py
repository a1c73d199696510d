"""The core never imports the parts built on it; the parts never import each other or the CLI.

Layers, bottom to top: core (`pilotfish.*` but `pilotfish.cli`), the parts
(`pilotfish.operators`, `pilotfish.extender`, `pilotfish.webhooks`), the CLI. Checked on the
source text, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = {
    "pilotfish.operators": ROOT / "operators",
    "pilotfish.extender": ROOT / "scheduler-extender",
    "pilotfish.webhooks": ROOT / "admission-webhooks",
}
CLI = "pilotfish.cli"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def violations(files: list[Path], forbidden: set[str]) -> list[str]:
    out = []
    for path in files:
        for module in sorted(imported_modules(path)):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                out.append(f"{path.relative_to(ROOT)} imports {module}")
    return out


def core_files() -> list[Path]:
    return [p for p in (ROOT / "pilotfish").rglob("*.py") if "cli" not in p.relative_to(ROOT).parts]


def test_core_imports_no_part_and_not_the_cli() -> None:
    files = core_files()
    assert len(files) > 5
    assert violations(files, {*PARTS, CLI}) == []


@pytest.mark.parametrize("part", sorted(PARTS))
def test_parts_import_neither_each_other_nor_the_cli(part: str) -> None:
    files = list(PARTS[part].rglob("*.py"))
    assert files
    assert violations(files, {p for p in PARTS if p != part} | {CLI}) == []


def test_the_check_would_see_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from pilotfish.extender import server\n")
    assert imported_modules(bad) >= {"pilotfish.extender", "pilotfish.extender.server"}


def test_pyproject_lists_every_package() -> None:
    """setuptools' package-dir mapping needs an explicit list: a package missing from it
    imports in an editable install and is silently absent from a built wheel."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for package, folder in cfg["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *rel)))
    assert found <= listed, f"missing from pyproject packages: {sorted(found - listed)}"
