"""Findings: the data every checker in dstk reports.

A finding has a severity, a stable code, a location (a JSON pointer plus line and column in the
file when known), a message and a fix hint. Checkers collect all of them; reporters render them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Literal

Severity = Literal["error", "warning"]


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Finding:
    severity: Severity
    """"error" makes the input invalid; "warning" does not (unless --strict)."""
    code: str
    """Stable identifier, e.g. ``DS101``; tests and suppressions key on it."""
    message: str
    """What is wrong, in one sentence."""
    pointer: str = ""
    """RFC 6901 JSON pointer to the offending value (``""`` is the whole document)."""
    line: int | None = None
    """1-based line in the source file, when known."""
    column: int | None = None
    """1-based column in the source file, when known."""
    hint: str | None = None
    """How to fix it."""

    def __post_init__(self) -> None:
        if self.severity not in ("error", "warning"):
            raise ValueError(f"severity: expected 'error' or 'warning', got {self.severity!r}")

    def to_dict(self) -> dict:
        return {
            "severity": self.severity,
            "code": self.code,
            "pointer": self.pointer,
            "line": self.line,
            "column": self.column,
            "message": self.message,
            "hint": self.hint,
        }


def has_errors(findings: Iterable[Finding], *, strict: bool = False) -> bool:
    return any(f.severity == "error" or (strict and f.severity == "warning") for f in findings)


def render_text(path: str, findings: Iterable[Finding]) -> str:
    lines = []
    for f in findings:
        loc = path
        if f.line is not None:
            loc += f":{f.line}"
            if f.column is not None:
                loc += f":{f.column}"
        where = f" at {f.pointer}" if f.pointer else ""
        lines.append(f"{loc}: {f.severity} {f.code}{where}: {f.message}")
        if f.hint:
            lines.append(f"    fix: {f.hint}")
    return "\n".join(lines)


def _gh_escape(text: str, *, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def render_github(path: str, findings: Iterable[Finding]) -> str:
    """GitHub Actions workflow-command annotations, one per finding."""
    out = []
    for f in findings:
        props = [f"file={_gh_escape(path, prop=True)}"]
        if f.line is not None:
            props.append(f"line={f.line}")
        if f.column is not None:
            props.append(f"col={f.column}")
        props.append(f"title={_gh_escape(f.code, prop=True)}")
        body = f.message + (f" (fix: {f.hint})" if f.hint else "")
        if f.pointer:
            body = f"{f.pointer}: {body}"
        out.append(f"::{f.severity} {','.join(props)}::{_gh_escape(body)}")
    return "\n".join(out)


def render_json(files: list[tuple[str, list[Finding]]], *, strict: bool = False) -> str:
    return json.dumps(
        {
            "files": [
                {
                    "path": path,
                    "valid": not has_errors(fs, strict=strict),
                    "findings": [f.to_dict() for f in fs],
                }
                for path, fs in files
            ]
        },
        indent=2,
    )


SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _sarif_uri(path: str) -> dict:
    import pathlib

    p = pathlib.PurePath(path)
    if p.is_absolute():
        return {"uri": pathlib.Path(path).as_uri()}
    return {"uri": p.as_posix(), "uriBaseId": "%SRCROOT%"}


def render_sarif(files: list[tuple[str, list[Finding]]], *, rules: dict[str, tuple[str, str]], tool: str,
                 version: str, information_uri: str | None = None, help_uri: str | None = None) -> str:
    """SARIF 2.1.0 (OASIS, https://docs.oasis-open.org/sarif/sarif/v2.1.0/) for GitHub code scanning: one run,
    one rule per finding code (``rules``: code -> (severity, description)), one result per finding with the
    file, line and column (paths relative to the repository root become ``%SRCROOT%``-relative URIs)."""
    used = sorted({f.code for _, fs in files for f in fs} | set(rules))
    index = {code: i for i, code in enumerate(used)}
    rule_objs = []
    for code in used:
        severity, text = rules.get(code, ("error", code))
        rule = {"id": code, "shortDescription": {"text": text}, "fullDescription": {"text": text},
                "help": {"text": text, "markdown": text},
                "defaultConfiguration": {"level": "warning" if severity == "warning" else "error"}}
        if help_uri:
            rule["helpUri"] = help_uri
        rule_objs.append(rule)
    results = []
    for path, findings in files:
        for f in findings:
            location: dict = {"artifactLocation": _sarif_uri(path)}
            if f.line is not None:
                location["region"] = {"startLine": f.line, **({"startColumn": f.column} if f.column else {})}
            result = {"ruleId": f.code, "ruleIndex": index[f.code], "level": f.severity,
                      "message": {"text": (f"{f.pointer}: " if f.pointer else "") + f.message
                                  + (f" (fix: {f.hint})" if f.hint else "")},
                      "locations": [{"physicalLocation": location}]}
            if f.pointer:
                result["locations"][0]["logicalLocations"] = [{"fullyQualifiedName": f.pointer, "kind": "member"}]
            results.append(result)
    driver = {"name": tool, "version": version, "semanticVersion": version, "rules": rule_objs}
    if information_uri:
        driver["informationUri"] = information_uri
    return json.dumps({"$schema": SARIF_SCHEMA, "version": "2.1.0",
                       "runs": [{"tool": {"driver": driver}, "results": results}]}, indent=2)
