"""GLM's tool protocol and the GLM-5.3-Flash chat format (PROTOCOLS §5).

Owns: the `<tool_call>`/`<arg_key>`/`<arg_value>` grammar: the tool
declaration turn (§5.2, template-exact revision), assistant calls in history
(§5.3), `<|observation|>` result runs (§5.4) and the reply reader that types
argument values by the request's tool schema (§5.6). `GlmFormat` is the
chat.json format with GLM's own `chat.json` and this protocol required.

Refuses (ChatFormatError): a tool without a function name (`tools[k]`),
parameters/properties that are not objects, `defer_loading`; history calls
without a name or with arguments that are not a JSON object; everything
chat.json refuses (thinking cannot be turned off, no effort; images only on a vocabulary
with GLM's image markers, each placed as `IMAGE_BLOCK`, one `<|image|>` the host expands).
Called by: `ChatJsonFormat` (protocol discovery) and the registry (`glm`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from warp_providers.chat.base import ChatFormatError as _Err
from warp_providers.chat.base import M, ReplyParser, Segment, T, _Call, dumps_py, function_of
from warp_providers.chat.formats.chatjson import (
    ChatJsonFormat,
    ChatJsonSpec,
    ToolProtocol,
    ToolReader,
)

__all__ = ["GLM_CHAT_JSON", "GlmFormat", "GlmProtocol", "GlmReader"]

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
ARG_KEY, ARG_KEY_END = "<arg_key>", "</arg_key>"
ARG_VALUE, ARG_VALUE_END = "<arg_value>", "</arg_value>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
OBSERVATION = "<|observation|>"
MARKERS = (
    TOOL_CALL,
    TOOL_CALL_END,
    ARG_KEY,
    ARG_KEY_END,
    ARG_VALUE,
    ARG_VALUE_END,
    TOOL_RESPONSE,
    TOOL_RESPONSE_END,
    OBSERVATION,
)

GLM_CHAT_JSON: dict[str, Any] = {
    "prelude": "[gMASK]<sop>",
    "system": ["<|system|>", ""],
    "user": ["<|user|>", ""],
    "assistant": ["<|assistant|>", ""],
    "open": "<|assistant|>",
    "think": ["<think>", "</think>"],
    "stop": "<|user|>",
}
"""GLM-5.3-Flash's chat.json, verbatim (§4.1)."""

