"""Tokenizer and chat-template side files of a Hugging Face checkpoint directory.

Owns which files are copied into the container (``tokenizer.json``, or a tiktoken rank
file as ``tiktoken.model``; ``tokenizer_config.json``; the chat template from
``chat_template.jinja``, ``chat_template.json`` or the tokenizer config) and, for a
tiktoken vocabulary, the split pattern ``pat_str``: taken from the source's config or read
from the literals a ``tokenization_*.py`` assigns (never executed).

Refuses, with a ``ConvertError``: a checkpoint without a tokenizer, or a tiktoken one whose
split pattern cannot be found. Called by :func:`base.finish_plan`.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .quant import ConvertError

__all__ = ["load_json", "tiktoken_pattern", "tokenizer_files"]


def load_json(path: Path) -> dict[str, Any]:
    """Return the JSON object in ``path``.

    Raises:
        ConvertError: unreadable, not JSON, or not an object (naming the file).

    """
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConvertError(f"{path}: cannot read ({e.strerror})") from e
    except ValueError as e:
        raise ConvertError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(obj, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    return obj


def _literal_str(node: ast.expr) -> str | None:
    """Evaluate a string built from literals only: "a", "a" + "b", "|".join([...])."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal_str(node.left), _literal_str(node.right)
        return a + b if a is not None and b is not None else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "join" and len(node.args) == 1 and not node.keywords
            and isinstance(node.args[0], (ast.List, ast.Tuple))):
        sep = _literal_str(node.func.value)
        parts = [_literal_str(e) for e in node.args[0].elts]
        if sep is not None and all(p is not None for p in parts):
            return sep.join(p for p in parts if p is not None)
    return None


def tiktoken_pattern(src: Path, rank_file: str) -> str:
    """Find the split regex of a tiktoken checkpoint.

    It is the ``pat_str`` that a ``tokenization_*.py`` of the checkpoint assigns, read as
    literals and never executed.

    Raises:
        ConvertError: no such assignment (naming the rank file and the config key).

    """
    for py in sorted(src.glob("tokenization_*.py")):
        try:
            tree = ast.parse(py.read_text(encoding="utf-8"), filename=str(py))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            named = any(getattr(t, "id", getattr(t, "attr", None)) == "pat_str" for t in targets)
            value = getattr(node, "value", None)
            if named and value is not None and (pat := _literal_str(value)):
                return pat
    raise ConvertError(
        f"{src / rank_file}: a tiktoken vocabulary needs its split pattern: set 'pat_str' "
        f"in tokenizer_config.json (no tokenization_*.py here assigns one)"
    )


def tokenizer_files(src: Path) -> tuple[list[tuple[str, bytes]], dict[str, Any], dict[str, Any]]:
    """(side files, manifest ``tokenizer``, manifest ``chat``) of a checkpoint directory.

    Raises:
        ConvertError: no tokenizer.json nor tiktoken rank file, or an unreadable config.

    """
    files: list[tuple[str, bytes]] = []
    tok = src / "tokenizer.json"
    tiktoken_files = sorted(
        p for p in src.iterdir() if p.name == "tiktoken.model" or p.suffix == ".tiktoken"
    )
    if tok.is_file():
        files.append(("tokenizer.json", tok.read_bytes()))
        tokenizer: dict[str, Any] = {"kind": "hf", "file": "tokenizer.json", "config": None}
    elif tiktoken_files:
        files.append(("tiktoken.model", tiktoken_files[0].read_bytes()))
        tokenizer = {"kind": "tiktoken", "file": "tiktoken.model", "config": None}
    else:
        raise ConvertError(
            f"{src}: no tokenizer.json or tiktoken rank file (tiktoken.model, *.tiktoken)"
        )
    tc_path = src / "tokenizer_config.json"
    template: str | None = None
    tc = load_json(tc_path) if tc_path.is_file() else {}
    if tokenizer["kind"] == "tiktoken" and not isinstance(tc.get("pat_str"), str):
        # tiktoken has no file of its own for the split regex; the container's
        # tokenizer_config.json carries it so the container needs nothing else.
        tc["pat_str"] = tiktoken_pattern(src, tiktoken_files[0].name)
        files.append(("tokenizer_config.json", json.dumps(tc, indent=1).encode("utf-8")))
        tokenizer["config"] = "tokenizer_config.json"
    elif tc_path.is_file():
        files.append(("tokenizer_config.json", tc_path.read_bytes()))
        tokenizer["config"] = "tokenizer_config.json"
    ct = tc.get("chat_template")
    if isinstance(ct, str):
        template = ct
    elif isinstance(ct, list):
        named = {d.get("name"): d.get("template") for d in ct if isinstance(d, Mapping)}
        pick = named.get("default")
        template = pick if isinstance(pick, str) else None
    jinja = src / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    elif template is None and (src / "chat_template.json").is_file():
        ct = load_json(src / "chat_template.json").get("chat_template")
        template = ct if isinstance(ct, str) else None
    chat: dict[str, Any] = {"template": None, "format": None}
    if template is not None:
        files.append(("chat_template.jinja", template.encode("utf-8")))
        chat["template"] = "chat_template.jinja"
    return files, tokenizer, chat
