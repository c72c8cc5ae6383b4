"""Many sequences on one context and wp_eval_batch, through the binding.

Batched equals alone (greedy tokens, logits within 1e-4 on F32 containers) on a tiny MoE,
a tiny dense llama, a tiny kimi_linear (KDA + MLA layers), a tiny kimi_k3 (its Attention
Residuals' block sums kept per row across the mixer and FFN halves of a batched step), a
tiny gpt_oss (sliding window and sinks), a tiny deepseek_v3 (MLA with q_lora), where
each step projects every sequence's rows at once, and a tiny deepseek_v4 and a tiny
glm5_next (these two batched one sequence after another);
sequences are isolated from each other's reset, truncate, copy and load; a bad input
anywhere in a batch changes no sequence; the sequences are a bounded, typed resource; the plan's floor grows by one
sequence's bytes per sequence; and one batched step reads the union of the sequences'
experts, not the sum.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from support import has_module, requires
from tiny import tiny_deepseek_v4, tiny_glm5_next, tiny_kimi_k3, tiny_moe
from warp_providers import ContextOverflowError, MemoryBudgetError, StateMismatchError, _engine
from warp_providers import plan_memory as engine_plan

N_SEQS = 8
DECODE = 8
# different lengths, crossing the prefill chunk (16 below) so a batch spans several steps
PROMPTS = [[(11 * i + 7 * j) % 250 + 3 for i in range(2 + 5 * j)] for j in range(N_SEQS)]


def _hf_container(root: Path, config, name: str) -> Path:
    """A transformers config at seed 0 saved and converted to an F32 container."""
    import torch
    import transformers as tf
    from fake_engine import tokenizer_json
    from warp_providers.convert import convert

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    src = root / f"hf-{name}"
    model.save_pretrained(src, safe_serialization=True)
    (src / "tokenizer.json").write_text(tokenizer_json())
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return convert(src, root / f"{name}.warp", experts="f32", trunk="f32")


_COMMON = dict(vocab_size=272, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
               tie_word_embeddings=False, initializer_range=0.1, bos_token_id=1,
               eos_token_id=2, pad_token_id=0)


def _llama():
    import transformers as tf

    return tf.LlamaConfig(**_COMMON, intermediate_size=128, head_dim=16)


def _kimi_linear():
    """Layers KDA, MLA, KDA; the first dense, the others routed (grouped, biased)."""
    import transformers as tf

    attn = {"head_dim": 16, "num_heads": 2, "short_conv_kernel_size": 3,
            "kda_layers": [1, 3], "full_attn_layers": [2]}
    moe_kw = {"moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_token": 2,
              "n_shared_experts": 1, "num_expert_group": 2, "topk_group": 1,
              "routed_scaling_factor": 1.5, "moe_renormalize": True,
              "mlp_layer_types": ["dense", "sparse", "sparse"]}
    mla_kw = {"kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8,
              "qk_nope_head_dim": 16, "v_head_dim": 16}
    base = {**_COMMON, "num_hidden_layers": 3, "num_key_value_heads": 4,
            "intermediate_size": 96}
    return tf.KimiLinearConfig(**base, **moe_kw, **mla_kw, linear_attn_config=attn)


def _gpt_oss():
    """A sliding layer (window 8, shorter than most prompts) and a full one, with sinks."""
    import transformers as tf

    return tf.GptOssConfig(**{**_COMMON, **dict(
        head_dim=16, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        swiglu_limit=1.0, max_position_embeddings=512)})


def _deepseek_v3():
    """MLA with q_lora and interleaved RoPE, a dense layer, then grouped routing."""
    import transformers as tf

    return tf.DeepseekV3Config(**{**_COMMON, **dict(
        num_hidden_layers=3, num_key_value_heads=4, intermediate_size=128,
        moe_intermediate_size=32, n_routed_experts=16, n_group=4, topk_group=2,
        num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32,
        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True)})


_HF_CONFIGS = {"llama": _llama, "kimi_linear": _kimi_linear, "gpt_oss": _gpt_oss,
               "deepseek_v3": _deepseek_v3}


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> Path:
    return tiny_moe(tmp_path_factory.mktemp("bmoe"), experts="f32", trunk="f32")


@pytest.fixture(scope="module", params=["qwen3_moe", "llama", "kimi_linear", "kimi_k3",
                                        "gpt_oss", "deepseek_v3", "deepseek_v4", "glm5_next"])
def any_model(request, tmp_path_factory) -> Path:
    """deepseek_v4 and glm5_next have no mixer / ffn split (hyper-connections): their batch
    runs sequence after sequence, each on its own state and layer table, sharing the
    architecture's own data (which must hold no pointer into one sequence's state)."""
    if request.param == "qwen3_moe":
        return request.getfixturevalue("moe")
    if request.param == "deepseek_v4":
        return tiny_deepseek_v4(tmp_path_factory.mktemp("bv4"), experts="f32")
    if request.param == "glm5_next":
        return tiny_glm5_next(tmp_path_factory.mktemp("bglm5"), experts="f32")
    if request.param == "kimi_k3":
        return tiny_kimi_k3(tmp_path_factory.mktemp("bk3"), experts="f32")
    requires(has_module("torch") and has_module("transformers"),
             "torch and transformers (the tiny llama, kimi_linear, gpt_oss and deepseek_v3)")
    make = _HF_CONFIGS[request.param]
    return _hf_container(tmp_path_factory.mktemp(request.param), make(), request.param)


def _ctx(path: Path, n: int = 1, **opts) -> _engine.Context:
    return _engine.Context(str(path), {"n_threads": 2, "prefill_chunk": 16,
                                       "max_sequences": n, **opts})


def _alone(path: Path, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and the logits before each, on a fresh context of one sequence."""
    c = _ctx(path)
    lg = np.zeros(c.vocab_size, np.float32)
    c.eval(np.array(prompt, np.int32), lg, False)
    toks, rows = [], []
    for _ in range(steps):
        rows.append(lg.copy())
        toks.append(int(lg.argmax()))
        c.eval(np.array(toks[-1:], np.int32), lg, False)
    c.close()
    return toks, np.array(rows)