HEADER = (
    "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
FOOTER = (
    "\n</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
)
IMAGE_MARKERS = ("<|begin_of_image|>", "<|image|>", "<|end_of_image|>")
IMAGE_BLOCK = "".join(IMAGE_MARKERS)
"""How GLM's processor places an image: one `<|image|>` per image position between the two."""
TYPED = frozenset({"integer", "number", "boolean", "object", "array", "null"})
"""Declared property types whose values are JSON-decoded (§5.6); all others stay strings."""


class GlmProtocol(ToolProtocol):
    """GLM's XML-looking tool grammar."""

    name = "glm"
    markers = MARKERS

    def declaration(self, tools: list[Mapping[str, Any]]) -> list[Segment]:
        """`<|system|>` + header + one signature per tool + footer (§5.2)."""
        segs = [M("<|system|>"), T(HEADER)]
        for k, tool in enumerate(tools):
            fn = tool.get("function") if "function" in tool else tool
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise _Err("each tool must name a function", param=f"tools[{k}]")
            params = fn.get("parameters", {})
            if not isinstance(params, Mapping) or not isinstance(
                params.get("properties", {}), Mapping
            ):
                raise _Err(
                    "tool parameters and properties must be objects",
                    param=f"tools[{k}].function.parameters",
                )
            if fn.get("defer_loading"):
                raise _Err("deferred tool loading is not supported", param="tools")
            signature = {
                key: value for key, value in fn.items() if key not in ("strict", "defer_loading")
            }
            segs.append(T("\n" + dumps_py(signature) + "\n\n"))
        segs.append(M(FOOTER))
        return segs

    def calls(self, i: int, calls: list[Any]) -> list[Segment]:
        """Render `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>...` (§5.3)."""
        segs: list[Segment] = []
        for j, call in enumerate(calls):
            fn = call.get("function", {}) if isinstance(call, Mapping) else {}
            name = fn.get("name") if isinstance(fn, Mapping) else None
            where = f"messages[{i}].tool_calls[{j}]"
            if not isinstance(name, str) or not name:
                raise _Err(f"{where} has no function name", param=f"{where}.function.name")
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    raise _Err(
                        f"{where} carries JSON arguments this protocol cannot split into "
                        f"<arg_key>/<arg_value> pairs",
                        param=f"{where}.function.arguments",
                    ) from None
            if not isinstance(args, Mapping):
                raise _Err(
                    f"{where} arguments must be an object", param=f"{where}.function.arguments"
                )
            segs += [M(TOOL_CALL), T(name)]
            for key, value in args.items():
                text = value if isinstance(value, str) else dumps_py(value)
                segs += [
                    M(ARG_KEY),
                    T(str(key)),
                    M(ARG_KEY_END),
                    M(ARG_VALUE),
                    T(text),
                    M(ARG_VALUE_END),
                ]
            segs.append(M(TOOL_CALL_END))
        return segs

    def result(
        self,
        i: int,
        msg: Mapping[str, Any],
        previous_role: str | None,
        spec: ChatJsonSpec,
        body: list[Segment],
    ) -> list[Segment]:
        """`<|observation|>` opens a run; then `<tool_response>` body `</tool_response>` (§5.4)."""
        segs = [M(OBSERVATION)] if i == 0 or previous_role != "tool" else []
        return [*segs, M(TOOL_RESPONSE), *body, M(TOOL_RESPONSE_END)]

    def reader(self, host: ReplyParser, tools: Sequence[Mapping[str, Any]]) -> GlmReader:
        """Return a §5.6 reader typing values by `tools`."""
        return GlmReader(host, tools)


class GlmReader(ToolReader):
    """Reads GLM tool calls out of a reply (§5.6)."""

    def __init__(self, host: ReplyParser, tools: Sequence[Mapping[str, Any]]) -> None:
        """Index the declared property schemas by function name."""
        super().__init__(host)
        self.schemas: dict[str, Mapping[str, Any]] = {}
        for tool in tools:
            fn = function_of(tool)
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                continue
            params = fn.get("parameters") or {}
            props = params.get("properties") if isinstance(params, Mapping) else None
            self.schemas[fn["name"]] = props if isinstance(props, Mapping) else {}
        self.current: _Call | None = None
        self.key = ""
        self.value = ""
        self.state = "content"

    def claim_marker(self, marker: str) -> bool:
        """Apply the marker table of §5.6; result/observation markers are not claimed."""
        host, call = self.host, self.current
        if marker == TOOL_CALL:
            if call is not None:
                self._seal(call)
            self.current = host._new_call()
            self.current.extra["args"] = {}
            self.state = "name"
        elif marker == ARG_KEY:
            self.key, self.state = "", "key"
            if call is not None:
                call.name = call.name.strip()
                host._announce(call)
        elif marker == ARG_KEY_END:
            self.state = "between"
        elif marker == ARG_VALUE:
            self.value, self.state = "", "value"
        elif marker == ARG_VALUE_END:
            self._file()
            self.state = "between"
        elif marker == TOOL_CALL_END:
            self._file()
            if call is not None:
                call.name = call.name.strip()
                self._seal(call)
            self.current, self.state = None, "content"
        else:
            return False
        return True

    def claim_text(self, text: str) -> bool:
        """Name, key and value text is claimed; text between pairs is swallowed."""
        if self.state == "name" and self.current is not None:
            self.current.name += text
        elif self.state == "key":
            self.key += text
        elif self.state == "value":
            self.value += text
        elif self.state != "between":
            return False
        return True

    def flush(self) -> None:
        """File the pending pair of a call cut off mid-way (its name stays unstripped)."""
        if self.current is not None:
            self._file()
            self._set_arguments(self.current)

    def _file(self) -> None:
        call = self.current
        if call is not None and self.key.strip():
            key = self.key.strip()
            value: Any = self.value
            schema = self.schemas.get(call.name.strip(), {}).get(key)
            if (
                isinstance(schema, Mapping)
                and isinstance(schema.get("type"), str)
                and schema["type"] in TYPED
            ):
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
            call.extra["args"][key] = value
        self.key = self.value = ""

    def _set_arguments(self, call: _Call) -> None:
        call.arguments = dumps_py(call.extra["args"])

    def _seal(self, call: _Call) -> None:
        self._set_arguments(call)
        self.host._seal(call)


class GlmFormat(ChatJsonFormat):
    """GLM-5.3-Flash: GLM's chat.json with the GLM tool protocol required.

    Args:
        chat_json: Override the built-in chat.json (a container's own).

    """

    name = "glm"

    def __init__(self, chat_json: str | os.PathLike[str] | Mapping[str, Any] | None = None) -> None:
        """Create the format."""
        super().__init__(GLM_CHAT_JSON if chat_json is None else chat_json, protocol="glm")

    def bind(self, tokenizer: Any) -> GlmFormat:
        """Bind to a vocabulary; one that carries GLM's image markers can place images."""
        if not self.spec.image and all(tokenizer.marker_id(m) is not None for m in IMAGE_MARKERS):
            self.spec.image = IMAGE_BLOCK
        super().bind(tokenizer)
        return self
