"""The layering the tree promises: the core imports no adapter, adapters use only `__all__`.

Read from the source (nothing is imported): every `import` in `warp_providers/` must stay
inside the core or go to a third-party library, never up to an integration; every import
of the core in `integrations/` must be `from warp_providers import NAME` with NAME in
`warp_providers.__all__`, the whole public surface.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = ("langchain_warp", "llama_index", "warp_openai")


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import in a file (names empty for `import x`)."""
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def _public() -> set[str]:
    tree = ast.parse((ROOT / "warp_providers" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {ast.literal_eval(e) for e in node.value.elts}  # type: ignore[attr-defined]
    raise AssertionError("warp_providers/__init__.py has no __all__")


def upward_imports(core: Path) -> list[str]:
    bad = []
    for path in sorted(core.rglob("*.py")):
        for line, module, _ in _imports(path):
            if module.split(".")[0] in ADAPTERS:
                bad.append(f"{path.relative_to(core.parent)}:{line} imports {module}")
    return bad


def private_core_imports(integrations: Path, public: set[str]) -> list[str]:
    bad = []
    for path in sorted(integrations.rglob("*.py")):
        if "build" in path.parts:
            continue
        for line, module, names in _imports(path):
            where = f"{path.relative_to(integrations.parent)}:{line}"
            if module.startswith("warp_providers."):
                bad.append(f"{where} imports the core's module {module}")
            elif module == "warp_providers":
                bad += [f"{where} imports {n}, not in warp_providers.__all__"
                        for n in names if n not in public]
    return bad


def test_the_core_imports_no_integration() -> None:
    assert upward_imports(ROOT / "warp_providers") == []


def test_integrations_use_only_the_public_core() -> None:
    assert private_core_imports(ROOT / "integrations", _public()) == []


def test_the_checks_catch_what_they_forbid(tmp_path: Path) -> None:
    core = tmp_path / "warp_providers"
    core.mkdir()
    (core / "cli.py").write_text("def f():\n    from warp_openai.server import serve\n")
    assert upward_imports(core) == ["warp_providers/cli.py:2 imports warp_openai.server"]
    adapters = tmp_path / "integrations"
    (adapters / "x").mkdir(parents=True)
    (adapters / "x" / "m.py").write_text(
        "from warp_providers import Engine, _secret\nfrom warp_providers.models import clear\n")
    assert private_core_imports(adapters, {"Engine"}) == [
        "integrations/x/m.py:1 imports _secret, not in warp_providers.__all__",
        "integrations/x/m.py:2 imports the core's module warp_providers.models",
    ]
