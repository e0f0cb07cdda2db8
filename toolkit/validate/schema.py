"""The shipped JSON Schema of DeepSpeed's config and the translation of its errors into findings."""

from __future__ import annotations

import difflib
import functools
import json

from dstk.findings import Finding
from dstk.resources import data_file

SCHEMA_NAME = "deepspeed-0.19.8.schema.json"


@functools.cache
def schema_text() -> str:
    return data_file(SCHEMA_NAME).read_text(encoding="utf-8")


@functools.cache
def load_schema() -> dict:
    return json.loads(schema_text())


@functools.cache
def _validator(pointer: str = ""):
    from jsonschema import Draft202012Validator

    schema = load_schema()
    if pointer:
        schema = subschema(pointer)
    return Draft202012Validator(schema)


def subschema(pointer: str) -> dict:
    node = load_schema()
    for part in pointer.strip("/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


@functools.cache
def key_index() -> dict[str, tuple[str, ...]]:
    """Every property name in the schema -> the pointers of the sections that define it."""
    index: dict[str, list[str]] = {}

    def walk(node: dict, pointer: str) -> None:
        for name, sub in node.get("properties", {}).items():
            index.setdefault(name, []).append(pointer or "/")
            if isinstance(sub, dict):
                walk(sub, f"{pointer}/{name}")

    walk(load_schema(), "")
    return {k: tuple(v) for k, v in index.items()}


def did_you_mean(word: str, choices) -> str | None:
    choices = list(choices)
    lower = {c.lower(): c for c in choices if isinstance(c, str)}
    if isinstance(word, str) and word.lower() in lower:
        return lower[word.lower()]
    matches = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return matches[0] if matches else None


def _pointer(path) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _type_name(value) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
            type(None): "null"}.get(type(value), type(value).__name__)


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _expected(schema: dict) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(_short(v) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    return kind or "another value"


def findings_for(instance, *, base: str = "", schema_pointer: str = "", code_prefix: str = "DS1",
                 what: str = "") -> list[Finding]:
    """Schema findings for ``instance``; ``base`` is its pointer in the document, ``schema_pointer`` the
    schema it is checked against (the root by default; optimizer/scheduler params use ``$defs``)."""
    validator = _validator(schema_pointer)
    out: list[Finding] = []
    for err in validator.iter_errors(instance):
        out.extend(_translate(err, base=base, what=what))
    return out


def _translate(err, *, base: str, what: str) -> list[Finding]:
    pointer = base + _pointer(err.absolute_path)
    schema = err.schema if isinstance(err.schema, dict) else {}
    value = err.instance
    kind = err.validator
    section = pointer or "the top level"
    if kind == "additionalProperties":
        props = schema.get("properties", {})
        out = []
        for key in value:
            if key in props:
                continue
            child = f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}"
            guess = did_you_mean(key, props)
            elsewhere = [p for p in key_index().get(key, ()) if p != (pointer or "/")]
            if elsewhere and not what:  # an exact key of another section beats a near miss here
                hint = f"'{key}' belongs under {elsewhere[0]}" + (f" (or did you mean '{guess}'?)" if guess else "")
            elif guess:
                hint = f"did you mean '{guess}'?"
            else:
                hint = f"remove it; {section} accepts: " + ", ".join(sorted(props)[:12]) + (
                    ", ..." if len(props) > 12 else "")
            if what:
                msg = f"unknown {what} parameter '{key}': the constructor does not take it, so DeepSpeed fails at initialize"
            elif not pointer:
                msg = f"unknown top-level key '{key}': DeepSpeed silently ignores it, so the setting never applies"
            else:
                msg = f"unknown key '{key}' in {pointer}"
            out.append(Finding(severity="error", code="DS101", pointer=child, message=msg, hint=hint))
        return out
    if kind == "type" or kind == "false" or (kind == "not" and schema.get("x-dstk-not-json")):
        if schema.get("x-dstk-not-json") or err.schema is False:
            return [Finding(severity="error", code="DS102", pointer=pointer,
                            message=f"{pointer} takes a Python object (set in code), not a JSON value",
                            hint="remove it from the config and pass it in code")]
        expected = _expected(schema)
        hint = f"write a {expected}"
        if isinstance(value, str) and expected in ("number", "integer", "integer or null", "number or null"):
            hint = f"write it without quotes: {value.strip()}" if _is_number(value) else hint
        if isinstance(value, str) and value.lower() in ("true", "false") and "boolean" in expected:
            hint = f"write {value.lower()} without quotes"
        return [Finding(severity="error", code="DS102", pointer=pointer,
                        message=f"{pointer or 'the config'} must be {_article(expected)}, got {_type_name(value)} {_short(value)}"
                        + (f" ({what})" if what else ""), hint=hint)]
    if kind in ("enum", "const", "pattern"):
        choices = schema.get("enum") or ([schema["const"]] if "const" in schema else None)
        if kind == "pattern":
            choices = _pattern_choices(schema.get("pattern", ""))
        guess = did_you_mean(value, choices) if isinstance(value, str) and choices else None
        listed = ", ".join(_short(c) for c in choices) if choices else schema.get("pattern")
        return [Finding(severity="error", code="DS103", pointer=pointer,
                        message=f"{pointer} is {_short(value)}, not one of: {listed}",
                        hint=f"did you mean {_short(guess)}?" if guess is not None else f"use one of: {listed}")]
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength"):
        bound = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<",
                 "minLength": "of length >="}[kind]
        return [Finding(severity="error", code="DS104", pointer=pointer,
                        message=f"{pointer} is {_short(value)}; it must be {bound} {err.validator_value}",
                        hint=f"use a value {bound} {err.validator_value}")]
    if kind == "required":
        missing = [k for k in err.validator_value if k not in value]
        return [Finding(severity="error", code="DS110", pointer=f"{pointer}/{k}",
                        message=f"{section} needs '{k}'" + (f" ({what})" if what else ""),
                        hint=f"add '{k}'") for k in missing]
    if kind in ("anyOf", "oneOf"):
        sub = err.context[0] if err.context else None
        if sub is not None:
            return _translate(sub, base=base, what=what)
    return [Finding(severity="error", code="DS199", pointer=pointer, message=f"{pointer}: {err.message}")]


def _article(expected: str) -> str:
    return ("an " if expected[:1] in "aeiou" else "a ") + expected


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _pattern_choices(pattern: str) -> list[str] | None:
    # the schema writes case-insensitive enums as ^(?i:a|b|c)$
    if pattern.startswith("^(?i:") and pattern.endswith(")$"):
        return pattern[5:-2].split("|")
    return None
