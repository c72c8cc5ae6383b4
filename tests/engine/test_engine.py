"""The Python Engine over the binding: open, eval, state, plan, errors, stats, stop strings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tiny import tiny_moe
from warp_providers import (
    ContextOverflowError,
    Engine,
    MemoryBudgetError,
    ModelFormatError,
    ModelNotFoundError,
    StateMismatchError,
    UnsupportedModelError,
    parse_size,
    plan_memory,
)

PROMPT = [(7 * i + 3) % 200 + 10 for i in range(32)]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_moe(tmp_path_factory.mktemp("eng"))


@pytest.fixture(scope="module")
def other_model(tmp_path_factory) -> Path:
    from warp_providers.synth import MoeShape

    shape = MoeShape(hidden_size=64, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16)
    return tiny_moe(tmp_path_factory.mktemp("other"), shape=shape, seed=1)


def test_info_and_eval_shapes(model):
    with Engine.open(model, threads=1) as eng:
        info = eng.info()
        assert info["model_type"] == "qwen3_moe"
        assert info["n_layers"] == 3 and info["n_experts"] == 16 and info["top_k"] == 4
        assert info["isa"] in ("scalar", "avx2", "avx512", "neon")
        last = eng.eval(PROMPT[:5])
        assert last.shape == (eng.vocab_size,) and last.dtype == np.float32
        assert np.isfinite(last).all()
        assert eng.position == 5
        all_ = eng.eval(PROMPT[5:9], all_logits=True)
        assert all_.shape == (4, eng.vocab_size)


@pytest.mark.parametrize("exact, tol", [(True, 1e-5), (False, 1e-3)])
def test_incremental_equals_batched(model, exact, tol):
    """Within float reassociation on the float32 path. On the 8-bit path a reassociated
    input can round to the next step of the residual plane (d / 256), and that step
    shows in the logits: about 1.5e-4 here."""
    with Engine.open(model, threads=2, exact=exact) as eng:
        batched = eng.eval(PROMPT, all_logits=True)
        eng.reset()
        steps = np.stack([eng.eval([t]) for t in PROMPT])
    assert np.abs(batched - steps).max() <= tol
    assert (batched.argmax(-1) == steps.argmax(-1)).all()


def test_threads_do_not_change_results(model):
    outs = []
    for threads in (1, 2, 4):
        with Engine.open(model, threads=threads) as eng:
            outs.append(eng.eval(PROMPT, all_logits=True))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_state_round_trip(model, tmp_path):
    with Engine.open(model) as eng:
        eng.eval(PROMPT[:20])
        eng.save_state(tmp_path / "s.bin")
        want = eng.eval(PROMPT[20:24], all_logits=True)
        eng.reset()
        eng.load_state(tmp_path / "s.bin")
        assert eng.position == 20
        got = eng.eval(PROMPT[20:24], all_logits=True)
    assert np.array_equal(want, got)


def test_state_of_another_model_is_refused(model, other_model, tmp_path):
    with Engine.open(other_model) as eng:
        eng.eval(PROMPT[:4])
        eng.save_state(tmp_path / "o.bin")
    with Engine.open(model) as eng:
        with pytest.raises(StateMismatchError):
            eng.load_state(tmp_path / "o.bin")
        (tmp_path / "junk.bin").write_bytes(b"\x00garbage" * 10)
        with pytest.raises((ModelFormatError, StateMismatchError)):
            eng.load_state(tmp_path / "junk.bin")
        assert eng.eval(PROMPT[:2]).shape == (eng.vocab_size,)  # still usable


def test_context_overflow_and_bad_ids(model):
    with Engine.open(model, ctx=16) as eng:
        with pytest.raises(ContextOverflowError):
            eng.eval(list(range(10, 30)))
        assert eng.position == 0
        with pytest.raises(ValueError):
            eng.eval([eng.vocab_size])
        with pytest.raises(ContextOverflowError):
            eng.generate(list(range(10, 30)), max_tokens=4)


def test_truncate_and_prompt_cache(model):
    with Engine.open(model) as eng:
        a = eng.generate(PROMPT, max_tokens=4, stop_ids=[])
        b = eng.generate(PROMPT, max_tokens=4, stop_ids=[])
        assert a.token_ids == b.token_ids
        assert b.cached_tokens == len(PROMPT) - 1
        # the low-level calls act on sequence 0, which generations leave to them while
        # another sequence is free
        eng.eval(PROMPT)
        assert eng.position == len(PROMPT)
        eng.truncate(3)
        assert eng.position == 3


def test_plan_and_budget(model):
    plan = plan_memory(model)
    for key in ("trunk_bytes", "kv_bytes", "scratch_bytes", "min_cache_bytes", "floor_bytes",
                "working_set_bytes", "recommended_bytes"):
        assert plan[key] > 0, key
    # the sequences Engine.open would hold (each beyond the first adds sequence_bytes)
    assert plan["sequences"] >= 1
    assert plan["floor_bytes"] == (plan["trunk_bytes"] + plan["kv_bytes"] +
                                   plan["scratch_bytes"] + plan["min_cache_bytes"] +
                                   (plan["sequences"] - 1) * plan["sequence_bytes"])
    one = plan_memory(model, max_sequences=1)
    assert one["sequences"] == 1
    assert one["floor_bytes"] == plan["floor_bytes"] - (plan["sequences"] - 1) * plan["sequence_bytes"]
    too_small = one["floor_bytes"] - 1
    with pytest.raises(MemoryBudgetError) as e:
        Engine.open(model, budget=too_small)
    assert str(one["floor_bytes"]) in str(e.value) or "floor" in str(e.value)
    with pytest.raises(MemoryBudgetError, match=r"below the floor \d+ bytes .* for 1 sequence:"):
        Engine.open(model, budget=too_small, max_sequences=1)
    with Engine.open(model, budget=plan["floor_bytes"]) as eng:
        assert eng.info()["max_sequences"] == plan["sequences"]
        eng.eval(PROMPT)
        assert eng.stats()["peak_bytes"] <= plan["floor_bytes"]
    if plan["sequences"] > 1:  # below the default's floor it holds fewer sequences
        with Engine.open(model, budget=plan["floor_bytes"] - 1) as eng:
            assert 1 <= eng.info()["max_sequences"] < plan["sequences"]
            eng.eval(PROMPT)
            assert eng.stats()["peak_bytes"] <= plan["floor_bytes"] - 1


def test_parse_size():
    assert parse_size("6G") == 6 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size(1234) == 1234
    for bad in ("six", "-1G", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_missing_and_unsupported(model, tmp_path):
    with pytest.raises(ModelNotFoundError):
        Engine.open(tmp_path / "nope.warp")
    bad = tmp_path / "bad.warp"
    shutil.copytree(model, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["model_type"] = "gpt_neo"
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UnsupportedModelError) as e:
        Engine.open(bad)
    assert "qwen3_moe" in str(e.value) and "llama" in str(e.value)


def test_isa_option_every_kernel_set(model):
    """Each isa name opens exactly when the CPU can run that set, and gives its logits
    within float tolerance of the scalar reference; a set this CPU lacks is refused."""
    from warp_providers import _engine

    supported = _engine.isa_supported()
    with Engine.open(model, threads=1, isa="scalar") as eng:
        want = eng.eval(PROMPT[:6], all_logits=True)
    for name, bit in (("avx2", 2), ("avx512", 3), ("neon", 4)):
        if supported & (1 << bit):
            with Engine.open(model, threads=1, isa=name) as eng:
                assert eng.info()["isa"] == name
                got = eng.eval(PROMPT[:6], all_logits=True)
            assert np.abs(got - want).max() <= 1e-3 * max(1.0, np.abs(want).max())
        else:
            with pytest.raises(UnsupportedModelError, match="isa"):
                Engine.open(model, isa=name)
    with pytest.raises(ValueError, match="neon"):
        Engine.open(model, isa="sve")


def test_unknown_option(model):
    with pytest.raises(TypeError):
        Engine.open(model, warp_speed=9)


def _scripted(eng: Engine, reply: str):
    """A logits hook that makes greedy decoding spell `reply`, one byte token per step."""
    ids = eng.tokenizer.encode_content(reply)
    assert len(ids) == len(reply.encode())  # the tiny tokenizer: one token per byte

    def force(generated, logits):
        logits[:] = -np.inf
        logits[ids[len(generated)]] = 0.0

    return force, len(ids)


def _stream(eng: Engine, reply: str, stop: list[str]):
    force, n = _scripted(eng, reply)
    events = list(eng.stream(PROMPT, max_tokens=n, stop=stop, stop_ids=[], processors=[force]))
    result = eng.last_result
    assert "".join(e.text for e in events) == result.text
    return [e.text for e in events], result


@pytest.mark.parametrize(("reply", "stop", "text", "n_ids"), [
    ("ab<>cd", ["<>"], "ab", 4),                  # the stop string spans two token pieces
    ("Hello END tail", ["END"], "Hello ", 9),     # three pieces
    ("ENDabc", ["END"], "", 3),                   # at the very start
    ("abcdzz", ["zz", "cd", "bcx"], "ab", 4),     # the first complete match wins
    ("abcd", ["cd", "bcd"], "a", 4),              # two complete at once: the earlier start
])
def test_stop_strings_across_token_boundaries(model, reply, stop, text, n_ids):
    with Engine.open(model, threads=1) as eng:
        pieces, result = _stream(eng, reply, stop)
    assert result.text == text and result.finish_reason == "stop"
    assert len(result.token_ids) == n_ids  # generation ended on the token completing it
    assert "".join(pieces) == text  # the events never leaked any of the stop string


def test_text_held_for_a_possible_stop_is_released_when_it_fails(model):
    with Engine.open(model, threads=1) as eng:
        pieces, result = _stream(eng, "abEN!xyENDz", ["END"])
        assert pieces == ["a", "b", "", "", "EN!", "x", "y", "", ""]
        assert result.text == "abEN!xy" and result.finish_reason == "stop"
        # no stop string in the reply: everything held comes out, nothing is lost
        pieces, result = _stream(eng, "xEN", ["END"])
        assert pieces == ["x", "", "", "EN"] and result.text == "xEN"
        assert result.finish_reason == "length"


def test_a_generation_closed_by_its_consumer_records_its_own_result(model):
    """A consumer that stops reading (a stop string it matched, a disconnect) and closes
    the stream leaves `last_result` describing this generation, never the previous one."""
    with Engine.open(model, threads=1) as eng:
        force, _ = _scripted(eng, "abcdefgh")
        eng.generate(PROMPT, max_tokens=6, stop_ids=[], processors=[force])
        before = eng.last_result
        assert len(before.token_ids) == 6
        force, _ = _scripted(eng, "abcdefgh")
        longer = PROMPT + [5, 6, 7]
        events = eng.stream(longer, max_tokens=8, stop_ids=[], processors=[force])
        for i, _ in enumerate(events):
            if i == 2:
                break
        events.close()
        result = eng.last_result
    assert result is not before
    assert result.finish_reason == "cancelled" and len(result.token_ids) == 3
    assert result.prompt_tokens == len(longer)
    assert result.stats["prompt_tokens_evaluated"] + result.stats["cached_tokens"] == \
        result.prompt_tokens


def test_max_sequences_on_this_binding(model):
    """One sequence always opens; more open where the binding has sequences, and are
    refused by name where it has not (the scheduler then runs one request at a time)."""
    from warp_providers import _engine

    with Engine.open(model, threads=1, max_sequences=1) as eng:
        assert eng.info()["max_sequences"] == 1
        assert eng.generate(PROMPT, max_tokens=2, stop_ids=[]).token_ids
    if hasattr(_engine.Context, "seq_open"):
        with Engine.open(model, threads=1, max_sequences=3) as eng:
            assert eng.info()["max_sequences"] == 3
    else:
        with pytest.raises(ValueError, match="max_sequences=3: this build"):
            Engine.open(model, max_sequences=3)
    with pytest.raises(ValueError, match="max_sequences must be"):
        Engine.open(model, max_sequences=0)