def _batched(c: _engine.Context, seqs, prompts, steps: int):
    """Prefill every sequence in one batch, then `steps` greedy decode steps together."""
    lg = np.zeros((len(seqs), c.vocab_size), np.float32)
    c.eval_batch(seqs, [np.array(p, np.int32) for p in prompts], lg)
    toks: list[list[int]] = [[] for _ in seqs]
    rows: list[list[np.ndarray]] = [[] for _ in seqs]
    for _ in range(steps):
        for i in range(len(seqs)):
            rows[i].append(lg[i].copy())
            toks[i].append(int(lg[i].argmax()))
        c.eval_batch(seqs, [np.array(t[-1:], np.int32) for t in toks], lg)
    return toks, [np.array(r) for r in rows]


def _one(c: _engine.Context, seq, tokens: list[int]) -> np.ndarray:
    lg = np.zeros((1, c.vocab_size), np.float32)
    c.eval_batch([seq], [np.array(tokens, np.int32)], lg)
    return lg[0]


def test_batched_equals_alone(any_model):
    ref = [_alone(any_model, p, DECODE) for p in PROMPTS]
    c = _ctx(any_model, N_SEQS)
    assert c.max_sequences == N_SEQS
    seqs = [None] + [c.seq_open() for _ in range(N_SEQS - 1)]
    toks, rows = _batched(c, seqs, PROMPTS, DECODE)
    for i, (rt, rl) in enumerate(ref):
        assert toks[i] == rt, f"sequence {i}"
        assert np.abs(rows[i] - rl).max() <= 1e-4, f"sequence {i}"
    assert c.position == len(PROMPTS[0]) + DECODE
    for i, s in enumerate(seqs[1:], 1):
        assert s.position == len(PROMPTS[i]) + DECODE


def test_batched_step_does_not_depend_on_threads(any_model):
    """Every sequence's attention of a layer runs in one parallel section, and the matmul
    row blocks are finer with several tokens: neither changes a bit of any logits row."""
    runs = []
    for threads in (1, 3):
        c = _ctx(any_model, N_SEQS, n_threads=threads)
        seqs = [None] + [c.seq_open() for _ in range(N_SEQS - 1)]
        runs.append(_batched(c, seqs, PROMPTS, DECODE))
        c.close()
    (toks1, rows1), (toks3, rows3) = runs
    assert toks1 == toks3
    for i in range(N_SEQS):
        assert np.array_equal(rows1[i], rows3[i]), f"sequence {i}"


