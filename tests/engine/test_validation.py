"""Validation at open: every hparam and table the forward pass trusts is checked.

Each case takes a container that opens and runs, changes one hparam (or one entry of a
routing table) to a value the engine cannot run, and asserts that `Engine.open` refuses
it with a `ModelFormatError` whose detail names the key or tensor. The values sit just
outside each bound (and on the wrong side of each relation between keys), so a check
that drifted or was dropped lets the case open.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tiny import tiny_moe
from warp_providers import Engine, ModelFormatError
from warp_providers.convert.writer import crc32c
from warp_providers.synth import MoeShape

# qwen3_moe: 4 heads over 2 kv heads of 16, 8 experts, top-2, vocab from the byte tokenizer
SHAPE = MoeShape(hidden_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_moe(tmp_path_factory.mktemp("validate"), shape=SHAPE, experts="f32",
                    trunk="f32")


def _open_with(model: Path, work: Path, edit) -> None:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(model, work)
    doc = json.loads((work / "manifest.json").read_text())
    edit(doc)
    (work / "manifest.json").write_text(json.dumps(doc))
    with Engine.open(work, threads=1, ctx=32) as eng:
        eng.eval([1, 2, 3])


def _set(key, value):
    def edit(doc):
        doc["hparams"][key] = value
    return edit


def test_the_unmutated_container_runs(model, tmp_path):
    _open_with(model, tmp_path / "w", lambda doc: None)


def _bounds_cases(hp: dict) -> list[tuple[str, object]]:
    v, e = hp["vocab_size"], hp["n_experts"]
    return [
        ("vocab_size", 0), ("vocab_size", 2**24 + 1),
        ("hidden_size", 0), ("hidden_size", 2**17 + 1),
        ("n_heads", 0), ("n_heads", 4097),
        ("n_kv_heads", 0), ("n_kv_heads", 3),            # 4 heads: not a divisor
        ("n_kv_heads", 8),                               # more kv heads than heads
        ("head_dim", 0), ("head_dim", 4097),
        ("n_experts", 2**16 + 1),
        ("top_k", 0), ("top_k", e + 1),                  # top_k <= n_experts
        ("rope_dim", 15), ("rope_dim", 18),              # even, <= head_dim 16
        ("max_position_embeddings", 0), ("max_position_embeddings", 2**30 + 1),
        ("intermediate_size", 2**20 + 1), ("moe_intermediate_size", 0),
        ("shared_expert_intermediate_size", 2**20 + 1),
        ("rms_norm_eps", 0.0), ("rms_norm_eps", 1.0),
        ("rope_theta", 0.0), ("attn_scale", 0.0), ("rope_attn_factor", -1.0),
        ("clip_qkv", -1.0),
        ("bos_token_id", v), ("bos_token_id", -2),
        ("eos_token_ids", [v]), ("eos_token_ids", [2**31 - 1]),
        ("eos_token_ids", [0] * 17),
        ("qk_norm", "rms"),
        ("shared_expert_gate", True),                    # a gate without a shared expert
        ("layer_kinds", ["moe"]),                        # n_layers is 2
        ("layer_kinds", ["dense", "moe"]),               # dense, intermediate_size 0
        ("n_experts", 0),                                # moe layers without experts
        ("n_layers", 1025),
    ]


def test_every_bound_is_refused_naming_the_key(model, tmp_path):
    hp = json.loads((model / "manifest.json").read_text())["hparams"]
    assert hp["n_heads"] == 4 and hp["n_kv_heads"] == 2 and hp["head_dim"] == 16
    assert hp["intermediate_size"] == 0 and hp["layer_kinds"] == ["moe", "moe"]
    cases = _bounds_cases(hp)
    for key, value in cases:
        with pytest.raises(ModelFormatError) as exc:
            _open_with(model, tmp_path / "w", _set(key, value))
        # a relation (layer_kinds vs n_layers or FFN sizes, top_k vs n_experts) may name either side
        names = {"n_layers": ["layer_kinds"], "layer_kinds": ["layer_kinds", "intermediate_size"],
                 "n_experts": ["top_k"]}
        assert any(f"hparams.{k}" in str(exc.value) for k in [key, *names.get(key, [])]), (
            key, value, str(exc.value))


def test_routing_group_relations_are_refused(model, tmp_path):
    """n_group must divide n_experts into groups of two or more, topk_group <= n_group,
    and the chosen groups must hold top_k experts."""
    cases = [
        ({"n_group": 3, "topk_group": 1}, "n_group"),   # 8 experts in 3 groups
        ({"n_group": 8, "topk_group": 1}, "n_group"),   # groups of one
        ({"n_group": 4, "topk_group": 5}, "topk_group"),
        ({"n_group": 4, "topk_group": 0}, "topk_group"),
        ({"n_group": 1, "topk_group": 2}, "topk_group"),
        ({"n_group": 4, "topk_group": 1, "top_k": 3}, "topk_group"),  # 2 experts < top-3
    ]
    for keys, named in cases:
        with pytest.raises(ModelFormatError, match=rf"hparams\.{named}"):
            _open_with(model, tmp_path / "w", lambda doc, k=keys: doc["hparams"].update(k))


def _rewrite_tensor(work: Path, name: str, fn) -> None:
    """Applies fn to the f32 values of trunk tensor name, fixing its checksum."""
    doc = json.loads((work / "manifest.json").read_text())
    t = next(t for t in doc["trunk"]["tensors"] if t["name"] == name)
    blob = bytearray((work / doc["trunk"]["file"]).read_bytes())
    vals = np.frombuffer(bytes(blob[t["offset"]: t["offset"] + t["bytes"]]), np.float32).copy()
    vals = fn(vals)
    raw = vals.astype(np.float32).tobytes()
    blob[t["offset"]: t["offset"] + t["bytes"]] = raw
    t["crc32c"] = crc32c(raw)
    (work / doc["trunk"]["file"]).write_bytes(bytes(blob))
    (work / "manifest.json").write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def hash_model(tmp_path_factory) -> Path:
    from warp_providers.convert import convert
    from warp_providers.synth import DeepseekV4Shape, make_deepseek_v4_checkpoint

    root = tmp_path_factory.mktemp("hash")
    shape = DeepseekV4Shape(
        hidden_size=32, num_hidden_layers=2, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, num_attention_heads=2, head_dim=32, q_lora_rank=16,
        qk_rope_head_dim=8, o_groups=2, o_lora_rank=8, index_n_heads=2, index_head_dim=16,
        index_topk=2, compress_rate_csa=4, compress_rate_hca=8, sliding_window=8,
        hc_mult=2, num_hash_layers=1)
    src = make_deepseek_v4_checkpoint(root / "hf", shape, seed=5)
    return convert(src, root / "v4.warp", experts="f32", trunk="f32")


def test_hash_routing_ids_out_of_range_are_refused_naming_the_table(hash_model, tmp_path):
    work = tmp_path / "h"
    shutil.copytree(hash_model, work)
    with Engine.open(work, threads=1, ctx=32) as eng:  # the pristine table runs
        eng.eval([1, 2, 3])
    bad = [8.0, -1.0, float(2**31 - 1), 0.5, float("nan"), float("inf")]
    for value in bad:
        shutil.rmtree(work)
        shutil.copytree(hash_model, work)

        def put(v, x=value):
            v[5] = x
            return v

        _rewrite_tensor(work, "blk.0.ffn_hash_ids", put)
        with pytest.raises(ModelFormatError, match=r"'blk\.0\.ffn_hash_ids'"):
            with Engine.open(work, threads=1, ctx=32) as eng:
                eng.eval([1, 2, 3])


def test_hash_routing_table_shape_is_checked(hash_model, tmp_path):
    work = tmp_path / "s"
    shutil.copytree(hash_model, work)
    doc = json.loads((work / "manifest.json").read_text())
    doc["hparams"]["hash_layers"] = [True, True]  # layer 1 has no table
    (work / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match=r"blk\.1\.ffn_hash_ids"):
        Engine.open(work, threads=1, ctx=32)


def test_damaged_chat_side_files_are_named(model, tmp_path):
    """The template the manifest names, and the manifest's chat entry, are read by the
    chat layer after open: damage there is a ModelFormatError naming the file or key."""
    from warp_providers.session import ChatSession

    work = tmp_path / "c"
    for name, data, named in [
        ("chat_template.jinja", b"\xff\xfe{{", "chat_template.jinja"),
        ("chat_template.jinja", b"{% for m in messages %}", "chat_template.jinja"),
        ("manifest.json", None, "manifest.json: chat"),
    ]:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(model, work)
        if data is None:
            doc = json.loads((work / name).read_text())
            doc["chat"] = ["chat_template.jinja"]
            data = json.dumps(doc).encode()
        (work / name).write_bytes(data)
        with Engine.open(work, threads=1, ctx=32) as eng:
            with pytest.raises(ModelFormatError, match=named):
                ChatSession(eng)
