"""The shipped JSON Schema of DeepSpeed's config and the translation of its errors into findings."""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import json
import math

from dstk.findings import Finding
from dstk.resources import data_file
from dstk.validate.versions import NEWEST, SHIPPED

_MINOR: contextvars.ContextVar[str] = contextvars.ContextVar("dstk_deepspeed_minor", default=NEWEST)
"""The DeepSpeed minor release (a key of ``versions.SHIPPED``) that the checks use; :func:`using` sets it."""


def schema_name(minor: str) -> str:
    return f"deepspeed-{minor}.schema.json"


def current_minor() -> str:
    return _MINOR.get()


@contextlib.contextmanager
def using(minor: str):
    """Check against DeepSpeed ``minor``'s schema and key tables inside the block."""
    if minor not in SHIPPED:
        raise ValueError(f"no shipped schema for DeepSpeed {minor!r} ({', '.join(SHIPPED)})")
    token = _MINOR.set(minor)
    try:
        yield
    finally:
        _MINOR.reset(token)


def schema_text(minor: str | None = None) -> str:
    return _schema_text(minor or current_minor())


@functools.cache
def _schema_text(minor: str) -> str:
    return data_file(schema_name(minor)).read_text(encoding="utf-8")


def load_schema(minor: str | None = None) -> dict:
    """The shipped schema of ``minor`` (default: the one :func:`using` selected, else the newest)."""
    return _load(minor or current_minor())


@functools.cache
def _load(minor: str) -> dict:
    return json.loads(_schema_text(minor))


def _validator(pointer: str = ""):
    return _validator_for(current_minor(), pointer)


@functools.cache
def _validator_for(minor: str, pointer: str):
    """What checks an instance against the schema (or its part at ``pointer``): dstk's own checker of the
    keywords the schema uses (:mod:`dstk.validate.checker`; jsonschema is the oracle in its tests)."""
    from dstk.validate import checker

    schema = subschema(pointer, minor=minor) if pointer else load_schema(minor)
    return _Checker(schema, checker.iter_errors)


class _Checker:
    __slots__ = ("schema", "_iter")

    def __init__(self, schema, iter_errors):
        self.schema = schema
        self._iter = iter_errors

    def iter_errors(self, instance):
        return self._iter(instance, self.schema)


def subschema(pointer: str, *, minor: str | None = None) -> dict:
    node = load_schema(minor)
    for part in pointer.strip("/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def key_index(minor: str | None = None) -> dict[str, tuple[str, ...]]:
    """Every property name in the schema -> the pointers of the sections that define it."""
    return _key_index(minor or current_minor())


@functools.cache
def _key_index(minor: str) -> dict[str, tuple[str, ...]]:
    index: dict[str, list[str]] = {}

    def walk(node: dict, pointer: str) -> None:
        for name, sub in node.get("properties", {}).items():
            index.setdefault(name, []).append(pointer or "/")
            if isinstance(sub, dict):
                walk(sub, f"{pointer}/{name}")

    walk(load_schema(minor), "")
    return {k: tuple(v) for k, v in index.items()}


def releases_with(pointer: str, key: str) -> list[str]:
    """The other shipped minors whose schema has ``key`` in the section at ``pointer`` (a document pointer,
    "" for the top level): the hint for a key that one release reads and the chosen one does not."""
    out = []
    for minor in SHIPPED:
        if minor == current_minor():
            continue
        node = load_schema(minor)
        for part in [p for p in pointer.split("/") if p]:
            node = node.get("properties", {}).get(part.replace("~1", "/").replace("~0", "~"))
            if not isinstance(node, dict):
                break
        if isinstance(node, dict) and key in node.get("properties", {}):
            out.append(minor)
    return out


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
        return _unknown_keys(value, schema, pointer=pointer, what=what)
    if kind == "type" or kind == "false" or (kind == "not" and schema.get("x-dstk-not-json")):
        if schema.get("x-dstk-not-json") or err.schema is False:
            return [Finding(severity="error", code="DS102", pointer=pointer,
                            message=f"{pointer} takes a Python object (set in code), not a JSON value",
                            hint="remove it from the config and pass it in code")]
        expected = _expected(schema)
        hint = f"write {_article(expected)}"
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
    if kind in ("minItems", "maxItems") and isinstance(value, list):
        bound = "at least" if kind == "minItems" else "at most"
        return [Finding(severity="error", code="DS104", pointer=pointer,
                        message=f"{pointer} has {len(value)} item{'s' * (len(value) != 1)}; it must have {bound} "
                                f"{err.validator_value}" + (f" ({what})" if what else ""),
                        hint=f"write {err.validator_value} values, e.g. {_short(schema.get('default'))}"
                        if schema.get("default") is not None else f"write {bound} {err.validator_value} values")]
    if kind in ("anyOf", "oneOf") and err.context:
        return _translate(_closest_branch(err.context), base=base, what=what)
    return [Finding(severity="error", code="DS199", pointer=pointer, message=f"{pointer}: {err.message}")]


FOREIGN_NAMES = {
    "max_grad_norm": ("/", "gradient_clipping", "HF TrainingArguments' name for it"),
    "per_device_train_batch_size": ("/", "train_micro_batch_size_per_gpu", "HF TrainingArguments' name for it"),
    "micro_batch_size": ("/", "train_micro_batch_size_per_gpu", "Megatron's name for it"),
    "global_batch_size": ("/", "train_batch_size", "Megatron's name for it"),
    "learning_rate": ("/optimizer/params", "lr", "DeepSpeed reads the learning rate from the optimizer block"),
    "zero_stage": ("/zero_optimization", "stage", "accelerate's name for it"),
}
"""Names other tools use for a DeepSpeed key: name -> (section, DeepSpeed's key, why)."""

MAX_GUESSES_PER_OBJECT = 200
"""Did-you-mean (a difflib comparison with every key of the section) runs for at most this many unknown
keys of one object: past that the object is not a config with typos, and a file with 200,000 unknown keys
must not cost 200,000 x (keys of the section) string comparisons."""


def _span(minors: list[str]) -> str:
    return minors[0] if len(minors) == 1 else f"{minors[0]}-{minors[-1]}" if len(minors) > 2 else " and ".join(minors)


def _where(section: str) -> str:
    return "at the top level" if section == "/" else f"under {section}"


def _unknown_keys(value: dict, schema: dict, *, pointer: str, what: str) -> list[Finding]:
    """DS101 for each key the object's schema does not have (DS111 for ``_comment``-style keys), with a
    hint saying where the key belongs: another tool's name for it, the section that has it, the
    section its children belong to, or a near miss here."""
    props = schema.get("properties", {})
    section = pointer or "the top level"
    here = pointer or "/"
    rejects = bool(what) or str(schema.get("x-dstk-parser", "")).startswith("pydantic")
    lower = {k.lower(): k for k in props}
    index = key_index()
    accepts = f"remove it; {section} accepts: " + ", ".join(sorted(props)[:12]) + (", ..." if len(props) > 12 else "")
    out = []
    guesses = 0
    for key in value:
        if key in props:
            continue
        child = f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}"
        if key.startswith("_"):
            out.append(_comment_key(key, child, section, rejects=rejects, what=what))
            continue
        guess = None
        budget = guesses < MAX_GUESSES_PER_OBJECT  # also bounds the look-up in the other releases' schemas
        if key.lower() in lower:
            guess = lower[key.lower()]
        elif budget:
            guesses += 1
            guess = did_you_mean(key, props)
        hint = None
        others = releases_with(pointer, key) if not what and budget else []
        if others:
            hint = (f"DeepSpeed {_span(others)} read{'s' * (len(others) == 1)} '{key}' here, {current_minor()} does "
                    f"not: remove it, or check against the release you run (--deepspeed-version {others[-1]})")
            guess = None
        elif not what:
            hint = _belongs_hint(key, value[key], here=here, index=index)
        if hint is None and guess:
            hint = f"did you mean '{guess}'?"
        elif hint is not None and guess:
            hint += f" (or did you mean '{guess}'?)"
        if hint is None:
            hint = accepts
        if what:
            msg = f"unknown {what} parameter '{key}': the constructor does not take it, so DeepSpeed fails at initialize"
        elif not pointer:
            msg = f"unknown top-level key '{key}': DeepSpeed silently ignores it, so the setting never applies"
        else:
            msg = f"unknown key '{key}' in {pointer}"
        out.append(Finding(severity="error", code="DS101", pointer=child, message=msg, hint=hint))
    return out


