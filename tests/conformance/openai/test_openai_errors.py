"""Error statuses and OpenAI-shaped bodies (PROTOCOLS.md §7), as the SDK and raw httpx see them."""

from __future__ import annotations

import json

import openai
import pytest
from fake_engine import ScriptedEngine
from openai_cases import USER, WEATHER
from support import has_module, requires


@pytest.fixture
def http():
    from warp_openai import warp_transport

    with warp_transport(engine=ScriptedEngine(["ok"], ctx_tokens=512), http="httpx") as client:
        yield client


def post(http, body, path="/v1/chat/completions"):
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    r = http.post(path, content=content, headers={"content-type": "application/json"})
    return r


def assert_error(r, status, message=None, param=None, code=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-should-retry"] == "false"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if message is not None:
        assert err["message"].startswith(message), err["message"]
    assert err["param"] == param
    assert err["code"] == code
    return err


BAD = [
    (b"", 400, "request body is empty", None),
    (b"{not json", 400, "request body is not valid JSON: ", None),
    (b"\xff\xfe", 400, "request body is not valid JSON: ", None),
    (b"[1, 2]", 400, "request body must be a JSON object", None),
    ({}, 400, "'messages' is a required property", "messages"),
    ({"messages": []}, 400, "'messages' must be a non-empty array", "messages"),
    ({"messages": "hi"}, 400, "'messages' must be a non-empty array", "messages"),
    ({"messages": [1]}, 400, "messages[0] must be an object", "messages[0]"),
    (
        {"messages": [{"role": "bot"}]},
        400,
        "messages[0].role must be one of ['assistant', 'developer', 'system', 'tool', 'user']",
        "messages[0].role",
    ),
    (
        {"messages": [{"role": "user", "content": 5}]},
        400,
        "messages[0].content must be a string, an array, or null",
        "messages[0].content",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        400,
        "messages[0].content[0].text must be a string",
        "messages[0].content[0].text",
    ),
    (
        {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
        400,
        "messages[0].content[0].type must be a non-empty string",
        "messages[0].content[0].type",
    ),
    (
        {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
        400,
        "messages[0].tool_calls is only valid for assistant messages",
        "messages[0].tool_calls",
    ),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": ""}}]}]},
        400,
        "messages[0].tool_calls[0].function.name must be a non-empty string",
        "messages[0].tool_calls[0].function.name",
    ),
    (
        {"messages": [{"role": "user", "content": ["hi"]}]},
        400,
        "messages[0].content[0] must be an object",
        "messages[0].content[0]",
    ),
    (
        {"messages": [{"role": "assistant", "tool_calls": {"function": {"name": "f"}}}]},
        400,
        "messages[0].tool_calls must be an array",
        "messages[0].tool_calls",
    ),
    (
        {"messages": [{"role": "assistant", "tool_calls": ["f"]}]},
        400,
        "messages[0].tool_calls[0] must be an object",
        "messages[0].tool_calls[0]",
    ),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]},
        400,
        "messages[0].tool_calls[0].function must be an object",
        "messages[0].tool_calls[0].function",
    ),
    (
        {"messages": [{"role": "assistant",
                       "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]},
        400,
        "messages[0].tool_calls[0].function.arguments must be an object or JSON string",
        "messages[0].tool_calls[0].function.arguments",
    ),
    ({"messages": USER, "thinking": "yes"}, 400, "'thinking' must be a boolean", "thinking"),
    ({"messages": USER, "top_p": "x"}, 400, "'top_p' must be a number", "top_p"),
    ({"messages": USER, "stream": "yes"}, 400, "'stream' must be a boolean", "stream"),
    ({"messages": USER, "tools": {}}, 400, "'tools' must be an array", "tools"),
    (
        {"messages": USER, "tool_choice": 3},
        400,
        "'tool_choice' must be a string or an object",
        "tool_choice",
    ),
    (
        {"messages": USER, "response_format": "json"},
        400,
        "'response_format' must be an object",
        "response_format",
    ),
    ({"messages": USER, "n": 2}, 400, "'n' must be 1", "n"),
    (
        {"messages": USER, "temperature": "hot"},
        400,
        "'temperature' must be a number",
        "temperature",
    ),
    ({"messages": USER, "temperature": 3}, 400, "'temperature' must be between", "temperature"),
    ({"messages": USER, "top_p": 1.5}, 400, "'top_p' must be between", "top_p"),
    ({"messages": USER, "top_k": -1}, 400, "'top_k' must be a non-negative integer", "top_k"),
    (
        {"messages": USER, "max_tokens": 0},
        400,
        "'max_tokens' must be a positive integer",
        "max_tokens",
    ),
    (
        {"messages": USER, "max_completion_tokens": True},
        400,
        "'max_tokens' must be a positive integer",
        "max_tokens",
    ),
    ({"messages": USER, "seed": 1.5}, 400, "'seed' must be an integer", "seed"),
    (
        {"messages": USER, "stop": [1]},
        400,
        "'stop' must be a string or an array of strings",
        "stop",
    ),
    (
        {"messages": USER, "top_logprobs": 3},
        400,
        "'top_logprobs' > 0 is not supported",
        "top_logprobs",
    ),
    (
        {"messages": USER, "presence_penalty": 5},
        400,
        "'presence_penalty' must be between",
        "presence_penalty",
    ),
    (
        {"messages": USER, "reasoning_effort": 5},
        400,
        "'reasoning_effort' must be a string",
        "reasoning_effort",
    ),
    (
        {"messages": USER, "response_format": {"type": "xml"}},
        400,
        "response_format.type",
        "response_format.type",
    ),
    (
        {
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
            },
        },
        400,
        "response_format.json_schema.schema uses a JSON-schema feature",
        "response_format.json_schema.schema",
    ),
    (
        {
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "string", "format": "no-such-format"},
                },
            },
        },
        400,
        "response_format.json_schema.schema uses a JSON-schema feature",
        "response_format.json_schema.schema",
    ),
    (
        {
            "messages": USER,
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        400,
        "tool_choice names the function `nope`",
        "tool_choice",
    ),
]


