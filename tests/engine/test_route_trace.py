"""Routing-trace replay (benchmarks only): the experts the engine reads are the trace's.

The tiny MoE has 3 MoE layers of 16 experts, top-4; the trace written here has 2 MoE
layers (so model MoE layer j reads trace layer j % 2) and 7 tokens (so it wraps). The
per-(layer, expert) demand lookups come back through the hotlist: each chunk looks up each
distinct expert of its tokens once.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from warp_providers import Engine, _engine
from warp_providers.route_trace import binary_trace, read_jsonl

from tiny import tiny_moe

N_TOK, N_LAYERS, TOP_K, EXPERTS = 7, 2, 4, 16


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_moe(tmp_path_factory.mktemp("trace"))


def write_trace(path: Path, tokens: int, layers: int, top_k: int, experts: int,
                seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = np.stack([[rng.choice(experts, top_k, replace=False) for _ in range(layers)]
                    for _ in range(tokens)])
    with path.open("w") as f:
        for t, row in enumerate(ids):
            f.write(json.dumps({"tok": t, "layers": row.tolist()}) + "\n")
    return ids


def hotlist_counts(eng: Engine, path: Path) -> Counter[tuple[int, int]]:
    eng.save_hotlist(path)
    lines = path.read_text().splitlines()[1:]
    return Counter({(int(a), int(b)): int(c) for a, b, c in (ln.split() for ln in lines)})


def expected_counts(ids: np.ndarray, moe_layers: list[int], chunks: list[int],
                    offset: int) -> Counter[tuple[int, int]]:
    want: Counter[tuple[int, int]] = Counter()
    tok = offset
    for n in chunks:
        for j, layer in enumerate(moe_layers):
            distinct = {int(e) for t in range(tok, tok + n)
                        for e in ids[t % len(ids), j % ids.shape[1]]}
            for e in distinct:
                want[(layer, e)] += 1
        tok += n
    return want


@pytest.mark.parametrize("offset", [0, 5])
def test_experts_read_are_the_traces(model: Path, tmp_path: Path, offset: int) -> None:
    ids = write_trace(tmp_path / "t.jsonl", N_TOK, N_LAYERS, TOP_K, EXPERTS)
    chunks = [4] + [1] * 9  # a prefill chunk, then decode past the end of the trace
    with Engine.open(model, route_trace=tmp_path / "t.jsonl", route_trace_offset=offset,
                     route_trace_experts=EXPERTS, lookahead=False) as eng:
        assert eng.info()["n_moe_layers"] == 3
        toks = list(range(10, 10 + sum(chunks)))
        at = 0
        for n in chunks:
            eng.eval(toks[at:at + n])
            at += n
        got = hotlist_counts(eng, tmp_path / "hot")
        st = eng.stats()
    moe_layers = sorted({layer for layer, _ in got})
    assert moe_layers == [0, 1, 2]
    want = expected_counts(ids, moe_layers, chunks, offset)
    assert got == want
    assert st["expert_lookups"] == sum(want.values())
    # The trace, not the router: the model's own routing reads other experts.
    with Engine.open(model, lookahead=False) as eng:
        at = 0
        for n in chunks:
            eng.eval(toks[at:at + n])
            at += n
        assert hotlist_counts(eng, tmp_path / "hot2") != want


def batch_counts(ids: np.ndarray, moe_layers: list[int],
                 steps: list[list[tuple[int, int]]]) -> Counter[tuple[int, int]]:
    """Each step's (first trace token, rows) per sequence: every MoE layer looks up the
    union of all its rows' experts once."""
    want: Counter[tuple[int, int]] = Counter()
    for step in steps:
        for j, layer in enumerate(moe_layers):
            distinct = {int(e) for start, n in step for t in range(start, start + n)
                        for e in ids[t % len(ids), j % ids.shape[1]]}
            for e in distinct:
                want[(layer, e)] += 1
    return want


