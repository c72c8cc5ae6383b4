"""The engine's layout rule: an architecture lives in its arch file, the layers point one way.

Read from the source (nothing is built): outside `engine/src/arch/` and the shared blocks
of `engine/src/blocks/`, no file names an architecture (a `model_type` of
`arch/registry.c`, spelled with or without its underscores, in any case), so re-adding
one touches no line of forward.c, state.c, core.c or a central header; every registered
architecture has its file; and each header includes only the layers below it
(util.h -> container.h -> experts.h -> model.h -> blocks.h -> arch.h -> ctx.h), the
sources of `experts/` nothing above experts.h.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "engine" / "src"
LAYERS = ("util.h", "container.h", "experts.h", "model.h", "blocks.h", "arch.h", "ctx.h")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def model_types(src: Path) -> list[str]:
    return re.findall(r"^\s*X\((\w+)\)", (src / "arch" / "registry.c").read_text(), re.M)


def _squash(text: str) -> str:
    return re.sub(r"[_\-\s]", "", text).lower()


def arch_names_outside_arch(src: Path) -> list[str]:
    """file:line naming an architecture, for every file outside arch/ and blocks/."""
    names = {_squash(n): n for n in model_types(src)}
    bad = []
    for path in sorted(src.rglob("*.[ch]")):
        rel = path.relative_to(src)
        if rel.parts[0] in ("arch", "blocks"):
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            bad += [f"{rel}:{no} names {n}" for s, n in names.items() if s in _squash(line)]
    return bad


def missing_arch_files(src: Path) -> list[str]:
    bad = []
    for name in model_types(src):
        path = src / "arch" / f"{name}.c"
        if not path.exists() or f"const wpi_arch wpi_arch_{name} =" not in path.read_text():
            bad.append(f"arch/{name}.c does not define wpi_arch_{name}")
    return bad


def upward_includes(src: Path) -> list[str]:
    """A layer header including one above it, or experts/ including above experts.h."""
    rank = {h: i for i, h in enumerate(LAYERS)}
    files = [(src / h, rank[h]) for h in LAYERS if (src / h).exists()]
    files += [(p, rank["experts.h"]) for p in sorted((src / "experts").glob("*.c"))]
    bad = []
    for path, own in files:
        for inc in INCLUDE.findall(path.read_text()):
            if rank.get(inc, -1) > own or (path.suffix == ".h" and rank.get(inc, -1) == own):
                bad.append(f"{path.relative_to(src)} includes {inc}")
    return bad


def test_registry_lists_architectures() -> None:
    assert len(model_types(SRC)) >= 2, "arch/registry.c: no X(model_type) lines found"


def test_no_architecture_is_named_outside_its_file() -> None:
    assert arch_names_outside_arch(SRC) == []


def test_every_registered_architecture_has_its_file() -> None:
    assert missing_arch_files(SRC) == []


def test_headers_include_only_the_layers_below() -> None:
    assert upward_includes(SRC) == []


def test_the_checks_catch_what_they_forbid(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "arch").mkdir(parents=True)
    (src / "experts").mkdir()
    (src / "arch" / "registry.c").write_text("#define ARCHS(X) \\\n    X(foo_bar) \\\n    X(baz)\n")
    (src / "arch" / "baz.c").write_text("const wpi_arch wpi_arch_baz = {0};\n")
    (src / "forward.c").write_text("/* the FooBar layer */\nint x;\n")
    (src / "model.h").write_text('#include "experts.h"\n#include "arch.h"\n')
    (src / "experts" / "plan.c").write_text('#include "model.h"\n')
    assert arch_names_outside_arch(src) == ["forward.c:1 names foo_bar"]
    assert missing_arch_files(src) == ["arch/foo_bar.c does not define wpi_arch_foo_bar"]
    assert upward_includes(src) == ["model.h includes arch.h", "experts/plan.c includes model.h"]