def _belongs_hint(key: str, value, *, here: str, index: dict) -> str | None:
    if key in FOREIGN_NAMES:
        section, name, why = FOREIGN_NAMES[key]
        return f"DeepSpeed calls it '{name}' {_where(section)} ({why}): write that instead"
    elsewhere = [p for p in index.get(key, ()) if p != here]
    if elsewhere:
        places = " or ".join(_where(p) for p in elsewhere[:3])
        return f"'{key}' belongs {places}: move it there"
    if isinstance(value, dict) and value:
        homes: dict[str, list[str]] = {}
        for sub in value:
            for p in index.get(sub, ()):
                homes.setdefault(p, []).append(sub)
        if homes:
            best = max(homes, key=lambda p: (len(homes[p]), p == "/"))
            if len(homes[best]) * 2 >= len(value):
                keys = ", ".join(homes[best][:4])
                return (f"'{key}' is not a DeepSpeed section; {keys} belong{'s' * (len(homes[best]) == 1)} "
                        f"{_where(best)}: move {'it' if len(homes[best]) == 1 else 'them'} there and remove '{key}'")
    return None


def _comment_key(key: str, child: str, section: str, *, rejects: bool, what: str) -> Finding:
    if rejects:
        why = (f"the {what} constructor does not take it, so DeepSpeed fails at initialize" if what else
               f"DeepSpeed parses {section} with a pydantic model that rejects unknown keys, comments included")
        return Finding(severity="error", code="DS111", pointer=child,
                       message=f"'{key}' looks like a comment, but {why}",
                       hint="move the comment to the top level, where DeepSpeed ignores it, or remove it")
    return Finding(severity="warning", code="DS111", pointer=child,
                   message=f"'{key}' looks like a comment: DeepSpeed ignores keys it does not read here",
                   hint="fine as a comment; `--ignore DS111` silences it")


def _closest_branch(errors):
    """The error of the ``anyOf`` branch the value came closest to: one of the right type (so ``0`` for
    ``"auto" | integer >= 1`` reports the minimum, not "must be 'auto'"), else one not asking for a
    constant, else the first."""
    branches: dict = {}
    for e in errors:
        branches.setdefault(e.relative_schema_path[0] if e.relative_schema_path else 0, []).append(e)

    def rank(item):
        _, errs = item
        return (any(e.validator == "type" for e in errs), any(e.validator in ("const", "enum") for e in errs))
    return min(branches.items(), key=rank)[1][0]


def _article(expected: str) -> str:
    return ("an " if expected[:1] in "aeiou" else "a ") + expected


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _pattern_choices(pattern: str) -> list[str] | None:
    # the schema writes case-insensitive enums as ^(?i:a|b|c)$
    if pattern.startswith("^(?i:") and pattern.endswith(")$"):
        return pattern[5:-2].split("|")
    return None
