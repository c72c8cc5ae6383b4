"""The real `Sampler` on hand-made logits: greedy, filters, penalties, seeds, mask hooks.

Penalties are checked against values worked out by hand from their definitions (OpenAI's
presence/frequency penalties, the HF-style repetition penalty); filters by the set of ids
many seeded draws can produce.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from warp_providers import Sampler, SamplingParams

N_DRAWS = 3000


def _draws(params: SamplingParams, logits: Sequence[float], n: int = N_DRAWS) -> Counter[int]:
    """How often each id is drawn in n samples (fresh logits each time, no history)."""
    sampler = Sampler(params)
    base = np.asarray(logits, dtype=np.float32)
    return Counter(sampler.sample(base.copy(), [])[0] for _ in range(n))


def _log(probs: Sequence[float]) -> list[float]:
    return [float(np.log(p)) for p in probs]


def _seen_by_hook(params: SamplingParams, logits: Sequence[float], generated: Sequence[int],
                  prompt: Sequence[int] = ()) -> np.ndarray:
    """The logits a processor receives, i.e. after the penalties."""
    seen: list[np.ndarray] = []
    sampler = Sampler(params, [lambda _ids, x: seen.append(x.copy())], prompt)
    sampler.sample(np.asarray(logits, dtype=np.float32), generated)
    assert len(seen) == 1
    return seen[0]


def test_greedy_picks_the_argmax_and_its_logprob():
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(0, 3, 97).astype(np.float32)
        tok, logprob = Sampler(SamplingParams()).sample(logits.copy(), [])
        assert tok == int(np.argmax(logits))
        x = logits.astype(np.float64)
        assert logprob == pytest.approx(x[tok] - np.log(np.exp(x).sum()), abs=1e-9)
    # ties: the first index wins
    assert Sampler(SamplingParams()).sample(np.array([1, 5, 5, 2], np.float32), [])[0] == 1


def test_greedy_logprob_counts_only_the_ids_a_processor_left():
    """Masked ids (-inf) carry no mass in the log-softmax of the greedy token."""
    rng = np.random.default_rng(3)
    for _ in range(12):
        logits = rng.normal(0, 3, 211).astype(np.float32)
        masked = rng.choice(211, 50, replace=False)

        def mask(_ids, x, masked=masked):
            x[masked] = -np.inf

        tok, logprob = Sampler(SamplingParams(), [mask]).sample(logits.copy(), [])
        keep = np.setdiff1d(np.arange(211), masked)
        assert tok == int(keep[np.argmax(logits[keep])])
        x = logits.astype(np.float64)[keep]
        assert logprob == pytest.approx(x.max() - np.log(np.exp(x).sum()), abs=1e-9)


def test_temperature_towards_zero_is_greedy():
    rng = np.random.default_rng(1)
    for seed in range(30):
        logits = rng.normal(0, 1, 64).astype(np.float32)
        logits[int(rng.integers(64))] = logits.max() + 0.05  # a clear but small winner
        hot = Sampler(SamplingParams(temperature=1e-4, seed=seed))
        assert hot.sample(logits.copy(), [])[0] == int(np.argmax(logits))


def test_top_k_draws_only_and_all_of_the_k_best():
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 0.3, 40)
    best = set(np.argsort(-logits)[:5].tolist())
    drawn = set(_draws(SamplingParams(temperature=1.0, top_k=5, seed=3), logits))
    assert drawn == best
    # the filter is what restricts the support: without it, more ids appear
    assert len(_draws(SamplingParams(temperature=1.0, seed=3), logits)) > 5


@pytest.mark.parametrize(("top_p", "nucleus"), [(0.4, {0}), (0.75, {0, 1}), (0.85, {0, 1, 2}),
                                                (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_nucleus(top_p, nucleus):
    probs = [0.5, 0.3, 0.15, 0.05]
    counts = _draws(SamplingParams(temperature=1.0, top_p=top_p, seed=4), _log(probs))
    assert set(counts) == nucleus
    mass = sum(probs[i] for i in nucleus)
    for i in nucleus:  # renormalised over the nucleus
        assert counts[i] / N_DRAWS == pytest.approx(probs[i] / mass, abs=0.04)


def test_top_p_renormalises_after_top_k():
    # top-k 2 leaves 0.6/0.9 and 0.3/0.9; a 0.6 nucleus then needs only the first
    counts = _draws(SamplingParams(temperature=1.0, top_k=2, top_p=0.6, seed=5),
                    _log([0.6, 0.3, 0.1]))
    assert set(counts) == {0}


def test_min_p_drops_tokens_below_min_p_times_the_top_probability():
    probs = [0.4, 0.3, 0.15, 0.1, 0.05]
    counts = _draws(SamplingParams(temperature=1.0, min_p=0.3, seed=6), _log(probs))
    assert set(counts) == {0, 1, 2}  # threshold 0.12: 0.1 and 0.05 go
    counts = _draws(SamplingParams(temperature=1.0, min_p=0.2, seed=6), _log(probs))
    assert set(counts) == {0, 1, 2, 3}  # threshold 0.08


def test_sampled_logprob_is_under_the_final_distribution():
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=2, seed=7))
    logits = np.asarray(_log([0.6, 0.3, 0.1]), np.float32)
    for _ in range(50):
        tok, logprob = sampler.sample(logits.copy(), [])
        assert logprob == pytest.approx(np.log([0.6 / 0.9, 0.3 / 0.9][tok]), abs=1e-6)


LOGITS = [2.0, -1.0, 0.5, 3.0, -2.0, 1.0, 0.0]


def test_presence_and_frequency_penalties_follow_openai():
    generated = [0, 3, 3, 1, 3]  # counts: id0 x1, id1 x1, id3 x3
    got = _seen_by_hook(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),
                        LOGITS, generated)
    want = [2.0 - 0.5 - 0.25, -1.0 - 0.5 - 0.25, 0.5, 3.0 - 0.5 - 3 * 0.25, -2.0, 1.0, 0.0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # a negative penalty encourages repeats by the same rule
    got = _seen_by_hook(SamplingParams(presence_penalty=-1.0), LOGITS, generated)
    np.testing.assert_allclose(got, [3.0, 0.0, 0.5, 4.0, -2.0, 1.0, 0.0], atol=1e-6)
    # the prompt is not "generated": it draws no presence penalty
    got = _seen_by_hook(SamplingParams(presence_penalty=1.0), LOGITS, [], prompt=[0, 1])
    np.testing.assert_allclose(got, LOGITS, atol=0)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    got = _seen_by_hook(SamplingParams(repetition_penalty=2.0), LOGITS, [0, 1, 0],
                        prompt=[2, 4, 6])
    # seen once or many times, in the prompt or the reply: the same single adjustment
    want = [1.0, -2.0, 0.25, 3.0, -4.0, 1.0, 0.0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_penalties_steer_greedy_choice():
    # id3 leads by 1.0; three earlier uses at frequency 0.5 cost it 1.5
    sampler = Sampler(SamplingParams(frequency_penalty=0.5))
    assert sampler.sample(np.asarray(LOGITS, np.float32), [])[0] == 3
    assert sampler.sample(np.asarray(LOGITS, np.float32), [3, 3, 3])[0] == 0


def test_same_seed_same_sequence_other_seed_differs():
    logits = np.zeros(50, np.float32)

    def run(seed: int) -> list[int]:
        sampler = Sampler(SamplingParams(temperature=1.0, seed=seed))
        return [sampler.sample(logits.copy(), [])[0] for _ in range(40)]

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_mask_hook_applies_before_sampling():
    banned = list(range(0, 32, 2))
    calls: list[list[int]] = []

    def mask(ids: Sequence[int], x: np.ndarray) -> None:
        calls.append(list(ids))
        x[banned] = -np.inf

    rng = np.random.default_rng(8)
    logits = rng.normal(0, 0.5, 32).astype(np.float32)
    logits[banned] += 5.0  # the banned ids would win without the hook
    sampler = Sampler(SamplingParams(temperature=1.0, seed=9), [mask])
    history: list[int] = []
    for _ in range(500):
        tok, logprob = sampler.sample(logits.copy(), history)
        assert tok not in banned and np.isfinite(logprob)
        history.append(tok)
    assert len(set(history)) == 16  # every allowed id still reachable
    assert calls[3] == history[:3]  # the hook sees the ids generated so far
    greedy = Sampler(SamplingParams(), [mask])
    masked = logits.copy()
    masked[banned] = -np.inf
    assert greedy.sample(logits.copy(), [])[0] == int(np.argmax(masked))


def test_everything_masked_is_refused():
    def mask_all(_ids: Sequence[int], x: np.ndarray) -> None:
        x[:] = -np.inf

    for params in (SamplingParams(), SamplingParams(temperature=0.7, seed=1)):
        with pytest.raises(ValueError, match="masked"):
            Sampler(params, [mask_all]).sample(np.zeros(8, np.float32), [])


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(top_k=-1), dict(min_p=1.5), dict(presence_penalty=3),
                                 dict(frequency_penalty=-3), dict(repetition_penalty=0.0)])
def test_out_of_range_knobs_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def _sorted_reference(params: SamplingParams, logits: np.ndarray, coin: float) -> tuple[int, float]:
    """The filters and the draw over a full stable argsort, as the sampler defines them:
    the ranking the partition-based sampler must reproduce exactly."""
    x = logits.astype(np.float64) / params.temperature
    order = np.argsort(-x, kind="stable")
    if params.top_k > 0:
        order = order[: params.top_k]
    vals = x[order]
    probs = np.exp(vals - vals[0])
    probs /= probs.sum()
    keep = int(np.count_nonzero(probs > 0.0))
    if params.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), params.top_p) + 1))
    if params.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= params.min_p * probs[0])))
    keep = max(keep, 1)
    order, probs = order[:keep], probs[:keep]
    probs = probs / probs.sum()
    idx = min(int(np.searchsorted(np.cumsum(probs), coin * 0.999999999)), keep - 1)
    return int(order[idx]), float(np.log(probs[idx]))


def _tied_logits(rng: np.random.Generator, vocab: int, levels: int) -> np.ndarray:
    """Logits on a few levels (many exact ties, ties at every rank boundary), some masked."""
    x = rng.integers(0, levels, vocab).astype(np.float32) * np.float32(0.75)
    x[rng.random(vocab) < 0.1] = -np.inf
    return x


@pytest.mark.parametrize("top_k", [0, 1, 2, 5, 40, 299, 300, 1000])
@pytest.mark.parametrize("top_p, min_p", [(1.0, 0.0), (0.9, 0.0), (0.5, 0.05), (1.0, 0.2)])
def test_ranking_without_a_full_sort_draws_what_the_full_sort_draws(top_k, top_p, min_p):
    # Same seed, same logits: the same token and the bit-identical logprob as the full
    # stable argsort gives, ties (at the top-k boundary too) going to the lower id.
    vocab, steps = 300, 60
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p, min_p=min_p, seed=11)
    sampler = Sampler(params)
    coins = np.random.default_rng(11)
    rng = np.random.default_rng(top_k * 7 + int(top_p * 10))
    for step in range(steps):
        logits = _tied_logits(rng, vocab, levels=4 if step % 2 else 40)
        want = _sorted_reference(params, logits, coins.random())
        got = sampler.sample(logits.copy(), [])
        assert got[0] == want[0], (step, got, want)
        assert got[1] == want[1], (step, got, want)


def test_ranking_on_a_large_vocabulary_matches_the_full_sort():
    # A 49k vocabulary with real-valued logits (few ties) and a top-k, a nucleus and the
    # whole distribution: each draw equal to the full sort's.
    vocab = 49152
    rng = np.random.default_rng(3)
    for params in (SamplingParams(temperature=0.8, top_k=50, seed=5),
                   SamplingParams(temperature=1.0, top_p=0.95, seed=5),
                   SamplingParams(temperature=1.3, seed=5)):
        sampler, coins = Sampler(params), np.random.default_rng(5)
        for _ in range(10):
            logits = (rng.standard_normal(vocab) * 4).astype(np.float32)
            logits[rng.integers(0, vocab, 8)] = logits.max()  # ties at the top
            assert sampler.sample(logits.copy(), []) == _sorted_reference(
                params, logits, coins.random())
