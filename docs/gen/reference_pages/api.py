"""The REST API page, from the app's OpenAPI document: every operation (path and method) with its
summary, auth, parameters, request body, responses and error codes, then every schema's fields.

``create_app`` assembles the routers; ``app.openapi()`` is what FastAPI serves at ``/openapi.json``, so the
page and the live API document the same thing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from reference_pages._markdown import code, paragraphs, table, text

__all__ = ["METHODS", "api_page", "operations", "schema_type"]

METHODS = ("get", "post", "put", "patch", "delete")


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(METHOD, path, operation) of every operation of an OpenAPI document, in the document's order."""
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                yield method.upper(), path, item[method]


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _link(name: str) -> str:
    return f"[{code(name)}](#{name.lower()})"


def schema_type(schema: dict[str, Any]) -> str:
    """A JSON schema as a short markdown type: ``string``, ``integer`` (1 ≤ x ≤ 3), a link to a schema,
    ``array`` of ..., alternatives joined with ``or``."""
    if "$ref" in schema:
        return _link(_ref_name(schema["$ref"]))
    if "anyOf" in schema or "oneOf" in schema:
        options = [s for s in schema.get("anyOf", schema.get("oneOf", [])) if s.get("type") != "null"]
        nullable = len(options) < len(schema.get("anyOf", schema.get("oneOf", [])))
        out = " or ".join(schema_type(s) for s in options)
        return f"{out} or `null`" if nullable else out
    if "enum" in schema:
        return " or ".join(code(json.dumps(v)) for v in schema["enum"])
    if "const" in schema:
        return code(json.dumps(schema["const"]))
    kind = schema.get("type", "any")
    if kind == "array":
        out = f"array of {schema_type(schema.get('items', {}))}"
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        out = f"object of {schema_type(schema['additionalProperties'])}"
    else:
        out = code(kind if not schema.get("format") else f"{kind} ({schema['format']})")
    return out + _bounds(schema)


_BOUNDS = {
    "minimum": "≥ {}",
    "exclusiveMinimum": "> {}",
    "maximum": "≤ {}",
    "exclusiveMaximum": "< {}",
    "minLength": "at least {} characters",
    "maxLength": "at most {} characters",
    "minItems": "at least {} items",
    "maxItems": "at most {} items",
    "maxProperties": "at most {} entries",
}


def _bounds(schema: dict[str, Any]) -> str:
    parts = [form.format(_number(schema[key])) for key, form in _BOUNDS.items() if key in schema]
    return f" ({', '.join(parts)})" if parts else ""


def _number(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _description(schema: dict[str, Any]) -> str:
    return text(schema.get("description", ""), cell=True)


def _default(schema: dict[str, Any]) -> str:
    return code(json.dumps(schema["default"])) if "default" in schema else ""


def _auth(op: dict[str, Any], doc: dict[str, Any]) -> str:
    schemes = doc.get("components", {}).get("securitySchemes", {})
    names = [name for requirement in op.get("security", []) for name in requirement]
    if not names:
        return "**Auth:** none."
    kinds = []
    for name in names:
        scheme = schemes.get(name, {})
        if scheme.get("scheme") == "bearer":
            kinds.append("`Authorization: Bearer <token>` (the service's token)")
        else:
            kinds.append(code(name))
    return f"**Auth:** {' or '.join(kinds)}."


def _responses(op: dict[str, Any]) -> str:
    rows = []
    for status, response in sorted(op.get("responses", {}).items()):
        bodies = []
        for media, content in response.get("content", {}).items():
            schema = content.get("schema")
            bodies.append(f"{code(media)}: {schema_type(schema)}" if schema else code(media))
        rows.append([code(status), text(response.get("description", ""), cell=True), "<br>".join(bodies)])
    return table(["Status", "When", "Body"], rows)


def _operation(method: str, path: str, op: dict[str, Any], doc: dict[str, Any]) -> str:
    out = [f"## {method} {path}\n", f"**{text(op.get('summary', ''))}.** {_auth(op, doc)}\n"]
    if op.get("description"):
        out.append(paragraphs(op["description"]) + "\n")
    params = op.get("parameters", [])
    if params:
        rows = [
            [
                code(p["name"]),
                p["in"],
                schema_type(p.get("schema", {})),
                "yes" if p.get("required") else "",
                _default(p.get("schema", {})),
                text(p.get("description", p.get("schema", {}).get("description", "")), cell=True),
            ]
            for p in params
        ]
        out.append(table(["Parameter", "In", "Type", "Required", "Default", "Meaning"], rows))
    body = op.get("requestBody")
    if body:
        media = [f"{code(m)}: {schema_type(c.get('schema', {}))}" for m, c in body.get("content", {}).items()]
        required = "required" if body.get("required") else "optional"
        out.append(f"**Request body** ({required}): {', '.join(media)}\n")
    out.append(_responses(op))
    return "\n".join(out)


def _schema(name: str, schema: dict[str, Any]) -> str:
    out = [f"### {name}\n"]
    if schema.get("description"):
        out.append(paragraphs(schema["description"]) + "\n")
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    if props:
        rows = [
            [code(key), schema_type(p), "yes" if key in required else "", _default(p), _description(p)]
            for key, p in props.items()
        ]
        out.append(table(["Field", "Type", "Required", "Default", "Meaning"], rows))
        if schema.get("additionalProperties") is False:
            out.append("Other fields are refused (422).\n")
    elif schema.get("type"):
        out.append(f"Type: {schema_type(schema)}\n")
    return "\n".join(out)


def api_page(doc: dict[str, Any]) -> str:
    """The markdown page of an OpenAPI document (``create_app(...).openapi()``)."""
    info = doc.get("info", {})
    out = [
        "# REST API\n",
        paragraphs(info.get("description", "")) + "\n",
        f"OpenAPI {code(doc.get('openapi', ''))}; the service serves this document at `/openapi.json`. "
        'Every error is JSON `{"error": {"code", "message", "details"?}}` (see [`ErrorBody`](#errorbody)).\n',
    ]
    summary = [
        [f"[{code(f'{m} {p}')}](#{_anchor(m, p)})", text(op.get("summary", ""), cell=True)]
        for m, p, op in operations(doc)
    ]
    out.append(table(["Operation", "Summary"], summary))
    out += [_operation(m, p, op, doc) for m, p, op in operations(doc)]
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        out.append("## Schemas\n")
        out += [_schema(name, schema) for name, schema in schemas.items()]
    return "\n".join(out)


def _anchor(method: str, path: str) -> str:
    """The heading id the toc extension gives ``## METHOD /path`` (its default slugify)."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", f"{method} {path}").strip().lower())
