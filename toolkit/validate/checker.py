"""A small JSON Schema checker for the keywords the shipped DeepSpeed schema uses, so that ``dstk validate``
does not import ``jsonschema`` (with ``referencing`` and its bundled metaschemas that import was about half
of the command's cold start, and most of it on a busy machine).

Keywords, with draft 2020-12 semantics (https://json-schema.org/draft/2020-12/json-schema-validation):
``type`` (``integer`` includes floats with a zero fractional part; booleans are not numbers), ``enum`` and
``const`` (``1 == 1.0``, ``true != 1``), ``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum``,
``minLength``, ``pattern`` (``re.search``), ``items``, ``minItems``/``maxItems``, ``properties``,
``additionalProperties`` (boolean or schema), ``required``, ``anyOf``, ``oneOf``, ``not``; ``false`` as a
schema. Annotations (``description``, ``default``, ``format``, ``deprecated``, ``x-dstk-*``) assert nothing.
A keyword outside this list raises ``NotImplementedError``: the schema generator must not start using one
silently. tests/test_validate_checker.py checks it error for error against ``jsonschema`` on the corpora,
seeded mutants and random values.

Errors carry the attributes :func:`dstk.validate.schema._translate` reads from ``jsonschema``'s
``ValidationError``: ``validator``, ``validator_value``, ``schema``, ``instance``, ``absolute_path``,
``relative_schema_path``, ``context`` and ``message``.
"""

from __future__ import annotations

import functools
import re
from collections import deque

ANNOTATIONS = frozenset({"description", "default", "format", "deprecated", "title", "$schema", "$id", "$defs",
                         "examples", "readOnly", "writeOnly", "$comment"})
ASSERTIONS = frozenset({"type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                        "minLength", "pattern", "items", "minItems", "maxItems", "properties",
                        "additionalProperties", "required", "anyOf", "oneOf", "not"})


class SchemaError:
    """One violation (the fields of jsonschema's ``ValidationError`` that dstk uses)."""

    __slots__ = ("validator", "validator_value", "schema", "instance", "path", "schema_path", "context", "message",
                 "parent")

    def __init__(self, validator, validator_value, schema, instance, message, context=()):
        self.validator = validator
        self.validator_value = validator_value
        self.schema = schema
        self.instance = instance
        self.message = message
        self.path: deque = deque()
        self.schema_path: deque = deque([validator])
        self.context = list(context)
        self.parent = None
        for sub in self.context:
            sub.parent = self

    @property
    def absolute_path(self) -> deque:
        """From the document root (an ``anyOf`` branch's error adds its path to its parent's)."""
        if self.parent is None:
            return self.path
        return deque([*self.parent.absolute_path, *self.path])

    @property
    def relative_schema_path(self) -> deque:
        return self.schema_path

    def __repr__(self) -> str:
        return f"SchemaError({self.validator!r}, path={list(self.path)!r}, {self.message!r})"


