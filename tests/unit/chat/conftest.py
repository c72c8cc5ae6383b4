"""Fixtures of the chat-format tests: real tokenizers carrying every marker of every format."""

from __future__ import annotations

import pytest
from chat_helpers import make_hf, make_tiktoken

from warp_providers.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def hf_tok() -> Tokenizer:
    """HF BPE carrying every marker of every format."""
    return make_hf()


@pytest.fixture(scope="session")
def tk_tok() -> Tokenizer:
    """tiktoken carrying every marker of every format."""
    return make_tiktoken()


@pytest.fixture(scope="session", params=["tokenizers", "tiktoken"])
def any_tok(request: pytest.FixtureRequest) -> Tokenizer:
    """Both tokenizer families."""
    return make_hf() if request.param == "tokenizers" else make_tiktoken()