@pytest.mark.parametrize("stride", [0, 3])
def test_batched_rows_read_their_own_sequences_trace(model: Path, tmp_path: Path,
                                                     stride: int) -> None:
    """Sequence k starts at offset + k * stride (0: the trace's length / sequences) and
    advances by its own tokens; in a batched step each row reads its sequence's cursor."""
    ids = write_trace(tmp_path / "t.jsonl", N_TOK, N_LAYERS, TOP_K, EXPERTS, seed=5)
    offset, n_seqs = 1, 3
    step = stride or N_TOK // n_seqs  # 2
    with binary_trace(tmp_path / "t.jsonl", EXPERTS) as wprt:
        c = _engine.Context(str(model), {
            "n_threads": 2, "max_sequences": n_seqs, "lookahead": False,
            "route_trace_path": wprt, "route_trace_offset": offset,
            "route_trace_stride": stride,
        })
    try:
        seqs = [None, c.seq_open(), c.seq_open()]
        for lens in ([2, 3, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]):  # a prefill step, decodes
            lg = np.zeros((n_seqs, c.vocab_size), np.float32)
            c.eval_batch(seqs, [np.arange(10, 10 + n, dtype=np.int32) for n in lens], lg)
        c.eval_batch([seqs[1]], [np.array([7], np.int32)], lg[:1])  # alone: unbatched path
        c.hotlist_save(str(tmp_path / "hot"))
    finally:
        c.close()
    lines = (tmp_path / "hot").read_text().splitlines()[1:]
    got = Counter({(int(a), int(b)): int(n) for a, b, n in (ln.split() for ln in lines)})
    want = batch_counts(ids, [0, 1, 2], replay_steps([offset + k * step for k in range(3)]))
    assert got == want
    # the check tells the sequences apart: one cursor for all would read other experts
    assert batch_counts(ids, [0, 1, 2], replay_steps([offset] * 3)) != want


def replay_steps(start: list[int]) -> list[list[tuple[int, int]]]:
    """The (first trace token, rows) of each sequence in each step of the test above."""
    steps = []
    for lens in ([2, 3, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]):
        steps.append([(start[k], lens[k]) for k in range(3)])
        start = [start[k] + lens[k] for k in range(3)]
    return steps + [[(start[1], 1)]]


def test_state_reset_keeps_the_cursor(model: Path, tmp_path: Path) -> None:
    """Each token the context evaluates advances the trace, across resets."""
    ids = write_trace(tmp_path / "t.jsonl", N_TOK, N_LAYERS, TOP_K, EXPERTS, seed=8)
    with Engine.open(model, route_trace=tmp_path / "t.jsonl", route_trace_experts=EXPERTS,
                     lookahead=False) as eng:
        for t in range(3):
            eng.reset()
            eng.eval([20 + t])
        got = hotlist_counts(eng, tmp_path / "hot")
    assert got == expected_counts(ids, [0, 1, 2], [1, 1, 1], 0)


def test_lookahead_prefetches_the_traces_experts(model: Path, tmp_path: Path) -> None:
    write_trace(tmp_path / "t.jsonl", N_TOK, N_LAYERS, TOP_K, EXPERTS)
    with Engine.open(model, route_trace=tmp_path / "t.jsonl", route_trace_experts=EXPERTS,
                     budget="256M") as eng:
        eng.eval([1, 2, 3])
        for t in range(8):
            eng.eval([4 + t])
        st = eng.stats()
    assert st["prefetch_issued"] > 0
    # every speculative read is a traced expert, so each is later looked up
    assert st["prefetch_hits"] == st["prefetch_issued"]


@pytest.mark.parametrize("top_k,experts", [(3, 16), (4, 32)])
def test_mismatched_trace_refused(model: Path, tmp_path: Path, top_k: int,
                                  experts: int) -> None:
    write_trace(tmp_path / "t.jsonl", 3, 2, top_k, experts)
    with pytest.raises(ValueError, match=f"top_k {top_k} of {experts} experts; "
                                         f"the model has top_k 4 of 16"):
        Engine.open(model, route_trace=tmp_path / "t.jsonl", route_trace_experts=experts)


def test_jsonl_reader_refuses_ragged_rows(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"tok": 0, "layers": [[1, 2], [3, 4]]}\n{"tok": 1, "layers": [[1, 2]]}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_jsonl(p)


def test_recorded_traces_read(repo_root: Path) -> None:
    """The recorded traces' shapes, as their README states (when the data folder is there)."""
    data = repo_root.parent / "shared" / "data" / "routing-traces"
    if not data.is_dir():
        pytest.skip(f"the recorded traces are not beside this checkout ({data})")
    ids = read_jsonl(data / "olmoe_299.jsonl")
    assert ids.shape == (299, 16, 8) and int(ids.max()) < 64
