"""Trunk tensors are written a chunk of rows at a time, never held whole: a real K3's
embedding alone is 2.3 GB in bf16, so holding it would put conversion's peak RAM at the
size of the largest trunk tensor instead of a bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from warp_providers.convert import ConvertError, convert, writer
from warp_providers.synth import MoeShape, make_moe_checkpoint

SHAPE = MoeShape(hidden_size=64, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16)


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_moe_checkpoint(tmp_path_factory.mktemp("trunk") / "hf", SHAPE, seed=3)


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


@pytest.mark.parametrize("trunk", ["q8_0", "f16"])  # encoded rows, and raw bytes copied
def test_trunk_tensors_are_written_in_row_chunks_with_the_same_bytes(
        src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trunk: str) -> None:
    whole = convert(src, tmp_path / "whole.warp", trunk=trunk, embedding=trunk)
    pieces: dict[str, list[int]] = {}
    real = writer.ContainerWriter.add_trunk_chunks

    def spy(self, name, dtype, shape, chunks):  # type: ignore[no-untyped-def]
        def seen():
            for c in chunks:
                pieces.setdefault(name, []).append(np.asarray(c).nbytes)
                yield c
        return real(self, name, dtype, shape, seen())

    monkeypatch.setattr(writer.ContainerWriter, "add_trunk_chunks", spy)
    monkeypatch.setattr(writer, "_ROW_CHUNK_ELEMS", 64 * 8)  # 8 rows of the embedding
    small = convert(src, tmp_path / "small.warp", trunk=trunk, embedding=trunk)
    emb = pieces["token_embd.weight"]
    assert len(emb) > 8 and max(emb) <= 8 * 64 * 2, emb[:4]
    assert _files(Path(small)) == _files(Path(whole))


def test_a_trunk_tensor_of_the_wrong_length_is_refused_naming_it(tmp_path: Path) -> None:
    with writer.ContainerWriter(tmp_path / "c.warp") as w:
        with pytest.raises(ConvertError, match=r"'t'.*needs 64"):
            w.add_trunk_chunks("t", "f32", (16,), [np.zeros(8, np.float32)])
        with pytest.raises(ConvertError, match=r"'u'.*more than that.*needs 64"):
            w.add_trunk_chunks("u", "f32", (16,), [np.zeros(12, np.float32)] * 2)
        w.abort()
