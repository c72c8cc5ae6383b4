"""JSON schemas for constrained-decoding tests: nested objects, arrays, enums, numeric
bounds, required/optional keys, $defs, anyOf/oneOf, patterns and formats.

Most strings are length-bounded and most objects closed, so a random model sampling at
temperature 1 ends its replies within a few hundred tokens (the open ones end by chance, in
practice well under 1000 on a byte-level vocabulary); llguidance enforces each schema exactly.
Shared by tests/unit/test_constrain.py (random logits) and the OpenAI real-engine suite
(a random tiny model).
"""

from __future__ import annotations

from typing import Any

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 4}
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "p": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "required": ["p"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "note": {"type": ["string", "null"], "maxLength": 8},
        },
        "required": ["ok", "note"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"score": {"type": "number", "minimum": 0.5, "maximum": 2.5}},
        "required": ["score"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20}},
        "required": ["n"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 2,
                "maxItems": 3,
                "items": {"type": "integer", "minimum": -5, "maximum": 5},
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "kind": {"const": "point"},
            "v": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["kind", "v"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "a": {"type": "string", "maxLength": 4},
            "b": {"type": "integer", "maximum": 99, "minimum": 0},
        },
        "required": ["a"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "v": {
                "anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": 9},
                    {"type": "string", "maxLength": 3},
                ]
            }
        },
        "required": ["v"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "$defs": {
            "pt": {
                "type": "object",
                "properties": {"x": {"type": "integer", "maximum": 9, "minimum": 0}},
                "required": ["x"],
                "additionalProperties": False,
            }
        },
        "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}},
        "required": ["from", "to"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "maxItems": 3,
                "items": {"type": "array", "maxItems": 3, "items": {"type": "boolean"}},
            }
        },
        "required": ["rows"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "level": {"type": "integer", "enum": [1, 2, 3]},
            "label": {"enum": ["lo", "hi", None]},
        },
        "required": ["level", "label"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"date": {"type": "string", "format": "date"}},
        "required": ["date"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"m": {"type": "number", "multipleOf": 0.5, "minimum": 0, "maximum": 10}},
        "required": ["m"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "d": {
                "type": "object",
                "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
                "maxProperties": 3,
            }
        },
        "required": ["d"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 6},
                    "roles": {"type": "array", "maxItems": 2, "items": {"enum": ["admin", "dev"]}},
                    "address": {
                        "type": "object",
                        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "roles", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 5},
    {"type": "object", "properties": {"q": {"type": "string", "maxLength": 10}}},
    {
        "type": "object",
        "properties": {
            "s": {"type": "string", "minLength": 2, "maxLength": 3},
            "t": {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"k": {"const": 1}},
                        "required": ["k"],
                        "additionalProperties": False,
                    },
                    {"type": "array", "maxItems": 1, "items": {"type": "null"}},
                ]
            },
        },
        "required": ["s", "t"],
        "additionalProperties": False,
    },
]
