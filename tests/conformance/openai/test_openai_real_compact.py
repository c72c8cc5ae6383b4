"""Compact constrained JSON on SmolLM2 at temperature 1: every seed parses and validates.

Schema-constrained output and forced tool arguments allow no free whitespace between JSON
tokens (`constrain.py`: one fixed layout, `, ` between items and `: ` after keys), so a
trained model that likes newlines cannot spend its budget on them: with free whitespace,
SmolLM2 at temperature 1 wrote runs of newlines inside the object until `max_tokens` cut
it. Every string in the schemas is length-bounded, so
`MAX_TOKENS` bounds the longest compact reply.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

SEEDS = range(20)
MAX_TOKENS = 96
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
        "coastal": {"type": "boolean"},
        "sights": {"type": "array", "items": {"type": "string", "maxLength": 12},
                   "maxItems": 2},
    },
    "required": ["city", "population", "coastal", "sights"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe Lisbon as JSON with its population, whether it "
        "is on the coast, and two sights."}]


def _outside_strings(text: str) -> str:
    """The characters of a JSON text that are not inside a string literal."""
    out, in_string, escaped = [], False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        else:
            out.append(ch)
    return "".join(out)


@pytest.fixture(scope="module")
def client(smol_path):
    from warp_openai import warp_openai_client

    c = warp_openai_client(smol_path)
    yield c
    c.close()


def test_compact_json_schema_replies_validate_at_temperature_one(client):
    import jsonschema

    for seed in SEEDS:
        r = client.chat.completions.create(
            model="smollm2", messages=ASK, temperature=1.0, seed=seed, max_tokens=MAX_TOKENS,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}},
        )
        choice = r.choices[0]
        text = choice.message.content
        assert choice.finish_reason == "stop", f"seed {seed}: cut at {MAX_TOKENS}: {text!r}"
        jsonschema.validate(json.loads(text), SCHEMA)
        skeleton = _outside_strings(text)
        # the only whitespace outside strings: one space after each separator
        assert "\n" not in text and "  " not in skeleton, f"seed {seed}: {text!r}"
        bare = skeleton.replace(", ", "").replace(": ", "")
        assert not any(ch.isspace() for ch in bare), f"seed {seed}: {text!r}"
        assert "," not in bare and ":" not in bare, f"seed {seed}: separators in {text!r}"
