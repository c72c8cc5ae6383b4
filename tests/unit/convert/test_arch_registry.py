"""registry.py and the layout of the converter: one module per model_type, no private reach-ins."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import warp_providers.convert as conv
from warp_providers.convert import ConvertError, registry
from warp_providers.convert.hf import load_hf

CONVERT = Path(conv.__file__).parent


def test_every_model_type_has_its_module() -> None:
    files = {p.stem for p in (CONVERT / "arch").glob("*.py") if p.stem != "__init__"}
    assert set(registry.ARCHES) == files
    for name in registry.ARCHES:
        mod = registry.module(name)
        assert mod.MODEL_TYPE == name and mod.ARCH.model_type == name and callable(mod.load)


@pytest.mark.parametrize("alias,name", sorted(registry.ALIASES.items()))
def test_aliases_resolve_to_their_type(alias: str, name: str) -> None:
    assert registry.canonical(alias) == name and registry.module(alias) is registry.module(name)


def test_unknown_model_type_is_refused_with_the_list(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bloom"}))
    with pytest.raises(ConvertError) as e:
        load_hf(tmp_path)
    assert "bloom" in str(e.value) and ", ".join(registry.available()) in str(e.value)
    assert "kimi_k2" in registry.available() and "glm5_next_text" in registry.available()


def _private_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.level:
            out += [
                f"{node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and a.name != "__future__"
            ]
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in {"hf", "base", "decoder", "blocks", "plan"}
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            out.append(f"{node.value.id}.{node.attr}")
    return out


@pytest.mark.parametrize("path", sorted(CONVERT.rglob("*.py")), ids=lambda p: p.name)
def test_no_module_uses_another_modules_private_names(path: Path) -> None:
    assert _private_imports(path) == []