@pytest.mark.parametrize("body,status,message,param", BAD)
def test_validation_errors(http, body, status, message, param):
    assert_error(post(http, body), status, message, param)


@pytest.mark.parametrize("body,message,param",
                         [(b, m, p) for b, _, m, p in BAD if isinstance(b, dict) and b])
def test_validation_errors_raise_bad_request_in_the_sdk(make_client, body, message, param):
    """Every refusal above reaches the SDK as `openai.BadRequestError` with its body."""
    client = make_client(ScriptedEngine(["ok"], ctx_tokens=512), max_retries=2)
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/chat/completions", body=body, cast_to=object)
    assert info.value.status_code == 400
    assert info.value.body["message"].startswith(message)
    assert info.value.body["param"] == param


def test_validation_errors_when_streaming_are_plain_json(http):
    r = post(http, {"messages": USER, "stream": True, "temperature": 9})
    assert_error(r, 400, "'temperature' must be between", "temperature")


def test_messages_are_checked_before_options(http):
    assert_error(post(http, {"messages": [], "temperature": 9}), 400, param="messages")


def test_context_overflow(http):
    err = assert_error(
        post(http, {"messages": [{"role": "user", "content": "x" * 600}]}),
        400,
        "prompt is ",
        "messages",
        "context_length_exceeded",
    )
    assert "this model's context is 512" in err["message"]
    err = assert_error(
        post(http, {"prompt": "y" * 600}, "/v1/completions"),
        400,
        "prompt is ",
        "prompt",
        "context_length_exceeded",
    )


def test_routes(http):
    assert_error(http.get("/v1/nothing"), 404, "no route for GET /v1/nothing")
    assert_error(post(http, {}, "/v1/embeddings"), 404, "no route for POST /v1/embeddings")
    err = assert_error(http.get("/v1/models/gpt-4"), 404, "no such model: gpt-4", "model")
    assert err["type"] == "not_found_error"
    assert http.get("/v1/models/").json()["object"] == "list"
    assert http.get("/v1/models?x=1").status_code == 200


def test_completions_prompt_errors(http):
    assert_error(
        post(http, {"prompt": 3}, "/v1/completions"), 400, "'prompt' must be a string", "prompt"
    )
    assert_error(
        post(http, {"prompt": ""}, "/v1/completions"),
        400,
        "'prompt' must be a non-empty string",
        "prompt",
    )


def test_no_chat_format():
    from warp_openai import WarpAPI

    class Bare(ScriptedEngine):
        def chat_metadata(self):
            return {"format": None, "template": None}

    api = WarpAPI(engine=Bare(["raw"]))
    status, body = api.handle("POST", "/v1/chat/completions", {"messages": USER, "stream": True})
    assert status == 400 and body["error"]["code"] == "unsupported_chat_format"
    assert body["error"]["param"] == "model"
    status, body = api.handle("POST", "/v1/completions", {"prompt": "go"})
    assert status == 200 and body["choices"][0]["text"] == "raw"


