"""Reading a config file the way DeepSpeed does, keeping where every value sits.

DeepSpeed loads a config file with ``hjson.load(..., object_pairs_hook=dict_raise_error_on_duplicate_keys)``
(``deepspeed/runtime/config.py``): comments and trailing commas are fine, duplicate keys are an error.
HF transformers reads the same file with plain ``json.load``, so hjson-only syntax gets a warning.

Values come from ``json`` (fast path) or ``hjson``; line and column of each JSON pointer come from
:func:`locate`, a small scanner for JSON with hjson's comments, trailing commas and quoteless keys.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import re
import sys

from dstk.findings import Finding

MAX_BYTES = 8 * 1024 * 1024
"""Largest file read. Real DeepSpeed configs are a few KiB; 8 MiB is a mistake, not a config."""
MAX_DEPTH = 64
"""Deepest nesting accepted. The schema is at most 7 levels deep; deeper input is garbage (and would
overflow Python's recursion in the parsers)."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Document:
    config: object | None
    """The parsed value (``None`` when it could not be parsed)."""
    positions: dict[str, tuple[int, int]]
    """JSON pointer -> (line, column), 1-based, of the key (or of the value for array items and the root)."""
    findings: tuple[Finding, ...]
    """What reading the text found (parse errors, duplicate keys, hjson-only syntax)."""


def escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


class _Lines:
    """Offset -> (line, column) by bisection over the line starts, found once: O(log n) a lookup, where
    counting newlines from the start for every key made a 200,000-key file quadratic."""

    def __init__(self, text: str):
        self.starts = [0]
        i = text.find("\n")
        while i >= 0:
            self.starts.append(i + 1)
            i = text.find("\n", i + 1)

    def __call__(self, offset: int) -> tuple[int, int]:
        index = bisect.bisect_right(self.starts, offset) - 1
        return index + 1, offset - self.starts[index] + 1


_TOKENS = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[\[\]{}]""", re.S)
"""A quoted string (skipped whole, so brackets inside it do not count) or a bracket."""


def _max_depth(text: str) -> int:
    """Deepest bracket nesting outside strings; one regex pass (a character loop took 1.5 s on 6 MB)."""
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        ch = match.group()
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif ch in "]}":
            depth -= 1
    return deepest


_SPACE = re.compile(r"[ \t\r\n,]*")
_QUOTED = {'"': re.compile(r'"((?:[^"\\]|\\.)*)"', re.S), "'": re.compile(r"'((?:[^'\\]|\\.)*)'", re.S)}


class _Scanner:
    """Positions of keys and values in JSON/hjson text. Tolerant: it stops quietly where the text is
    beyond it (hjson multi-line strings, quoteless values with brackets); values come from the real parser."""

    def __init__(self, text: str):
        self.text = text
        self.i = 0
        self.positions: dict[str, int] = {}
        self.duplicates: list[tuple[str, int]] = []

    def ws(self) -> None:
        t, n = self.text, len(self.text)
        while self.i < n:
            self.i = _SPACE.match(t, self.i).end()  # commas are separators (hjson makes them optional)
            if self.i >= n:
                return
            ch = t[self.i]
            if ch == "#" or t.startswith("//", self.i):
                end = t.find("\n", self.i)
                self.i = n if end < 0 else end
            elif t.startswith("/*", self.i):
                end = t.find("*/", self.i + 2)
                self.i = n if end < 0 else end + 2
            else:
                return

    def string(self) -> str:
        t = self.text
        quote = t[self.i]
        if t.startswith(quote * 3, self.i):
            end = t.find(quote * 3, self.i + 3)
            end = len(t) if end < 0 else end
            value = t[self.i + 3:end]
            self.i = end + 3
            return value
        match = _QUOTED[quote].match(t, self.i)
        if match:
            raw = match.group(1)
            if "\\" not in raw:
                self.i = match.end()
                return raw
            if quote == '"':
                try:
                    value = json.loads(match.group())
                except ValueError:
                    pass
                else:
                    self.i = match.end()
                    return value
        j = self.i + 1
        out = []
        while j < len(t) and t[j] != quote:
            if t[j] == "\\" and j + 1 < len(t):
                j += 1
            out.append(t[j])
            j += 1
        self.i = j + 1
        return "".join(out)

    def key(self) -> str:
        t = self.text
        if t[self.i] in "\"'":
            return self.string()
        j = t.find(":", self.i)
        if j < 0:
            raise ValueError("no colon")
        value = t[self.i:j].strip()
        self.i = j
        return value

    def value(self, pointer: str, depth: int, *, record: bool = True) -> None:
        self.ws()
        t = self.text
        if self.i >= len(t):
            return
        ch = t[self.i]
        if record:
            self.positions.setdefault(pointer, self.i)
        if depth > MAX_DEPTH:
            raise ValueError("too deep")
        if ch == "{":
            self.i += 1
            self.members(pointer, "}", depth)
        elif ch == "[":
            self.i += 1
            index = 0
            while True:
                self.ws()
                if self.i >= len(t):
                    return
                if t[self.i] == "]":
                    self.i += 1
                    return
                self.value(f"{pointer}/{index}", depth + 1)
                index += 1
        elif ch in "\"'":
            self.string()
        else:  # number, literal or hjson quoteless string: up to the end of the line or a delimiter
            j = self.i
            while j < len(t) and t[j] not in ",]}\n":
                if t.startswith("//", j) or t[j] == "#":
                    break
                j += 1
            self.i = max(j, self.i + 1)

    def members(self, pointer: str, close: str | None, depth: int) -> None:
        seen: set[str] = set()
        t = self.text
        while True:
            self.ws()
            if self.i >= len(t):
                return
            if close and t[self.i] == close:
                self.i += 1
                return
            start = self.i
            name = self.key()
            child = f"{pointer}/{escape(name)}"
            if name in seen:
                self.duplicates.append((child, start))
            else:
                seen.add(name)
                self.positions[child] = start
            self.ws()
            if self.i < len(t) and t[self.i] == ":":
                self.i += 1
            self.value(child, depth + 1, record=False)  # a key's position is where users look

    def run(self) -> None:
        self.ws()
        if self.i < len(self.text) and self.text[self.i] not in "{[":
            self.members("", None, 0)  # hjson allows the root braces to be left out
        else:
            self.value("", 0)


def locate(text: str) -> tuple[dict[str, tuple[int, int]], list[tuple[str, tuple[int, int]]]]:
    """Line/column of every pointer the scanner reached, and the duplicate keys it saw."""
    scanner = _Scanner(text)
    try:
        scanner.run()
    except (ValueError, IndexError):
        pass
    line_col = _Lines(text)
    pos = {p: line_col(o) for p, o in scanner.positions.items()}
    dups = [(p, line_col(o)) for p, o in scanner.duplicates]
    return pos, dups


def _pairs_without_duplicates(seen_duplicates: list[str]):
    def hook(pairs):
        out = {}
        for key, value in pairs:
            if key in out:
                seen_duplicates.append(key)
            out[key] = value
        return out

    return hook


def parse_bytes(data: bytes, *, max_bytes: int = MAX_BYTES) -> Document:
    """Parse a config file's bytes as DeepSpeed would; every problem becomes a finding."""

    def bad(code: str, message: str, hint: str, line=None, column=None) -> Document:
        return Document(config=None, positions={}, findings=(
            Finding(severity="error", code=code, message=message, hint=hint, line=line, column=column),))

    if len(data) > max_bytes:
        return bad("DS005", f"file is {len(data)} bytes, over the {max_bytes}-byte limit for a config",
                   "point dstk at the DeepSpeed config itself, not at a data or checkpoint file")
    if b"\0" in data:
        return bad("DS004", "file is binary (it contains NUL bytes), not a JSON/hjson config",
                   "point dstk at the DeepSpeed config JSON")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, col = _line_col(data[:exc.start].decode("utf-8", "replace"), exc.start)
        return bad("DS004", f"file is not UTF-8 text (byte {exc.start})", "save the config as UTF-8", line, col)
    return parse_text(text)


def parse_text(text: str) -> Document:
    if not text.strip():
        return Document(config=None, positions={}, findings=(Finding(
            severity="error", code="DS002", message="file is empty",
            hint='a DeepSpeed config is a JSON object, e.g. {"train_micro_batch_size_per_gpu": 1}'),))
    if _max_depth(text) > MAX_DEPTH:
        return Document(config=None, positions={}, findings=(Finding(
            severity="error", code="DS006", message=f"nesting is deeper than {MAX_DEPTH} levels",
            hint="a DeepSpeed config nests a few levels; this is not one"),))
    findings: list[Finding] = []
    hook_dups: list[str] = []
    try:
        config = json.loads(text, object_pairs_hook=_pairs_without_duplicates(hook_dups))
    except (json.JSONDecodeError, RecursionError) as json_exc:
        import hjson  # only for files that are not plain JSON

        hook_dups.clear()
        try:
            config = hjson.loads(text, object_pairs_hook=_pairs_without_duplicates(hook_dups))
        except Exception as exc:  # noqa: BLE001 -- hjson fails with IndexError/OverflowError/ValueError too: all are syntax
            return _unparseable(text, exc)
        findings.append(Finding(
            severity="warning", code="DS008", line=json_exc.lineno, column=json_exc.colno,
            message=f"not plain JSON ({json_exc.msg}); DeepSpeed reads it as hjson, but HF transformers and "
                    "accelerate read it with json.load and will fail",
            hint="remove comments and trailing commas, quote keys and strings, if HF or accelerate reads this file"))
    except ValueError:  # int() refuses literals past sys.get_int_max_str_digits() (4300 by default)
        huge = _HUGE_INTEGER.search(text)
        if huge is None:
            raise
        return _huge_integer(text, huge)
    positions, dups = locate(text)
    for pointer, (line, col) in dups:
        findings.append(Finding(
            severity="error", code="DS007", pointer=pointer, line=line, column=col,
            message=f"duplicate key '{pointer.rsplit('/', 1)[-1]}': DeepSpeed rejects the file "
                    "('Duplicate keys in DeepSpeed config'), json.load keeps the last one",
            hint="keep one of them"))
    if hook_dups and not dups:  # the scanner did not reach them (exotic hjson): report without a position
        for key in hook_dups:
            findings.append(Finding(severity="error", code="DS007", message=f"duplicate key '{key}'",
                                    hint="keep one of them"))
    findings.extend(_non_finite(config, ""))
    if not isinstance(config, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(config), "a number")
        findings.append(Finding(severity="error", code="DS003", line=1, column=1,
                                message=f"the top level is {kind}, not a JSON object",
                                hint='a DeepSpeed config is one object: {"train_micro_batch_size_per_gpu": 1, ...}'))
    return Document(config=config, positions=positions, findings=tuple(findings))


_HUGE_INTEGER = re.compile(r"[0-9]{%d,}" % (sys.get_int_max_str_digits() + 1 if hasattr(sys, "get_int_max_str_digits")
                                           and sys.get_int_max_str_digits() else 4301))


def _huge_integer(text: str, match: re.Match) -> Document:
    digits = len(match.group())
    line, col = _Lines(text)(match.start())
    return Document(config=None, positions={}, findings=(Finding(
        severity="error", code="DS009", line=line, column=col,
        message=f"a number with {digits} digits: DeepSpeed cannot read it (Python refuses to convert integers of "
                "more than 4300 digits) and no config value needs it",
        hint="write the intended number"),))


def _unparseable(text: str, exc: Exception) -> Document:
    line, col = getattr(exc, "lineno", None), getattr(exc, "colno", None)
    message = getattr(exc, "msg", None) or str(exc)
    hint = "fix the syntax at this line (DeepSpeed reads hjson: comments and trailing commas are fine)"
    start = text.rfind("/*")
    if start >= 0 and text.find("*/", start + 2) < 0 and not _in_string_line(text, start):
        line, col = _Lines(text)(start)
        message, hint = "a /* comment is never closed", "close it with */ (DeepSpeed's hjson reader fails on it)"
    elif isinstance(exc, OverflowError):
        message, hint = f"a number is too large for a float ({exc})", "write a finite number"
    elif not isinstance(exc, ValueError):  # hjson's own bugs on odd input (IndexError, ...): say so plainly
        message = f"{type(exc).__name__} in the hjson reader ({exc}); DeepSpeed fails the same way"
    return Document(config=None, positions={}, findings=(Finding(
        severity="error", code="DS001", message=f"cannot parse as JSON or hjson: {message}", hint=hint,
        line=line, column=col),))


def _in_string_line(text: str, offset: int) -> bool:
    line_start = text.rfind("\n", 0, offset) + 1
    return text.count('"', line_start, offset) % 2 == 1


def _non_finite(node, pointer: str) -> list[Finding]:
    """``NaN``, ``Infinity`` and literals that overflow a float (``1e400``): json.loads accepts them,
    DeepSpeed's hjson reader does not (a parse error, an OverflowError, or the string "NaN")."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.extend(_non_finite(value, f"{pointer}/{escape(key)}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_non_finite(value, f"{pointer}/{i}"))
    elif isinstance(node, float) and not math.isfinite(node):
        out.append(Finding(severity="error", code="DS009", pointer=pointer,
                           message=f"{pointer or 'the value'} is {json.dumps(node)} (NaN, Infinity or a number too "
                                   "large for a float): not JSON, and DeepSpeed's hjson reader rejects it",
                           hint="write a finite number"))
    return out


STDIN_LOCATION = "<stdin>"
"""How a config read from standard input (the path ``-``) is named in findings and reports."""


def read_stdin(*, stream=None, max_bytes: int = MAX_BYTES) -> tuple[bytes, Document]:
    """The bytes of standard input (``-`` on the command line, as ``cat -`` reads it) and their parse.

    At most ``max_bytes + 1`` bytes are read, so a runaway producer is cut off and reported (DS005)
    instead of filling memory; the bytes are returned too, for ``--deepspeed``, which hands DeepSpeed a file."""
    stream = stream if stream is not None else sys.stdin.buffer
    data = stream.read(max_bytes + 1)
    return data, parse_bytes(data, max_bytes=max_bytes)


def has_auto(node) -> bool:
    """Whether any value in a parsed config is ``"auto"`` (a file written for transformers' Trainer)."""
    if isinstance(node, dict):
        return any(has_auto(v) for v in node.values())
    if isinstance(node, list):
        return any(has_auto(v) for v in node)
    return node == "auto"
