"""The Responses API (/v1/responses) as a translation over the chat completions core.

Owns: the meaning of a Responses request (input as a string or a list of items: messages,
`function_call` and `function_call_output` items for tool loops, reasoning items;
`instructions`, function `tools`, `tool_choice`, `text.format`, `reasoning`,
`max_output_tokens`, sampling knobs, `previous_response_id`, `store`, `stream`), its
translation to a chat completions request answered by `WarpAPI.chat_completions` (so
rendering, constrained decoding, reasoning and tool parsing are the chat core's), the
Response object and the typed stream events built from the chat stream (the blocking
response is a fold over the same events), and the per-process store of finished
responses (bounded, least recently used evicted first) behind GET/DELETE
/v1/responses/{id} and GET /v1/responses/{id}/input_items.
Refuses: tools other than functions, `background`, image and file inputs, unknown item
types; each a 400 naming its field. Knows nothing of HTTP: `transport.py` and
`server.py` frame what `route` returns, as they do for chat completions.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from warp_openai.api import APIError, ChunkStream
from warp_providers import ChatFormatError

__all__ = ["DEFAULT_STORE_SIZE", "Responses"]

DEFAULT_STORE_SIZE = 256
"""Stored responses kept per process; the least recently used is evicted first."""
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_PARAM_MAP = {"messages": "input", "max_tokens": "max_output_tokens",
              "response_format": "text.format", "reasoning_effort": "reasoning.effort"}


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(24)


@dataclass
class _Stored:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    history: list[dict[str, Any]]  # chat messages: earlier turns, this input, this output


@dataclass
class _Request:
    chat: dict[str, Any]
    history: list[dict[str, Any]]
    input_items: list[dict[str, Any]]
    echo: dict[str, Any]
    store: bool
    stream: bool


class Responses:
    """The /v1/responses routes over one `WarpAPI`."""

    def __init__(self, api: Any, *, store_size: int = DEFAULT_STORE_SIZE) -> None:
        """Serve Responses requests through `api.chat_completions`.

        Args:
            api: the `WarpAPI` whose chat core answers.
            store_size: responses kept for `previous_response_id` and GET.

        """
        self.api = api
        self.store_size = store_size
        self._store: OrderedDict[str, _Stored] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ routing
    def route(self, method: str, path: str, body: Any,
              should_stop: Callable[[], bool] | None) -> tuple[int, dict[str, Any] | ChunkStream]:
        """Answers /v1/responses and /v1/responses/{id}[/input_items]."""
        from warp_openai.api import _parse

        rest = path[len("/v1/responses"):].strip("/")
        if not rest:
            if method != "POST":
                raise APIError(404, f"no route for {method} {path}")
            return self.create(_parse(body, self.api.max_body), should_stop=should_stop)
        parts = rest.split("/")
        if len(parts) == 1 and method == "GET":
            return 200, self._get(parts[0]).response
        if len(parts) == 1 and method == "DELETE":
            with self._lock:
                found = self._store.pop(parts[0], None)
            if found is None:
                raise self._missing(parts[0])
            return 200, {"id": parts[0], "object": "response", "deleted": True}
        if len(parts) == 2 and parts[1] == "input_items" and method == "GET":
            items = self._get(parts[0]).input_items
            return 200, {"object": "list", "data": items[::-1],
                         "first_id": items[-1]["id"] if items else None,
                         "last_id": items[0]["id"] if items else None, "has_more": False}
        raise APIError(404, f"no route for {method} {path}")

    def _missing(self, ident: str) -> APIError:
        return APIError(404, f"Response with id '{ident}' not found.", param="response_id")

    def _get(self, ident: str) -> _Stored:
        with self._lock:
            found = self._store.get(ident)
            if found is None:
                raise self._missing(ident)
            self._store.move_to_end(ident)
            return found

    def _keep(self, ident: str, stored: _Stored) -> None:
        with self._lock:
            self._store[ident] = stored
            self._store.move_to_end(ident)
            while len(self._store) > self.store_size:
                self._store.popitem(last=False)

    # ------------------------------------------------------------------ create
    def create(self, req: dict[str, Any], *, should_stop: Callable[[], bool] | None = None
               ) -> tuple[int, dict[str, Any] | ChunkStream]:
        """POST /v1/responses on a parsed body."""
        prepared = self._request(req)
        ident, created = _new_id("resp_"), int(time.time())
        chat = {**prepared.chat, "stream": True, "stream_options": {"include_usage": True}}
        cancelled: list[Callable[[], bool]] = []  # the stream's own flag, once it exists

        def stop_now() -> bool:
            return any(c() for c in cancelled) or bool(should_stop is not None and should_stop())

        try:
            _, out = self.api.chat_completions(chat, should_stop=stop_now)
        except APIError as exc:
            raise _renamed(exc) from None
        except ChatFormatError as exc:
            raise APIError(400, exc.message, param=_rename(exc.param), code=exc.code) from None
        assert isinstance(out, ChunkStream)
        builder = _Builder(ident, created, self.api.model_id, prepared)
        if not prepared.stream:
            try:
                for _ in builder.events(out):
                    pass
            finally:
                out.close()
            self._finish(builder, prepared)
            return 200, builder.response

        def make(flag: Callable[[], bool]) -> Iterator[dict[str, Any]]:
            cancelled.append(flag)

            def gen() -> Iterator[dict[str, Any]]:
                try:
                    for event in builder.events(out):
                        if flag():
                            return
                        yield event
                    self._finish(builder, prepared)
                finally:
                    out.close()

            return gen()

        return 200, ChunkStream(make)

    def _finish(self, builder: _Builder, req: _Request) -> None:
        if not req.store:
            return
        history = req.history + builder.output_messages()
        self._keep(builder.response["id"], _Stored(builder.response, req.input_items, history))

    # ------------------------------------------------------------------ request meaning
    def _request(self, req: Mapping[str, Any]) -> _Request:
        stream = req.get("stream", False)
        if stream is not None and not isinstance(stream, bool):
            raise APIError(400, "'stream' must be a boolean", param="stream")
        store = req.get("store", True)
        if store is not None and not isinstance(store, bool):
            raise APIError(400, "'store' must be a boolean", param="store")
        if req.get("background"):
            raise APIError(400, "'background' responses are not supported: this server "
                           "answers while the request is open", param="background")
        history: list[dict[str, Any]] = []
        previous = req.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                raise APIError(400, "'previous_response_id' must be a string",
                               param="previous_response_id")
            with self._lock:
                found = self._store.get(previous)
            if found is None:
                raise APIError(400, f"Previous response with id '{previous}' not found.",
                               param="previous_response_id", code="previous_response_not_found")
            history = list(found.history)
        items = _input_items(req.get("input"))
        vision = bool(getattr(self.api.session, "vision", False))
        messages = history + _messages(items, vision=vision)
        instructions = req.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise APIError(400, "'instructions' must be a string", param="instructions")
        chat_messages = ([{"role": "system", "content": instructions}] if instructions else []
                         ) + messages
        chat: dict[str, Any] = {"messages": chat_messages}
        tools = _tools(req.get("tools"))
        if tools:
            chat["tools"] = tools
        choice = _tool_choice(req.get("tool_choice"))
        if choice is not None:
            chat["tool_choice"] = choice
        fmt = _text_format(req.get("text"))
        if fmt is not None:
            chat["response_format"] = fmt
        reasoning = req.get("reasoning")
        if reasoning is not None:
            if not isinstance(reasoning, dict):
                raise APIError(400, "'reasoning' must be an object", param="reasoning")
            if reasoning.get("effort") is not None:
                chat["reasoning_effort"] = reasoning["effort"]
        if req.get("max_output_tokens") is not None:
            chat["max_tokens"] = req["max_output_tokens"]
        for key in ("temperature", "top_p", "parallel_tool_calls", "top_k", "seed", "stop"):
            if req.get(key) is not None:
                chat[key] = req[key]
        echo = {k: req.get(k) for k in ("instructions", "metadata", "temperature", "top_p",
                                        "max_output_tokens", "previous_response_id", "user")}
        echo["tools"] = req.get("tools") or []
        echo["tool_choice"] = req.get("tool_choice") or "auto"
        echo["parallel_tool_calls"] = req.get("parallel_tool_calls", True) is not False
        echo["text"] = req.get("text") or {"format": {"type": "text"}}
        echo["reasoning"] = reasoning or {"effort": None, "summary": None}
        echo["store"] = store is not False
        return _Request(chat, messages, _with_ids(items), echo, store is not False,
                        bool(stream))


def _rename(param: str | None) -> str | None:
    if param is None:
        return None
    head, dot, tail = param.partition(".")
    base = head.split("[")[0]
    if base in _PARAM_MAP:
        return _PARAM_MAP[base] if base != "messages" else "input" + head[len(base):] + dot + tail
    return param


def _renamed(exc: APIError) -> APIError:
    message = exc.message
    for chat_name, name in _PARAM_MAP.items():
        message = message.replace(f"'{chat_name}'", f"'{name}'")
    return APIError(exc.status, message, param=_rename(exc.param), code=exc.code,
                    type=exc.type)


# ---------------------------------------------------------------------- input
def _input_items(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        raise APIError(400, "'input' is a required property", param="input")
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise APIError(400, "'input' must be a string or a non-empty array of items",
                       param="input")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise APIError(400, f"input[{i}] must be an object", param=f"input[{i}]")
        out.append(item)
    return out


def _text_of(content: Any, at: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{at} must be a string or an array of content parts", param=at)
    texts = []
    for j, part in enumerate(content):
        pat = f"{at}[{j}]"
        if not isinstance(part, dict):
            raise APIError(400, f"{pat} must be an object", param=pat)
        kind = part.get("type")
        if kind in ("input_image", "input_file", "input_audio"):
            raise APIError(400, f"{pat} is an {kind}: this model reads text only; send the "
                           "conversation as text", param=pat,
                           code="vision_disabled" if kind == "input_image" else None)
        if kind == "refusal":
            texts.append(str(part.get("refusal", "")))
            continue
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise APIError(400, f"{pat} must be a text part ({', '.join(_TEXT_PARTS[:2])}) "
                           "with a string 'text'", param=pat)
        texts.append(part["text"])
    return "".join(texts)


def _parts_of(content: Any, at: str) -> Any:
    """A message's content with `input_image` parts, as chat parts (a vision model only)."""
    if not (isinstance(content, list)
            and any(isinstance(p, dict) and p.get("type") == "input_image" for p in content)):
        return _text_of(content, at)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        pat = f"{at}[{j}]"
        if isinstance(part, dict) and part.get("type") == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise APIError(400, f"{pat} is an input_image without an image_url (file ids "
                               "are not served here)", param=pat)
            ref = {"url": url, **({"detail": part["detail"]} if part.get("detail") else {})}
            parts.append({"type": "image_url", "image_url": ref})
        else:
            parts.append({"type": "text", "text": _text_of([part], at)})
    return parts


