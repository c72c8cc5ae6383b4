"""Container fuzz cases and the worker process that runs them (used by test_fuzz.py).

A case is drawn from (seed, index) alone, so any case can be replayed by number. Each
damages one thing in one of two tiny containers -- the manifest's structure, one hparam,
a routing table, a record header, bank bytes, a tokenizer file or the chat template --
then opens the container, evaluates a prompt and (for side-file cases) renders a chat
through the model's format. The outcome is one of:

  ok          the damaged container still runs (the damage was harmless or unread)
  typed       a WarpError whose detail names the file, tensor or key concerned
  chat        a ChatFormatError: the chat format refuses the damaged template / markers
  unnamed     a WarpError that names none of them (a failure)
  untyped     any other exception (a failure)

Run as a script, the worker reads a JSON job from argv[1] and writes one line per case to
stdout: "B <i>" before case i starts and "R <json>" when it ends, so the parent can name
the case a crash or a hang happened in.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

# Cases of each category per run (>= 10,000 in all). WARP_FUZZ_SHARE (a fraction, 1 by
# default) runs that share of every category: the sanitizer lane runs a slice.
FULL_COUNTS = {"manifest": 2000, "hparams": 2000, "tables": 1000, "records": 1000,
               "banks": 1000, "tokenizer": 2500, "template": 1000}
SHARE = float(os.environ.get("WARP_FUZZ_SHARE", "1"))
COUNTS = {k: max(1, int(n * SHARE)) for k, n in FULL_COUNTS.items()}
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 40, 41, 42, 43]
BAD_VALUES = [None, -1, 0, 1, 2**31 - 1, 2**31, 2**63, 1e30, -0.5, "x", "", [], {}, [1, 2],
              True, 3.5]
JINJA_BITS = ["{%", "%}", "{{", "}}", "{#", "{% endfor %}", "{% if %}", "{% endif %}",
              "{{ messages[7].content }}", "{{ raise_exception('refused') }}",
              "{{ 1 / 0 }}", "{{ 'a' + 1 }}", "{{ messages | tojson }}", "<|im_end|>",
              "<|im_start|>", "\x00", "\udcff", "{% set x = x + 1 %}", "{{ m.role.upper() }}"]


def category_of(i: int) -> str:
    for name, n in COUNTS.items():
        if i < n:
            return name
        i -= n
    raise IndexError(i)


def total() -> int:
    return sum(COUNTS.values())


# ---- JSON helpers ------------------------------------------------------------------------

def _paths(obj: Any, prefix: tuple = ()):
    yield prefix, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _mutate_json(doc: Any, rng: random.Random, paths: list[tuple]) -> tuple[Any, tuple]:
    doc = copy.deepcopy(doc)
    path = rng.choice(paths)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    value = parent[key]
    op = rng.randrange(5)
    if op == 0 and isinstance(parent, dict):
        del parent[key]
    elif op == 1 and isinstance(parent, list):
        del parent[key]
    elif op == 2 and isinstance(value, (int, float)) and not isinstance(value, bool):
        parent[key] = rng.choice([value + 1, value - 1, value * 2, value * 4096, -value,
                                  value + 4096, value // 2, 2**31 - 1, 2**24, 2**32 + value])
    else:
        parent[key] = rng.choice(BAD_VALUES)
    return doc, path


def _bytes_damage(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    op = rng.randrange(4)
    if op == 0 and b:
        return bytes(b[: rng.randrange(len(b))])
    if op == 1 and b:
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if op == 2:
        at = rng.randrange(len(b) + 1)
        return bytes(b[:at]) + rng.choice([b"\xff\xfe", b"{", b"]", b"\x00", b",,"]) + bytes(b[at:])
    return b""


# ---- case drawing ---------------------------------------------------------------------------

class Bases:
    """The pristine bytes and parsed JSON of both containers, read once per worker."""

    def __init__(self, moe: Path, v4: Path) -> None:
        self.dirs = {"moe": moe, "v4": v4}
        self.files = {k: {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
                      for k, d in self.dirs.items()}
        self.manifest = {k: json.loads(f["manifest.json"]) for k, f in self.files.items()}


def draw(bases: Bases, seed: int, i: int) -> dict[str, Any]:
    """Case i: {"cat", "base", "edits": {file: bytes | None}, "names", "verify", "chat"}."""
    rng = random.Random(f"{seed}:{i}")
    cat = category_of(i)
    case: dict[str, Any] = {"cat": cat, "base": "moe", "edits": {}, "names": [],
                            "verify": False, "chat": False, "what": ""}
    getattr(sys.modules[__name__], f"_draw_{cat}")(bases, rng, case)
    return case


def _dump(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def _concerned(base: dict, path: tuple) -> list[str]:
    if path[:2] == ("trunk", "tensors") and len(path) > 2:
        i = path[2]
        return [f"'{base['trunk']['tensors'][i]['name']}'", f"trunk.tensors[{i}]"]
    if path[0] == "experts" and len(path) > 1:
        j = path[1]  # a bank removed whole is refused by the count of banks
        return [f"experts[{j}]", base["experts"][j]["file"]] + (["experts"] if len(path) == 2
                                                                 else [])
    return [k for k in path if isinstance(k, str)] + ["manifest.json"]


def _draw_manifest(b: Bases, rng: random.Random, case: dict) -> None:
    base = b.manifest["moe"]
    if rng.random() < 0.2:
        case["edits"]["manifest.json"] = _bytes_damage(b.files["moe"]["manifest.json"], rng)
        # damage that still parses changes some value: its tensor or key is named
        case["names"] = ["manifest.json", "tensor '", "experts["]
        case["what"] = "manifest bytes"
        return
    paths = [p for p, _ in _paths(base) if p and p[0] not in ("source_config", "hparams")]
    doc, path = _mutate_json(base, rng, paths)
    case["edits"]["manifest.json"] = _dump(doc)
    case["names"] = _concerned(base, path)
    case["chat"] = path[0] in ("chat", "tokenizer")
    case["what"] = "manifest " + ".".join(map(str, path))


def _draw_hparams(b: Bases, rng: random.Random, case: dict) -> None:
    base = b.manifest["moe"]
    paths = [p for p, _ in _paths(base) if len(p) > 1 and p[0] == "hparams"]
    doc, path = _mutate_json(base, rng, paths)
    if rng.random() < 0.3:  # a boundary value instead
        parent = doc["hparams"]
        key = path[1]
        if isinstance(base["hparams"][key], int) and not isinstance(base["hparams"][key], bool):
            parent[key] = rng.choice([0, 1, 2**rng.randrange(8, 34) + rng.choice([-1, 0, 1])])
    case["edits"]["manifest.json"] = _dump(doc)
    # a relation may be refused where the other side shows: a key, a tensor, a bank
    case["names"] = [str(path[1]), "hparams", "tensor '", "experts["]
    case["what"] = "hparams " + ".".join(map(str, path[1:])) + " = " + json.dumps(
        _get(doc, path), default=str)[:40]


def _get(doc: Any, path: tuple) -> Any:
    try:
        for k in path:
            doc = doc[k]
        return doc
    except (KeyError, IndexError, TypeError):
        return "<deleted>"


def _tensor(base: dict, name: str) -> dict:
    return next(t for t in base["trunk"]["tensors"] if t["name"] == name)


def _draw_tables(b: Bases, rng: random.Random, case: dict) -> None:
    from warp_providers.convert.writer import crc32c

    case["base"] = "v4"
    base = b.manifest["v4"]
    hp = base["hparams"]
    if rng.random() < 0.75:  # entries of a hash-routing table
        t = _tensor(base, "blk.0.ffn_hash_ids")
        trunk = bytearray(b.files["v4"][base["trunk"]["file"]])
        ids = np.frombuffer(bytes(trunk[t["offset"]: t["offset"] + t["bytes"]]),
                            np.float32).copy()
        k = hp["top_k"]
        for _ in range(rng.randrange(1, 4)):
            j = rng.randrange(ids.size)
            row = (j // k) * k
            ids[j] = rng.choice([rng.randrange(hp["n_experts"]), hp["n_experts"], -1.0,
                                 2**31 - 1, 0.5, math.nan, math.inf, -math.inf, 1e30,
                                 ids[row + (j - row + 1) % k]])
        raw = ids.astype(np.float32).tobytes()
        trunk[t["offset"]: t["offset"] + t["bytes"]] = raw
        doc = copy.deepcopy(base)
        _tensor(doc, "blk.0.ffn_hash_ids")["crc32c"] = crc32c(raw)
        case["edits"][base["trunk"]["file"]] = bytes(trunk)
        case["edits"]["manifest.json"] = _dump(doc)
        case["names"] = ["'blk.0.ffn_hash_ids'"]
        case["what"] = "hash ids " + ",".join(f"{x:g}" for x in ids[:8])
        return
    keys = [k for k in ("hash_layers", "compress_kinds", "layer_kinds", "attn_kinds")
            if isinstance(hp.get(k), list)]
    paths = [("hparams", k, j) for k in keys for j in range(len(hp[k]))] + \
        [("hparams", k) for k in keys]
    doc, path = _mutate_json(base, rng, paths)
    case["edits"]["manifest.json"] = _dump(doc)
    case["names"] = [path[1], "hparams", "tensor '", "experts["]
    case["what"] = "table " + ".".join(map(str, path[1:]))


def _banks(b: Bases) -> list[dict]:
    return b.manifest["moe"]["experts"]


def _draw_records(b: Bases, rng: random.Random, case: dict) -> None:
    bank = rng.choice(_banks(b))
    data = bytearray(b.files["moe"][bank["file"]])
    rec = bank["record_bytes"]
    byte, bit = rng.randrange(64), 1 << rng.randrange(8)
    for e in range(bank["n_experts"]):  # every record: any lookup meets the damage
        data[e * rec + byte] ^= bit
    case["edits"][bank["file"]] = bytes(data)
    case["names"] = [f"{bank['file']}: layer {bank['layer']} expert "]
    case["what"] = f"record header byte {byte} bit {bit} of {bank['file']}"


def _draw_banks(b: Bases, rng: random.Random, case: dict) -> None:
    bank = rng.choice(_banks(b))
    data = bytearray(b.files["moe"][bank["file"]])
    rec = bank["record_bytes"]
    op = rng.randrange(4)
    case["verify"] = True
    if op == 0:  # payload bytes of every record
        off = 64 + rng.randrange(rec - 64)
        for e in range(bank["n_experts"]):
            data[e * rec + off] ^= 1 << rng.randrange(8)
        case["what"] = f"payload byte {off} of {bank['file']}"
    elif op == 1:
        data = data[: len(data) - rng.choice([1, 64, 4096, rec])]
        case["what"] = f"truncated {bank['file']}"
    elif op == 2:
        data += bytes(rng.choice([1, 4096, rec]))
        case["what"] = f"extended {bank['file']}"
    else:
        data = bytearray(len(data))
        case["what"] = f"zeroed {bank['file']}"
    case["edits"][bank["file"]] = bytes(data)
    case["names"] = [bank["file"]]


def _draw_tokenizer(b: Bases, rng: random.Random, case: dict) -> None:
    case["chat"] = True
    name = "tokenizer.json" if rng.random() < 0.75 else "tokenizer_config.json"
    raw = b.files["moe"][name]
    case["names"] = [name]
    if rng.random() < 0.25:
        case["edits"][name] = _bytes_damage(raw, rng)
        case["what"] = f"{name} bytes"
        return
    doc = json.loads(raw)
    paths = [p for p, _ in _paths(doc) if p]
    if name == "tokenizer.json" and rng.random() < 0.5:  # ids above all
        paths = [p for p in paths if p[-1] == "id" or p[:2] == ("model", "vocab")] or paths
    doc, path = _mutate_json(doc, rng, paths)
    case["edits"][name] = _dump(doc)
    case["what"] = f"{name} " + ".".join(map(str, path))[:80]


def _draw_template(b: Bases, rng: random.Random, case: dict) -> None:
    case["chat"] = True
    case["names"] = ["chat_template"]
    if rng.random() < 0.2:  # the copy inside tokenizer_config.json
        doc = json.loads(b.files["moe"]["tokenizer_config.json"])
        text = str(doc.get("chat_template", ""))
        at = rng.randrange(len(text) + 1)
        doc["chat_template"] = rng.choice([text[:at] + rng.choice(JINJA_BITS) + text[at:], 7,
                                           [{"name": "default"}], ""])
        case["edits"]["tokenizer_config.json"] = json.dumps(doc).encode("utf-8", "surrogatepass")
        case["edits"]["chat_template.jinja"] = None
        case["what"] = "tokenizer_config chat_template"
        return
    raw = b.files["moe"]["chat_template.jinja"]
    if rng.random() < 0.5:
        case["edits"]["chat_template.jinja"] = _bytes_damage(raw, rng)
        case["what"] = "chat_template.jinja bytes"
    else:
        text = raw.decode()
        for _ in range(rng.randrange(1, 3)):
            at = rng.randrange(len(text) + 1)
            text = text[:at] + rng.choice(JINJA_BITS) + text[at:]
        case["edits"]["chat_template.jinja"] = text.encode("utf-8", "surrogatepass")
        case["what"] = "chat_template.jinja fragments"


# ---- running one case ----------------------------------------------------------------------

def run_case(work: dict[str, Path], case: dict[str, Any]) -> dict[str, Any]:
    from warp_providers import Engine, WarpError
    from warp_providers.chat.base import ChatFormatError
    from warp_providers.session import ChatSession

    d = work[case["base"]]
    for name, data in case["edits"].items():
        if data is None:
            (d / name).unlink(missing_ok=True)
        else:
            (d / name).write_bytes(data)
    res = {"cat": case["cat"], "what": case["what"]}
    try:
        with Engine.open(d, threads=1, ctx=64, verify=case["verify"], direct_io=False) as eng:
            logits = eng.eval(PROMPT)
            if not np.all(np.isfinite(logits)) and case["cat"] not in ("tables",):
                res.update(outcome="untyped", error="non-finite logits")
                return res
            if case["chat"]:
                tok = eng.tokenizer
                tok.decode(tok.encode_content("hello <|im_end|> world"))
                ChatSession(eng).prompt_ids([{"role": "user", "content": "hi"}])
        res["outcome"] = "ok"
    except WarpError as e:
        named = any(n in str(e) for n in case["names"])
        res.update(outcome="typed" if named else "unnamed", error=str(e)[:300])
    except ChatFormatError as e:
        res.update(outcome="chat", error=str(e)[:300])
    except Exception as e:  # noqa: BLE001 - every other exception is the failure reported
        res.update(outcome="untyped", error=f"{type(e).__name__}: {e}"[:300])
    return res


def restore(work: dict[str, Path], bases: Bases, case: dict[str, Any]) -> None:
    d = work[case["base"]]
    for name in case["edits"]:
        (d / name).write_bytes(bases.files[case["base"]][name])


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    bases = Bases(Path(job["moe"]), Path(job["v4"]))
    work = {"moe": Path(job["work_moe"]), "v4": Path(job["work_v4"])}
    out = sys.stdout
    for i in range(job["start"], job["stop"]):
        case = draw(bases, job["seed"], i)
        out.write(f"B {i}\n")
        out.flush()
        res = run_case(work, case)
        restore(work, bases, case)
        res["i"] = i
        out.write("R " + json.dumps(res) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