def test_engine_failure_is_500():
    from warp_openai import WarpAPI

    from warp_providers import EngineIOError

    class Broken(ScriptedEngine):
        def stream(self, prompt, **kw):
            raise EngineIOError("expert 3 of layer 2: short read")
            yield

    api = WarpAPI(engine=Broken())
    status, body = api.handle("POST", "/v1/chat/completions", {"messages": USER})
    assert status == 500 and body["error"] == {
        "message": "expert 3 of layer 2: short read",
        "type": "engine_error",
        "param": None,
        "code": None,
    }


def test_auth():
    from warp_openai import WarpAPI

    api = WarpAPI(engine=ScriptedEngine(), api_key="s3cret")
    assert api.handle("GET", "/health")[0] == 200
    assert api.handle("GET", "/v1/models")[0] == 401
    status, body = api.handle("POST", "/v1/nowhere", b"{}")
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert api.handle("GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert api.handle("GET", "/v1/models", headers={"Authorization": "bearer s3cret"})[0] == 401


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.mark.parametrize("parts,message,param,code", [
    ([IMAGE], "this model was loaded without a vision tower", None, "vision_disabled"),
    ([{"type": "text", "text": "what is this?"}, {"type": "image", "image": "cat.png"}],
     "this model was loaded without a vision tower", None, "vision_disabled"),
    ([{"type": "image_url", "image_url": {"url": ""}}], "messages[0].content[0] is an image "
     "with no url", "messages[0].content[0]", None),
    ([{"type": "text", "text": "a"}, {"type": "image"}], "messages[0].content[1] is an image "
     "with no url", "messages[0].content[1]", None),
])
def test_images_are_refused_by_rule(http, make_client, parts, message, param, code):
    """§7.8: an image part without a reference is named; any image meets the missing tower."""
    body = {"messages": [{"role": "user", "content": parts}]}
    assert_error(post(http, body), 400, message, param, code)
    with pytest.raises(openai.BadRequestError) as info:
        make_client(ScriptedEngine()).chat.completions.create(model="m", **body)
    assert info.value.code == code


def test_keys_are_compared_in_constant_time(monkeypatch):
    """Every key check, right or wrong scheme, goes through `hmac.compare_digest`."""
    import hmac

    from warp_openai import WarpAPI, api as core

    seen = []
    real = hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(core.hmac, "compare_digest", spy)
    api = WarpAPI(engine=ScriptedEngine(), api_key="s3cret")
    for header, ok in [("Bearer s3cret", True), ("Bearer s3cre", False), ("Basic s3cret", False),
                       ("", False)]:
        status = api.handle("GET", "/v1/models", headers={"Authorization": header})[0]
        assert status == (200 if ok else 401)
    assert len(seen) == 4 and all(b == b"s3cret" for _, b in seen)
    assert core.bearer_matches("Bearer s3cret", "s3cret") and not core.bearer_matches(
        "Bearer s3cret ", "s3cret")


@pytest.mark.parametrize(
    "body,exc",
    [
        ({"messages": USER, "n": 3}, openai.BadRequestError),
        (
            {
                "messages": USER,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}},
                },
            },
            openai.BadRequestError,
        ),
    ],
)
def test_sdk_exception_classes(make_client, body, exc):
    client = make_client(ScriptedEngine(), max_retries=2)
    with pytest.raises(exc) as info:
        client.chat.completions.create(model="m", **body)
    assert info.value.status_code == 400
    assert info.value.body["param"] in ("n", "response_format.json_schema.schema")


def test_sdk_not_found_and_no_retry(make_client):
    engine = ScriptedEngine()
    client = make_client(engine, max_retries=3)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")
    calls = len(engine.calls)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x" * 9000}]
        )
    assert len(engine.calls) == calls  # refused before the engine, and not retried


