"""/v1/completions streaming, echo and logprobs; logit_bias; usage details (chat and raw).

The scripted engine checks the shapes; the real engine (SmolLM2, the tiny MoE) checks the
numbers: the echoed prompt's log-probabilities against the engine's own logits, lm-eval's
loglikelihood reading, a bias that bans or forces a token, and a reused prompt prefix.
"""

from __future__ import annotations

import math

import numpy as np
import openai
import pytest
from fake_engine import ScriptedEngine
from openai_cases import USER


# --------------------------------------------------------------------------- scripted
def test_completions_stream_is_text_completion_chunks(make_client):
    client = make_client(ScriptedEngine(["and so on. STOP here"]))
    blocking = client.completions.create(model="m", prompt="Once", stop=["STOP"])
    chunks = list(client.completions.create(model="m", prompt="Once", stop=["STOP"],
                                            stream=True, stream_options={"include_usage": True}))
    assert len(chunks) > 3  # one piece per token, not one body
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == blocking.choices[0].text == "and so on. "
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == blocking.usage.prompt_tokens == len("Once")
    assert chunks[-1].usage.completion_tokens == blocking.usage.completion_tokens


def test_completions_stream_without_usage_ends_with_the_finish_chunk(make_client):
    client = make_client(ScriptedEngine(["abc"]))
    chunks = list(client.completions.create(model="m", prompt="x", stream=True))
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)


def test_echo_prepends_the_prompt(make_client):
    client = make_client(ScriptedEngine(["world"]))
    r = client.completions.create(model="m", prompt="Hello, ", echo=True)
    assert r.choices[0].text == "Hello, world"
    chunks = list(client.completions.create(model="m", prompt="Hello, ", echo=True, stream=True))
    assert chunks[0].choices[0].text == "Hello, "
    assert "".join(c.choices[0].text for c in chunks) == "Hello, world"


def test_prompt_as_token_ids(make_client):
    engine = ScriptedEngine(["ok"])
    client = make_client(engine)
    ids = engine.tokenizer.encode_content("Hi there")
    for prompt in (ids, [ids]):
        r = client.completions.create(model="m", prompt=prompt, echo=True)
        assert engine.prompts[-1] == ids
        assert r.choices[0].text == "Hi thereok"


def test_legacy_logprobs_shape(make_client):
    client = make_client(ScriptedEngine(["abc"]))
    r = client.completions.create(model="m", prompt="x", logprobs=1)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text == "abc"
    assert lp.text_offset == [0, 1, 2]
    assert lp.token_logprobs == [-0.5] * 3  # the scripted engine's logprob
    assert all(len(t) == 1 for t in lp.top_logprobs)


@pytest.mark.parametrize("field,value", [
    ("echo", "yes"), ("stream", 1), ("logprobs", 6), ("logprobs", -1),
    ("prompt", ["a", "b"]), ("prompt", [1, 10**9]), ("max_tokens", 0),
])
def test_completions_refusals_name_the_field(make_client, field, value):
    client = make_client(ScriptedEngine(["x"]))
    body = {"model": "m", "prompt": "hi", field: value}
    with pytest.raises(openai.BadRequestError) as err:
        client.post("/completions", body=body, cast_to=object)
    param = "max_tokens" if field == "max_tokens" else field
    assert err.value.body["param"] == param


def test_echo_on_an_engine_that_cannot_score_is_refused(make_client):
    client = make_client(ScriptedEngine(["x"]))  # no prompt_logits
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="m", prompt="hi", echo=True, logprobs=1)
    assert err.value.body["param"] == "echo"


@pytest.mark.parametrize("bias,why", [
    ({"abc": 1}, "key"), ({"999999": 1}, "key"), ({"5": 101}, "value"), ({"5": "x"}, "value"),
    ([1], "object"),
])
def test_logit_bias_refusals(make_client, bias, why):
    client = make_client(ScriptedEngine(["x"]))
    for route, body in (("/chat/completions", {"messages": USER}), ("/completions",
                                                                       {"prompt": "hi"})):
        with pytest.raises(openai.BadRequestError) as err:
            client.post(route, body={"model": "m", "logit_bias": bias, **body}, cast_to=object)
        assert err.value.body["param"] == "logit_bias"
        assert why in err.value.body["message"]


def test_logit_bias_reaches_the_sampler(make_client):
    """The scripted engine samples nothing, but it records the processors it was given."""
    engine = ScriptedEngine(["x"])
    client = make_client(engine)
    client.chat.completions.create(model="m", messages=USER, logit_bias={"7": -100, "8": 3})
    procs = engine.calls[-1]["processors"]
    logits = np.zeros(engine.tokenizer.vocab_size, dtype=np.float32)
    for p in procs:
        p([], logits)
    assert logits[7] == -np.inf and logits[8] == 3.0 and logits[9] == 0.0


# "<think>Let me see.</think>": the reasoning channel is its two markers (one token each)
# and the bytes between (one token each), everything before the answer.
THINK_TOKENS = 2 + len("Let me see.")


