"""The BPE word cache of a vocabulary that does not split words is off (per-thread growth).

`tokenizers` keeps its BPE word cache per thread. With a pre-tokenizer that does not cut
text into words (the synthetic models' byte-level one without its regex), each entry is
a whole text segment, so every distinct prompt grew each long-lived encoding thread by
about 1 KiB (the 10,000-request soak's RSS drift). The test measures malloc's bytes in
use inside one thread that stays alive, against the library's default on the same
vocabulary, which must show the growth (so the measure would catch it coming back).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from support import requires

from warp_providers.synth._common import byte_tokenizer_json
from warp_providers.tokenizer import Tokenizer, _drop_segment_cache

DISTINCT = 3000


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def _in_use_bytes() -> Callable[[], int]:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    fn = getattr(libc, "mallinfo2", None)
    requires(fn is not None, "glibc mallinfo2 (glibc >= 2.33), which CI's C library has")
    fn.restype = _MallInfo2
    return lambda: int(fn().uordblks)


def _growth_in_one_thread(encode: Callable[[str], Any], in_use: Callable[[], int]) -> int:
    """Bytes in use gained by DISTINCT encodes in a thread, measured before it exits (a
    thread's cache is freed when it ends)."""
    out: dict[str, int] = {}

    def work() -> None:
        for k in range(200):  # the thread's own first allocations
            encode(f"warm {k} ~")
        before = in_use()
        for k in range(DISTINCT):
            encode(f"Item {k:05d}: one word, please.")
        out["grew"] = in_use() - before

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return out["grew"]


def test_whole_segment_vocabulary_does_not_grow_per_thread() -> None:
    from tokenizers import Tokenizer as HF

    in_use = _in_use_bytes()
    spec, _ = byte_tokenizer_json()
    raw = HF.from_str(spec)  # the library's default cache
    tok = Tokenizer.from_tokenizer_json(spec)

    default = _growth_in_one_thread(lambda s: raw.encode(s, add_special_tokens=False), in_use)
    content = _growth_in_one_thread(tok.encode_content, in_use)
    markup = _growth_in_one_thread(tok.encode_markup, in_use)
    # The default caches every distinct segment: well over 200 bytes each.
    assert default > 200 * DISTINCT, default
    assert content < 30 * DISTINCT, (content, default)
    assert markup < 30 * DISTINCT, (markup, default)
    # Still the same ids as the library's own encoding.
    text = "Item 00042: one word, please."
    assert tok.encode_content(text) == raw.encode(text, add_special_tokens=False).ids


class _Model:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def _resize_cache(self, n: int) -> None:
        self.sizes.append(n)


def _pre(name: str) -> Any:
    from tokenizers import pre_tokenizers

    return {
        "none": None,
        "bytelevel_whole": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        "bytelevel_words": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        "metaspace": pre_tokenizers.Metaspace(),
        "whitespace": pre_tokenizers.Whitespace(),
    }[name]


@pytest.mark.parametrize(("pre", "sizes"), [
    ("none", [0]), ("bytelevel_whole", [0]),
    ("bytelevel_words", []), ("metaspace", []), ("whitespace", []),
])
def test_only_vocabularies_that_do_not_split_lose_the_cache(pre: str, sizes: list[int]) -> None:
    model = _Model()
    fake = SimpleNamespace(model=model, pre_tokenizer=_pre(pre))
    _drop_segment_cache(fake)  # type: ignore[arg-type]
    assert model.sizes == sizes


def test_a_library_without_the_resize_call_is_left_alone() -> None:
    fake = SimpleNamespace(model=object(), pre_tokenizer=None)
    _drop_segment_cache(fake)  # type: ignore[arg-type]