def test_fuzz_never_5xx():
    requires(has_module("hypothesis"), "hypothesis (property-based fuzzing)")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from warp_openai import ChunkStream, WarpAPI

    api = WarpAPI(engine=ScriptedEngine(["ok"], ctx_tokens=4096))
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-3, 3)
        | st.floats(allow_nan=False)
        | st.text(max_size=8)
    )
    values = st.recursive(
        scalars,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
        max_leaves=8,
    )
    keys = st.sampled_from(
        [
            "messages",
            "tools",
            "tool_choice",
            "response_format",
            "stream",
            "n",
            "temperature",
            "top_p",
            "top_k",
            "max_tokens",
            "stop",
            "seed",
            "stream_options",
            "logprobs",
            "reasoning_effort",
            "thinking",
            "parallel_tool_calls",
            "min_p",
            "prompt",
            "thinking_effort",
            "reasoning",
            "max_completion_tokens",
            "presence_penalty",
            "frequency_penalty",
            "top_logprobs",
        ]
    )
    part = st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url", "image", "input_text", ""])},
        optional={"text": values, "image_url": values, "image": values},
    )
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"])},
        optional={"content": values | st.lists(part, max_size=3), "tool_calls": values,
                  "name": values},
    )
    bodies = (
        st.dictionaries(keys, values, max_size=5)
        | st.builds(
            lambda m, extra: {"messages": m, **extra},
            st.lists(message, max_size=3),
            st.dictionaries(keys, values, max_size=3),
        )
        | st.binary(max_size=20)
    )

    routes = st.sampled_from(["/v1/chat/completions", "/v1/chat/completions", "/v1/completions"])

    @settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
    @given(bodies, routes)
    def check(body, route):
        status, out = api.handle("POST", route, body)
        assert status < 500, out
        if isinstance(out, ChunkStream):
            for _ in out:
                pass
        else:
            assert set(out) >= ({"error"} if status >= 400 else {"choices"})
            if status >= 400:
                assert set(out["error"]) == {"message", "type", "param", "code"}

    check()


# --------------------------------------------------------------------------- hostile bodies
HOSTILE = [
    # (route, raw body, status, param, code, message start)
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800"}]}', 400,
     "messages[0].content", "invalid_unicode", "messages[0].content holds a lone UTF-16"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi", "\\udfff": 1}]}',
     400, "messages[0].\\udfff", "invalid_unicode", "messages[0].\\udfff holds a lone"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "tools": '
     b'[{"type": "function", "function": {"name": "f\\udbff"}}]}', 400,
     "tools[0].function.name", "invalid_unicode", "tools[0].function.name holds"),
    ("/v1/completions", b'{"prompt": "\\udc00x"}', 400, "prompt", "invalid_unicode",
     "prompt holds a lone UTF-16 surrogate (U+DC00) at character 0"),
    ("/v1/completions", b'{"prompt": ["\\ud83d\\ude00 ok"], "max_tokens": 2}', 200, None, None,
     None),  # a surrogate pair is one character: accepted
    ("/v1/chat/completions", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400,
     None, None, "request body nests deeper than 64 levels"),
    ("/v1/completions", b'{"prompt": "x", "a": ' + b'{"a":' * 70 + b"1" + b"}" * 70 + b"}", 400,
     "a" + ".a" * 63, None, "a" + ".a" * 63 + " nests deeper than 64 levels"),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400, None, None,
     "request body is not valid JSON: NaN is not a JSON value"),
    ("/v1/completions", b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}", 400, None, None,
     "request body is not valid JSON"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "stop": '
     + json.dumps([str(i) for i in range(17)]).encode() + b"}", 400, "stop", None,
     "'stop' may hold at most 16 strings"),
]


@pytest.mark.parametrize("route,raw,status,param,code,message", HOSTILE)
def test_hostile_bodies_are_named_4xx(http, route, raw, status, param, code, message):
    r = post(http, raw, path=route)
    if status == 200:
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"
        return
    err = assert_error(r, status, message, param, code)
    assert err["type"] == "invalid_request_error"


def test_oversized_fields_are_named():
    from warp_openai import WarpAPI
    from warp_openai.api import MAX_ARRAY_ITEMS, MAX_STRING_CHARS

    api = WarpAPI(engine=ScriptedEngine(["ok"]))
    long = {"messages": [{"role": "user", "content": "x" * (MAX_STRING_CHARS + 1)}]}
    status, body = api.handle("POST", "/v1/chat/completions", long)
    assert status == 400 and body["error"]["param"] == "messages[0].content"
    assert body["error"]["code"] == "string_above_max_length"
    many = {"prompt": "x", "logit_bias": [0] * (MAX_ARRAY_ITEMS + 1)}
    status, body = api.handle("POST", "/v1/completions", many)
    assert status == 400 and body["error"]["param"] == "logit_bias"
    assert body["error"]["code"] == "array_above_max_length"
    status, body = api.handle("POST", "/v1/completions", b"x" * (api.max_body + 1))
    assert status == 413 and body["error"]["message"].startswith("request body may not exceed")