def test_usage_details_on_chat(make_client):
    client = make_client(ScriptedEngine(["<think>Let me see.</think>Four."]))
    r = client.chat.completions.create(model="m", messages=USER)
    assert r.usage.completion_tokens_details.reasoning_tokens == THINK_TOKENS
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # the scripted engine reuses none
    chunks = list(client.chat.completions.create(model="m", messages=USER, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == THINK_TOKENS
    plain = make_client(ScriptedEngine(["Four."])).chat.completions.create(model="m",
                                                                           messages=USER)
    assert plain.usage.completion_tokens_details.reasoning_tokens == 0


# --------------------------------------------------------------------------- real engine
def _log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


@pytest.mark.slow
def test_echo_logprobs_score_the_prompt(connect, smol_path):
    """With echo and logprobs the prompt tokens carry their log-probabilities (the first
    null), equal to a fresh evaluation of the prompt's logits; the generated token's
    logprob is the greedy choice's and tops its alternatives."""
    target = connect(smol_path)
    prompt = "The capital of France is"
    r = target.client.completions.create(model="m", prompt=prompt, echo=True, logprobs=3,
                                         max_tokens=1, temperature=0)
    lp = r.choices[0].logprobs
    ids = target.engine.tokenizer.encode_content(prompt)
    assert len(lp.tokens) == len(ids) + 1
    assert "".join(lp.tokens) == r.choices[0].text and r.choices[0].text.startswith(prompt)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
    target.engine.reset()
    logits = target.engine.eval(ids, all_logits=True)
    want = [float(_log_softmax(logits[i - 1])[ids[i]]) for i in range(1, len(ids))]
    assert lp.token_logprobs[1:len(ids)] == pytest.approx(want, abs=1e-4)
    last = _log_softmax(logits[-1])
    # The generated token's logprob comes from generation's own evaluation of the prompt,
    # whose steps may be split otherwise than this one call; where steps of several tokens
    # run 8-bit (AMX tiles), a token's logits depend on its step's size within that path's
    # error, so the bound is that error's (about 1e-4 relative on SmolLM2's logits).
    multi_x8 = target.engine.info()["x8_max_tokens"] > 1
    assert lp.token_logprobs[-1] == pytest.approx(float(last.max()),
                                                  abs=2e-3 if multi_x8 else 1e-4)
    for top, chosen in zip(lp.top_logprobs[1:], lp.token_logprobs[1:]):
        assert 3 <= len(top) <= 4 and max(top.values()) >= chosen - 1e-6
    assert max(lp.top_logprobs[-1].values()) == pytest.approx(lp.token_logprobs[-1])


@pytest.mark.slow
def test_lm_eval_loglikelihood_reading(connect, smol_path):
    """lm-eval's `local-completions` loglikelihood: prompt = context + continuation, echo,
    logprobs=1, max_tokens=1; it sums token_logprobs[ctxlen:-1] and calls the continuation
    greedy when each of its tokens tops its top_logprobs."""
    target = connect(smol_path)
    tok = target.engine.tokenizer
    context = tok.encode_content("The capital of France is")
    greedy = target.client.completions.create(model="m", prompt=context, max_tokens=2)
    cont_greedy = tok.encode_content(greedy.choices[0].text)
    cont_other = tok.encode_content(" banana")

    def score(cont: list[int]) -> tuple[float, bool]:
        r = target.client.completions.create(model="m", prompt=context + cont, echo=True,
                                             logprobs=1, max_tokens=1, temperature=0)
        lp = r.choices[0].logprobs
        vals = lp.token_logprobs[len(context):-1]
        tops = lp.top_logprobs[len(context):-1]
        assert len(vals) == len(cont)
        return sum(vals), all(v == max(t.values()) for v, t in zip(vals, tops))

    ll_greedy, is_greedy = score(cont_greedy)
    ll_other, other_greedy = score(cont_other)
    assert is_greedy and not other_greedy
    assert ll_other < ll_greedy <= 0.0 and math.isfinite(ll_other)


@pytest.mark.slow
def test_logit_bias_bans_and_forces_tokens(connect, moe_path):
    target = connect(moe_path)
    client, engine = target.client, target.engine
    client.completions.create(model="m", prompt="Hello", max_tokens=3)
    first = engine.last_result.token_ids[0]
    client.completions.create(model="m", prompt="Hello", max_tokens=3,
                              logit_bias={str(first): -100})
    assert engine.last_result.token_ids[0] != first
    forced = next(i for i in range(200, 300) if i != first and not engine.tokenizer.is_control(i))
    client.completions.create(model="m", prompt="Hello", max_tokens=3,
                              logit_bias={str(forced): 100})
    assert engine.last_result.token_ids[0] == forced
    client.chat.completions.create(model="m", messages=USER, max_tokens=2)
    chat_first = engine.last_result.token_ids[0]
    client.chat.completions.create(model="m", messages=USER, max_tokens=2,
                                   logit_bias={str(chat_first): -100})
    assert engine.last_result.token_ids[0] != chat_first


@pytest.mark.slow
def test_cached_tokens_report_the_reused_prefix(connect, moe_path):
    target = connect(moe_path)
    target.engine.reset()  # the shared engine's sequences forget earlier tests' prompts
    client = target.client
    client.completions.create(model="m", prompt="Something else entirely", max_tokens=1)
    first = client.chat.completions.create(model="m", messages=USER, max_tokens=2)
    again = client.chat.completions.create(model="m", messages=USER, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens - 1
    # the same prompt again: all of it but the last token (which gives the logits) reused
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    raw = client.completions.create(model="m", prompt="Something else entirely", max_tokens=1)
    raw2 = client.completions.create(model="m", prompt="Something else entirely", max_tokens=1)
    assert raw2.usage.prompt_tokens_details.cached_tokens == raw2.usage.prompt_tokens - 1
    if target.engine.info()["max_sequences"] > 1:
        # the first completion's sequence still holds its prompt beside the chat's
        assert raw.usage.prompt_tokens_details.cached_tokens == raw.usage.prompt_tokens - 1
    else:  # one state: the chat replaced it
        assert raw.usage.prompt_tokens_details.cached_tokens < raw2.usage.prompt_tokens - 1