def _messages(items: list[dict[str, Any]], *, vision: bool = False) -> list[dict[str, Any]]:
    """Input items as chat messages: function calls join the assistant turn before them."""
    out: list[dict[str, Any]] = []
    reasoning = ""
    for i, item in enumerate(items):
        at = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise APIError(400, f"{at}.role must be one of {list(_ROLES)}",
                               param=f"{at}.role")
            read = _parts_of if vision and role == "user" else _text_of
            msg: dict[str, Any] = {"role": role,
                                   "content": read(item.get("content"), f"{at}.content")}
            if role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = reasoning, ""
            out.append(msg)
        elif kind == "function_call":
            for key in ("name", "call_id"):
                if not isinstance(item.get(key), str) or not item[key]:
                    raise APIError(400, f"{at}.{key} must be a non-empty string",
                                   param=f"{at}.{key}")
            args = item.get("arguments", "")
            if not isinstance(args, str):
                raise APIError(400, f"{at}.arguments must be a JSON string",
                               param=f"{at}.arguments")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": args or "{}"}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and not reasoning and (
                "tool_calls" in last or not last.get("content")
            ):
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    msg["reasoning_content"], reasoning = reasoning, ""
                out.append(msg)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not item["call_id"]:
                raise APIError(400, f"{at}.call_id must be a non-empty string",
                               param=f"{at}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, f"{at}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind == "reasoning":
            summary = item.get("summary") or []
            content = item.get("content") or []
            parts = content if content else summary
            reasoning += _text_of(parts, f"{at}.summary") if parts else ""
        else:
            raise APIError(400, f"{at}.type {kind!r} is not supported: send message, "
                           "function_call, function_call_output or reasoning items",
                           param=f"{at}.type")
    return out


def _with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        item = dict(item)
        kind = item.setdefault("type", "message")
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        prefix = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_",
                  "reasoning": "rs_"}.get(kind, "item_")
        item.setdefault("id", _new_id(prefix))
        if kind in ("message", "function_call", "function_call_output"):
            item.setdefault("status", "completed")
        out.append(item)
    return out


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise APIError(400, "'tools' must be an array", param="tools")
    out = []
    for i, tool in enumerate(raw):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise APIError(400, f"{at} must be an object", param=at)
        if tool.get("type") != "function":
            raise APIError(400, f"{at}.type {tool.get('type')!r} is not supported: this "
                           "server runs function tools only", param=f"{at}.type")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(400, f"{at}.name must be a non-empty string", param=f"{at}.name")
        fn: dict[str, Any] = {"name": name}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(raw: Any) -> Any:
    if raw is None or raw in ("auto", "none", "required"):
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function":
        if not isinstance(raw.get("name"), str) or not raw["name"]:
            raise APIError(400, "tool_choice.name must be a non-empty string",
                           param="tool_choice.name")
        return {"type": "function", "function": {"name": raw["name"]}}
    raise APIError(400, "'tool_choice' must be 'auto', 'none', 'required' or "
                   "{'type': 'function', 'name': ...}", param="tool_choice")