def test_batch_longer_than_a_step_is_split(moe):
    """One sequence's 40-token prompt in a batch with others (chunk 16): its own logits."""
    long = PROMPTS[-1][:40]
    ref_long, ref_short = _alone(moe, long, 1)[1][0], _alone(moe, PROMPTS[1], 1)[1][0]
    c = _ctx(moe, 3)
    a, b = c.seq_open(), c.seq_open()
    lg = np.zeros((3, c.vocab_size), np.float32)
    c.eval_batch([a, b, None], [np.array(PROMPTS[1], np.int32), np.array(long, np.int32),
                                np.array(PROMPTS[1], np.int32)], lg)
    assert np.abs(lg[0] - ref_short).max() <= 1e-4
    assert np.abs(lg[1] - ref_long).max() <= 1e-4
    assert np.abs(lg[2] - ref_short).max() <= 1e-4


def test_sequences_are_isolated(moe, tmp_path):
    prompt, cont = PROMPTS[3], [5, 9, 200]
    full = _alone(moe, prompt + cont, 1)[1][0]
    c = _ctx(moe, 4)
    a, b, d = c.seq_open(), c.seq_open(), c.seq_open()
    for s in (None, a, b, d):
        _one(c, s, prompt)
    b.reset()
    d.truncate(3)
    a.save_state(str(tmp_path / "a.st"))
    b.load_state(str(tmp_path / "a.st"))
    d.copy_from(b)
    assert (b.position, d.position) == (len(prompt), len(prompt))
    # every sequence, 0 included, continues the prompt as one context alone would
    for s in (None, a, b, d):
        assert np.abs(_one(c, s, cont) - full).max() <= 1e-4
    # a copy is a fork: the source moving on leaves it where it was
    a.reset()
    assert d.position == len(prompt) + len(cont) and a.position == 0


def test_recurrent_copy_forks_a_state(any_model):
    """copy_from is how a state that cannot truncate (KDA) forks a prefix."""
    prompt, cont = PROMPTS[2], [7, 8]
    full = _alone(any_model, prompt + cont, 1)[1][0]
    c = _ctx(any_model, 3)
    a, b = c.seq_open(), c.seq_open()
    _one(c, a, prompt)
    b.copy_from(a)
    _one(c, a, [100, 101, 102])  # a moves on
    assert np.abs(_one(c, b, cont) - full).max() <= 1e-4


def test_bad_input_changes_no_sequence(moe):
    c = _ctx(moe, 3, ctx_tokens=64)
    a, b = c.seq_open(), c.seq_open()
    for s in (None, a, b):
        _one(c, s, PROMPTS[2])
    _one(c, b, list(range(10, 10 + 64 - len(PROMPTS[2]) - 1)))  # b: one position left
    before = [c.position, a.position, b.position]
    lg = np.zeros((3, c.vocab_size), np.float32)
    good = np.array([5], np.int32)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        c.eval_batch([None, a, b], [good, np.array([5, c.vocab_size], np.int32), good], lg)
    with pytest.raises(ContextOverflowError, match="sequence 2"):
        c.eval_batch([None, a, b], [good, good, np.array([5, 6], np.int32)], lg)
    with pytest.raises(ValueError, match="twice"):
        c.eval_batch([a, None, a], [good, good, good], lg)
    with pytest.raises(ValueError, match="at least 1"):
        c.eval_batch([None, a, b], [good, np.array([], np.int32), good], lg)
    assert [c.position, a.position, b.position] == before
    # and the states are untouched: a continues exactly as alone
    ref = _alone(moe, PROMPTS[2] + [5], 1)[1][0]
    assert np.abs(_one(c, a, [5]) - ref).max() <= 1e-4


def test_sequences_are_a_bounded_typed_resource(moe):
    c = _ctx(moe, 3)
    a, b = c.seq_open(), c.seq_open()
    with pytest.raises(MemoryBudgetError, match="all 3 sequences are in use"):
        c.seq_open()
    b.close()
    b.close()  # idempotent
    assert b.closed
    with pytest.raises(ValueError, match="closed"):
        b.reset()
    again = c.seq_open()
    assert again.position == 0
    _one(c, a, [4, 5])
    c.close()
    assert a.closed and again.closed
    with pytest.raises(ValueError, match="closed"):
        _ = a.position
    other = _ctx(moe, 2)
    foreign = other.seq_open()
    with pytest.raises(ValueError, match="another context"):
        _ctx(moe, 2).eval_batch([foreign], [np.array([1], np.int32)],
                                np.zeros((1, other.vocab_size), np.float32))


