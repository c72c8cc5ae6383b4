"""Where the project keeps files of its own: the user cache directory.

Owns: `cache_dir()`, `$WARP_CACHE` when set, else `warp-providers` under the XDG cache
(`$XDG_CACHE_HOME`, else `~/.cache`). Converted default models (`warp demo`) and batch
jobs (warp-openai) live below it. Refuses nothing; creating the directory may raise OSError.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir(create: bool = True) -> Path:
    """The user cache directory of warp-providers (created if missing, unless `create` is
    False)."""
    root = os.environ.get("WARP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "warp-providers")
    path = Path(root)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
