"""What imports what: the two roles share names only through the `edgeplex`
package (nothing under control_plane/ imports the agent), and tests share helpers
only through their support modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def test_the_control_plane_never_imports_the_agent() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in imported_modules(path) if "agent" in m.split(".")
        )
        for path in sorted((ROOT / "control_plane").rglob("*.py"))
    }
    assert {path: found for path, found in offenders.items() if found} == {}


def test_no_test_module_or_bench_imports_a_test_module() -> None:
    """Helpers the tests share live in tests/conftest.py, tests/services.py and
    tests/support/, where benches import them too; a test module is only run."""
    offenders = {}
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").glob("*.py")]):
        found = sorted(
            m
            for m in imported_modules(path)
            if m.startswith("tests.") and m.rsplit(".", 1)[-1].startswith("test_")
        )
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


def runtime_imports(path: Path) -> set[str]:
    """What `path` imports when it runs (not under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    return {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and id(node) not in typing_only
    }


def test_the_agents_parts_never_import_its_top() -> None:
    """agent/ holds only its top (server, core, config, cli); every folder below it
    depends downward: none imports the top at run time."""
    agent = ROOT / "agent"
    top = {f"edgeplex.agent.{p.stem}" for p in agent.glob("*.py") if p.stem != "__init__"}
    assert top == {f"edgeplex.agent.{m}" for m in ("cli", "config", "core", "server")}
    offenders = {
        str(path.relative_to(ROOT)): sorted(runtime_imports(path) & top)
        for path in sorted(agent.glob("*/**/*.py"))
    }
    assert {path: found for path, found in offenders.items() if found} == {}


def test_residency_and_batching_do_not_import_each_other() -> None:
    """Residency decides which model is where; batching runs each model's queue. They
    meet through residency/contract.py's protocols, wired by the server."""
    agent = ROOT / "agent"
    found = {
        f"{part} -> {other}": sorted(
            str(path.relative_to(ROOT))
            for path in (agent / part).glob("*.py")
            if any(m.startswith(f"edgeplex.agent.{other}") for m in imported_modules(path))
        )
        for part, other in (("residency", "batching"), ("batching", "residency"))
    }
    assert found == {"residency -> batching": [], "batching -> residency": []}
