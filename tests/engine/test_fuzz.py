"""Structure-aware fuzzing of containers through the Python API (>= 2000 mutations).

Every mutation of the manifest, of a record header or of a file's length must end in a
typed error (a `WarpError`, never a bare ValueError) whose message names the file, tensor,
record or key concerned — or, for a harmless mutation, in a model that still evaluates.
None may crash the interpreter.
"""

from __future__ import annotations

import copy
import json
import random
import re
import shutil
from pathlib import Path

import pytest

from tiny import tiny_moe
from warp_providers import Engine, ModelFormatError, WarpError
from warp_providers.synth import MoeShape

N_MANIFEST = 1800
N_RECORD = 200  # with the manifest cases: >= 2000 mutations per run
SMALL = MoeShape(hidden_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=16)
BAD_VALUES = [None, -1, 0, 1, 2**31, 2**63, 1e30, -0.5, "x", "", [], {}, [1, 2], True, 3.5]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_moe(tmp_path_factory.mktemp("fuzz"), shape=SMALL)


def _paths(obj, prefix=()):
    """Every (path, value) in a JSON document."""
    yield prefix, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _mutate(doc, rng: random.Random):
    doc = copy.deepcopy(doc)
    paths = [p for p, _ in _paths(doc) if p and p[0] != "source_config"]
    path = rng.choice(paths)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    value = parent[key]
    op = rng.randrange(4)
    if op == 0 and isinstance(parent, dict):
        del parent[key]
    elif op == 1 and isinstance(value, (int, float)) and not isinstance(value, bool):
        parent[key] = rng.choice([value + 1, value - 1, value * 2, value * 4096, -value,
                                  value + 4096, value // 2])
    else:
        parent[key] = rng.choice(BAD_VALUES)
    return doc, path


def _concerned(base, path) -> list[str]:
    """Names a refusal of a mutation at path may use for what it touches (any one will do)."""
    if path[:2] == ("trunk", "tensors") and len(path) > 2:
        i = path[2]
        return [f"'{base['trunk']['tensors'][i]['name']}'", f"trunk.tensors[{i}]"]
    if path[0] == "experts" and len(path) > 1:
        j = path[1]
        return [f"experts[{j}]", base["experts"][j]["file"]]
    return [k for k in path if isinstance(k, str)]


def _check(path: Path, names: list[str]) -> str:
    """'error' for a typed refusal naming one of names, 'ok' for a model that still runs."""
    try:
        with Engine.open(path, threads=1, ctx=64) as eng:
            eng.eval([1, 2, 3, 4, 5, 6, 7, 8])
            return "ok"
    except WarpError as e:  # anything else (a bare ValueError, a crash) fails the test
        assert any(n in str(e) for n in names), f"{str(e)!r} names none of {names}"
        return "error"


def test_manifest_mutations(model, tmp_path):
    base = json.loads((model / "manifest.json").read_text())
    work = tmp_path / "m.warp"
    shutil.copytree(model, work)
    rng = random.Random(1234)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(N_MANIFEST):
        doc, where = _mutate(base, rng)
        (work / "manifest.json").write_text(json.dumps(doc))
        outcomes[_check(work, _concerned(base, where))] += 1
    assert outcomes["error"] >= N_MANIFEST // 2, outcomes  # most mutations must be caught


def test_missing_required_tensor_is_named(model, tmp_path):
    base = json.loads((model / "manifest.json").read_text())
    work = tmp_path / "t.warp"
    shutil.copytree(model, work)
    names = [t["name"] for t in base["trunk"]["tensors"]]
    assert "blk.1.attn_k_norm.weight" in names and "output.weight" in names
    for i, name in enumerate(names):  # qwen3_moe, untied: every trunk tensor is required
        doc = copy.deepcopy(base)
        del doc["trunk"]["tensors"][i]
        (work / "manifest.json").write_text(json.dumps(doc))
        with pytest.raises(ModelFormatError, match=re.escape(f"'{name}' is missing")):
            with Engine.open(work, threads=1) as eng:
                eng.eval([1, 2, 3])


def test_structural_damage_is_named(model, tmp_path):
    work = tmp_path / "d.warp"
    cases = []
    manifest = json.loads((model / "manifest.json").read_text())
    bank = manifest["experts"][0]
    cases.append(("truncated trunk", "trunk.bin", lambda b: b[: len(b) // 2], "trunk"))
    cases.append(("truncated bank", bank["file"], lambda b: b[:-4096], bank["file"]))
    cases.append(("empty manifest", "manifest.json", lambda b: b"", "manifest"))
    cases.append(("not json", "manifest.json", lambda b: b"{\"format\": ", "manifest"))
    cases.append(("version", "manifest.json",
                  lambda b: b.replace(b'"format_version": 1', b'"format_version": 2'),
                  "format_version"))
    for label, name, fn, needle in cases:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(model, work)
        f = work / name
        f.write_bytes(fn(f.read_bytes()))
        with pytest.raises(WarpError) as e:
            with Engine.open(work, threads=1) as eng:
                eng.eval([1, 2, 3])
        assert needle in str(e.value), (label, str(e.value))
    shutil.rmtree(work)
    shutil.copytree(model, work)
    (work / "trunk.bin").unlink()
    with pytest.raises(WarpError, match="trunk.bin"):
        Engine.open(work)


def test_record_header_mutations(model, tmp_path):
    manifest = json.loads((model / "manifest.json").read_text())
    work = tmp_path / "r.warp"
    shutil.copytree(model, work)
    rng = random.Random(99)
    caught = 0
    for i in range(N_RECORD):
        bank = rng.choice(manifest["experts"])
        f = work / bank["file"]
        pristine = (model / bank["file"]).read_bytes()
        data = bytearray(pristine)
        rec = bank["record_bytes"]
        byte = rng.randrange(64)          # inside the 64-byte header
        bit = 1 << rng.randrange(8)
        for e in range(bank["n_experts"]):  # every record: any lookup meets the damage
            data[e * rec + byte] ^= bit
        f.write_bytes(bytes(data))
        try:
            with Engine.open(work, threads=1, verify=False) as eng:
                eng.eval(list(range(10, 42)))
        except WarpError as e:  # the file and the record: its layer and an expert id
            assert re.search(rf"{bank['file']}: layer {bank['layer']} expert \d+: ", str(e)), e
            caught += 1
        f.write_bytes(pristine)
    assert caught == N_RECORD  # every header bit is validated (header CRC covers the rest)