def test_plan_floor_grows_with_sequences(moe):
    plans = {n: engine_plan(moe, max_sequences=n, prefill_chunk=16) for n in (1, 2, 5)}
    one = plans[1]
    assert one["sequences"] == 1
    assert one["sequence_bytes"] >= one["kv_bytes"] > 0
    for n, p in plans.items():
        assert p["sequences"] == n
        assert p["floor_bytes"] == one["floor_bytes"] + (n - 1) * one["sequence_bytes"]
    floor5 = plans[5]["floor_bytes"]
    with pytest.raises(MemoryBudgetError, match="5 sequences"):
        engine_plan(moe, budget=floor5 - 1, max_sequences=5, prefill_chunk=16)
    with pytest.raises(MemoryBudgetError):
        _ctx(moe, 5, budget_bytes=floor5 - 1)
    # at the floor for 5 it opens, and the cache is what the 4 more sequences left
    c = _ctx(moe, 5, budget_bytes=floor5)
    assert c.info()["plan"]["cache_bytes"] == plans[5]["min_cache_bytes"]
    assert c.stats()["peak_bytes"] <= floor5
    assert engine_plan(moe, budget=floor5, prefill_chunk=16)["cache_bytes"] > \
        c.info()["plan"]["cache_bytes"]


def test_sequences_above_the_limit_are_refused_by_name(moe):
    # the C engine bounds the count itself (a caller of the C API has no Python check)
    with pytest.raises(ValueError, match="max_sequences 4097 is above the limit 4096"):
        _engine.plan_memory(str(moe), {"max_sequences": 4097})
    assert _engine.plan_memory(str(moe), {"max_sequences": 4096})["sequences"] == 4096


def _used(path: Path, tmp: Path, token: int) -> set[tuple[int, int]]:
    """(layer, expert) records one token at position 0 reads on a fresh context."""
    c = _ctx(path, lookahead=0)
    c.eval(np.array([token], np.int32), np.zeros(0, np.float32), False)
    out = tmp / f"hot-{token}.txt"
    c.hotlist_save(str(out))
    lines = out.read_text().splitlines()[1:]
    return {(int(x.split()[0]), int(x.split()[1])) for x in lines}


@pytest.mark.parametrize("cache", ["every record", "the minimum"])
def test_one_step_reads_the_union_of_experts(moe, tmp_path, cache):
    """At the floor the cache holds 2 x top_k records: evaluated one after another, the
    sequences would read again what the previous one's later layers evicted."""
    tokens = [3, 50, 120, 201]
    sets = [_used(moe, tmp_path, t) for t in tokens]
    union = set().union(*sets)
    assert len(union) < sum(len(s) for s in sets), "the draws share no expert: no test"
    opts = {"lookahead": 0}
    if cache == "the minimum":
        opts["budget_bytes"] = engine_plan(moe, max_sequences=4, prefill_chunk=16)["floor_bytes"]
    c = _ctx(moe, 4, **opts)
    seqs = [None] + [c.seq_open() for _ in range(3)]
    c.stats_reset()
    c.eval_batch(seqs, [np.array([t], np.int32) for t in tokens],
                 np.zeros((4, c.vocab_size), np.float32))
    st = c.stats()
    assert st["expert_misses"] == len(union)
    assert st["bytes_read"] == len(union) * c.info()["plan"]["record_bytes"]


def test_state_of_another_shape_is_refused_per_sequence(moe, tmp_path):
    short = _ctx(moe, 2, ctx_tokens=64)
    s = short.seq_open()
    _one(short, s, [4, 5, 6])
    s.save_state(str(tmp_path / "s.st"))
    c = _ctx(moe, 2)
    t = c.seq_open()
    with pytest.raises(StateMismatchError, match="ctx_tokens"):
        t.load_state(str(tmp_path / "s.st"))
    assert t.position == 0


def test_batched_decode_step_looks_ahead_for_every_sequence(moe):
    """Lookahead prefetches the next layer's likely experts of every row of a batched
    decode step; timing only, so the logits are those without it."""
    out = {}
    for la in (0, 1):
        c = _ctx(moe, 4, lookahead=la)
        seqs = [None] + [c.seq_open() for _ in range(3)]
        lg = np.zeros((4, c.vocab_size), np.float32)
        c.eval_batch(seqs, [np.array(p[:4], np.int32) for p in PROMPTS[1:5]], lg)
        c.stats_reset()
        c.eval_batch(seqs, [np.array([int(r.argmax())], np.int32) for r in lg], lg)
        out[la] = (lg.copy(), c.stats())
    assert np.array_equal(out[0][0], out[1][0])
    assert out[0][1]["prefetch_issued"] == 0
    assert out[1][1]["prefetch_issued"] > 0 and out[1][1]["prefetch_hits"] > 0
    assert out[1][1]["expert_misses"] < out[0][1]["expert_misses"]