def _text_format(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise APIError(400, "'text' must be an object", param="text")
    fmt = raw.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise APIError(400, "'text.format' must be an object", param="text.format")
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "text.format.schema must be an object",
                           param="text.format.schema")
        spec = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            spec["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": spec}
    raise APIError(400, "text.format.type must be 'text', 'json_object' or 'json_schema'",
                   param="text.format.type")


# ---------------------------------------------------------------------- output
class _Builder:
    """Turns chat completion chunks into Responses stream events and the Response object."""

    def __init__(self, ident: str, created: int, model: str, req: _Request) -> None:
        self.req = req
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}  # chat call index -> function_call item
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.warp: dict[str, Any] | None = None
        self.response: dict[str, Any] = {
            "id": ident, "object": "response", "created_at": created, "status": "in_progress",
            "model": model, "output": [], "error": None, "incomplete_details": None,
            "usage": None, **req.echo,
        }

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _snapshot(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.response))

    def events(self, chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """All events of the response, from `response.created` to its final event."""
        yield self._event("response.created", response=self._snapshot())
        yield self._event("response.in_progress", response=self._snapshot())
        for chunk in chunks:
            if "error" in chunk:
                raise APIError(500, str(chunk["error"].get("message")), type="engine_error")
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            if chunk.get("warp"):
                self.warp = chunk["warp"]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("reasoning_content"):
                    yield from self._reasoning(delta["reasoning_content"])
                if delta.get("content"):
                    yield from self._text(delta["content"])
                for call in delta.get("tool_calls") or []:
                    yield from self._call(call)
                if choice.get("finish_reason"):
                    self.finish = choice["finish_reason"]
        yield from self._close()
        u = self.usage or {}
        self.response["usage"] = {
            "input_tokens": u.get("prompt_tokens", 0),
            "input_tokens_details": {
                "cached_tokens": (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                "cache_write_tokens": 0},
            "output_tokens": u.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": (
                u.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)},
            "total_tokens": u.get("total_tokens", 0),
        }
        if self.warp is not None:
            self.response["warp"] = self.warp
        self.response["output"] = self.output
        if self.finish == "length":
            self.response["status"] = "incomplete"
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
            yield self._event("response.incomplete", response=self._snapshot())
        else:
            self.response["status"] = "completed"
            self.response["completed_at"] = int(time.time())
            yield self._event("response.completed", response=self._snapshot())

    def _add(self, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield from self._close()
        self.output.append(item)
        self.open = item
        yield self._event("response.output_item.added", output_index=len(self.output) - 1,
                          item=json.loads(json.dumps(item)))

    def _reasoning(self, text: str) -> Iterator[dict[str, Any]]:
        item = self.open
        if item is None or item["type"] != "reasoning":
            yield from self._add({"type": "reasoning", "id": _new_id("rs_"), "summary": [],
                                  "status": "in_progress"})
            item = self.open
            assert item is not None
            item["summary"].append({"type": "summary_text", "text": ""})
            yield self._event("response.reasoning_summary_part.added", item_id=item["id"],
                              output_index=len(self.output) - 1, summary_index=0,
                              part={"type": "summary_text", "text": ""})
        item["summary"][0]["text"] += text
        yield self._event("response.reasoning_summary_text.delta", item_id=item["id"],
                          output_index=len(self.output) - 1, summary_index=0, delta=text)

    def _text(self, text: str) -> Iterator[dict[str, Any]]:
        item = self.open
        if item is None or item["type"] != "message":
            yield from self._add({"type": "message", "id": _new_id("msg_"), "role": "assistant",
                                  "status": "in_progress", "content": []})
            item = self.open
            assert item is not None
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item["content"].append(part)
            yield self._event("response.content_part.added", item_id=item["id"],
                              output_index=len(self.output) - 1, content_index=0,
                              part=dict(part))
        item["content"][0]["text"] += text
        yield self._event("response.output_text.delta", item_id=item["id"],
                          output_index=len(self.output) - 1, content_index=0, delta=text,
                          logprobs=[])

    def _call(self, call: dict[str, Any]) -> Iterator[dict[str, Any]]:
        index = call.get("index", 0)
        fn = call.get("function") or {}
        if index not in self.calls:
            item = {"type": "function_call", "id": _new_id("fc_"),
                    "call_id": call.get("id") or f"call_{index}", "name": fn.get("name", ""),
                    "arguments": "", "status": "in_progress"}
            self.calls[index] = item
            yield from self._add(item)
        item = self.calls[index]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            yield self._event("response.function_call_arguments.delta", item_id=item["id"],
                              output_index=self.output.index(item), delta=fn["arguments"])

    def _close(self) -> Iterator[dict[str, Any]]:
        item, self.open = self.open, None
        if item is None:
            return
        at = self.output.index(item)
        status = "incomplete" if self.finish == "length" else "completed"
        if item["type"] == "reasoning":
            part = item["summary"][0]
            yield self._event("response.reasoning_summary_text.done", item_id=item["id"],
                              output_index=at, summary_index=0, text=part["text"])
            yield self._event("response.reasoning_summary_part.done", item_id=item["id"],
                              output_index=at, summary_index=0, part=dict(part))
        elif item["type"] == "message":
            part = item["content"][0]
            yield self._event("response.output_text.done", item_id=item["id"], output_index=at,
                              content_index=0, text=part["text"], logprobs=[])
            yield self._event("response.content_part.done", item_id=item["id"],
                              output_index=at, content_index=0, part=dict(part))
        elif item["type"] == "function_call":
            yield self._event("response.function_call_arguments.done", item_id=item["id"],
                              output_index=at, name=item["name"], arguments=item["arguments"])
        item["status"] = status
        yield self._event("response.output_item.done", output_index=at,
                          item=json.loads(json.dumps(item)))

    def output_messages(self) -> list[dict[str, Any]]:
        """The output as chat messages, for a later `previous_response_id`."""
        msg: dict[str, Any] = {"role": "assistant", "content": None}
        for item in self.output:
            if item["type"] == "reasoning":
                msg["reasoning_content"] = item["summary"][0]["text"] if item["summary"] else ""
            elif item["type"] == "message":
                msg["content"] = item["content"][0]["text"] if item["content"] else ""
            elif item["type"] == "function_call":
                msg.setdefault("tool_calls", []).append(
                    {"id": item["call_id"], "type": "function",
                     "function": {"name": item["name"], "arguments": item["arguments"]}})
        return [msg]
