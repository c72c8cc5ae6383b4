"""Constrained output on the real engine: a random tiny MoE at temperature 1, 100% valid.

A random model has no idea of JSON; every reply that parses and validates does so because
constrained decoding (llguidance, through the real engine's sampler) allowed nothing else.
The schemas (tests/json_schemas.py) cover nested objects, arrays, enums, numeric bounds,
required and optional keys, $defs, anyOf/oneOf, patterns and formats. The model has no
<think> token, so a reply is the constrained answer alone (see openai_cases.py).
"""

from __future__ import annotations

import json

import pytest
from json_schemas import SCHEMAS

pytestmark = pytest.mark.slow

SEEDS = range(3)
ASK = [{"role": "user", "content": "Answer in JSON."}]


@pytest.fixture(scope="module")
def client(moe_path):
    from warp_openai import warp_openai_client

    c = warp_openai_client(moe_path)
    yield c
    c.close()


def test_at_least_twenty_schemas():
    assert len(SCHEMAS) >= 20


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_json_schema_replies_validate(client, index):
    import jsonschema

    schema = SCHEMAS[index]
    for seed in SEEDS:
        r = client.chat.completions.create(
            model="random-tools",
            messages=ASK,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": f"s{index}", "schema": schema, "strict": True},
            },
            temperature=1.0,
            seed=seed,
            max_tokens=3500,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop", f"seed {seed}: cut at {r.usage.completion_tokens}"
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_replies_parse(client):
    for seed in SEEDS:
        r = client.chat.completions.create(
            model="random-tools",
            messages=ASK,
            response_format={"type": "json_object"},
            temperature=1.0,
            seed=seed,
            extra_body={"top_k": 8},  # an open object: keep the random reply short
            max_tokens=3500,
        )
        assert r.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(r.choices[0].message.content), dict)


TOOLS = [
    {"type": "function", "function": {"name": f"tool{i}", "parameters": SCHEMAS[i]}}
    for i in (2, 8, 13, 19)  # 13 has $defs/$ref, as pydantic writes nested models
]


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_call_arguments_validate(client, choice):
    import jsonschema

    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for seed in SEEDS:
        name = TOOLS[seed % len(TOOLS)]["function"]["name"]
        tool_choice = (
            "required" if choice == "required" else {"type": "function", "function": {"name": name}}
        )
        r = client.chat.completions.create(
            model="random-tools",
            messages=ASK,
            tools=TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=choice == "required",
            temperature=1.0,
            seed=seed,
            max_tokens=3500,
        )
        assert r.choices[0].finish_reason == "tool_calls"
        calls = r.choices[0].message.tool_calls
        assert calls and r.choices[0].message.content is None
        assert choice == "required" or len(calls) == 1
        for call in calls:
            assert choice == "required" or call.function.name == name
            jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])