def _is_type(value, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if kind == "number":
        return isinstance(value, (int, float))
    if kind == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    raise NotImplementedError(f"JSON Schema type {kind!r}")


def _equal(a, b) -> bool:
    """JSON equality: numbers by value (1 == 1.0), booleans apart from numbers, containers element-wise."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@functools.lru_cache(maxsize=256)
def _regex(pattern: str):
    return re.compile(pattern)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def iter_errors(instance, schema):
    """Every violation of ``schema`` by ``instance``, in the schema's keyword order (as jsonschema)."""
    if schema is True:
        return
    if schema is False:
        yield SchemaError("false", False, schema, instance, f"False schema does not allow {instance!r}")
        return
    for keyword, value in schema.items():
        if keyword in ANNOTATIONS or keyword.startswith("x-"):
            continue
        check = _KEYWORDS.get(keyword)
        if check is None:
            raise NotImplementedError(f"JSON Schema keyword {keyword!r} (dstk.validate.checker supports "
                                      f"{', '.join(sorted(ASSERTIONS))})")
        yield from check(value, instance, schema)


def _descend(instance, schema, *, path=None, schema_path=None):
    for error in iter_errors(instance, schema):
        if path is not None:
            error.path.appendleft(path)
        if schema_path is not None:
            error.schema_path.appendleft(schema_path)
        yield error


def _type(kinds, instance, schema):
    kinds_list = [kinds] if isinstance(kinds, str) else kinds
    if not any(_is_type(instance, k) for k in kinds_list):
        yield SchemaError("type", kinds, schema, instance, f"{instance!r} is not of type "
                          + ", ".join(repr(k) for k in kinds_list))


def _enum(values, instance, schema):
    if not any(_equal(v, instance) for v in values):
        yield SchemaError("enum", values, schema, instance, f"{instance!r} is not one of {values!r}")


def _const(value, instance, schema):
    if not _equal(value, instance):
        yield SchemaError("const", value, schema, instance, f"{value!r} was expected")


def _bound(name, test, words):
    def check(bound, instance, schema):
        if _is_number(instance) and not test(instance, bound):
            yield SchemaError(name, bound, schema, instance, f"{instance!r} is {words} {bound!r}")
    return check


def _min_length(bound, instance, schema):
    if isinstance(instance, str) and len(instance) < bound:
        yield SchemaError("minLength", bound, schema, instance, f"{instance!r} is too short")


def _pattern(pattern, instance, schema):
    if isinstance(instance, str) and not _regex(pattern).search(instance):
        yield SchemaError("pattern", pattern, schema, instance, f"{instance!r} does not match {pattern!r}")


def _items(items, instance, schema):
    if isinstance(instance, list):
        for index, item in enumerate(instance):
            yield from _descend(item, items, path=index, schema_path="items")


def _min_items(bound, instance, schema):
    if isinstance(instance, list) and len(instance) < bound:
        yield SchemaError("minItems", bound, schema, instance, f"{instance!r} is too short")


def _max_items(bound, instance, schema):
    if isinstance(instance, list) and len(instance) > bound:
        yield SchemaError("maxItems", bound, schema, instance, f"{instance!r} is too long")


def _properties(properties, instance, schema):
    if isinstance(instance, dict):
        for name, sub in properties.items():
            if name in instance:
                for error in _descend(instance[name], sub, path=name, schema_path=name):
                    error.schema_path.appendleft("properties")
                    yield error


def _additional(additional, instance, schema):
    if not isinstance(instance, dict):
        return
    known = schema.get("properties", {})
    extras = [k for k in instance if k not in known]
    if not extras:
        return
    if additional is False:
        yield SchemaError("additionalProperties", False, schema, instance,
                          f"Additional properties are not allowed ({len(extras)} unexpected)")
    elif isinstance(additional, dict) or additional is True:
        for name in extras:
            yield from _descend(instance[name], additional, path=name, schema_path="additionalProperties")


def _required(names, instance, schema):
    if isinstance(instance, dict):
        for name in names:
            if name not in instance:
                yield SchemaError("required", names, schema, instance, f"{name!r} is a required property")


def _any_of(branches, instance, schema):
    context = []
    for index, branch in enumerate(branches):
        errors = list(_descend(instance, branch, schema_path=index))
        if not errors:
            return
        context.extend(errors)
    yield SchemaError("anyOf", branches, schema, instance, f"{instance!r} is not valid under any of the given "
                      "schemas", context)


def _one_of(branches, instance, schema):
    context, valid = [], 0
    for index, branch in enumerate(branches):
        errors = list(_descend(instance, branch, schema_path=index))
        valid += not errors
        context.extend(errors)
    if valid == 0:
        yield SchemaError("oneOf", branches, schema, instance, f"{instance!r} is not valid under any of the given "
                          "schemas", context)
    elif valid > 1:
        yield SchemaError("oneOf", branches, schema, instance, f"{instance!r} is valid under each of the schemas")


def _not(sub, instance, schema):
    if not any(True for _ in iter_errors(instance, sub)):
        yield SchemaError("not", sub, schema, instance, f"{instance!r} should not be valid under {sub!r}")


_KEYWORDS = {
    "type": _type, "enum": _enum, "const": _const,
    "minimum": _bound("minimum", lambda v, b: v >= b, "less than the minimum of"),
    "maximum": _bound("maximum", lambda v, b: v <= b, "greater than the maximum of"),
    "exclusiveMinimum": _bound("exclusiveMinimum", lambda v, b: v > b, "less than or equal to the minimum of"),
    "exclusiveMaximum": _bound("exclusiveMaximum", lambda v, b: v < b, "greater than or equal to the maximum of"),
    "minLength": _min_length, "pattern": _pattern, "items": _items, "minItems": _min_items, "maxItems": _max_items,
    "properties": _properties, "additionalProperties": _additional, "required": _required, "anyOf": _any_of,
    "oneOf": _one_of, "not": _not,
}
