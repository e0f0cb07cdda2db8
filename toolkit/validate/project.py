"""Project settings for ``dstk validate``: the ``[tool.dstk]`` table of the nearest pyproject.toml.

    [tool.dstk]
    ignore = ["DS111"]            # finding codes to drop
    world_size = 8                # as --world-size; also tensor_parallel, pipeline_stages
    hf = true                     # as --hf
    gpu = "v100-32gb"             # as --gpu: precision the GPU lacks is an error (DS250)
    deepspeed_version = "0.16"    # check against DeepSpeed 0.16's schema (0.14-0.19 ship; see versions.py)

    [[tool.dstk.overrides]]       # per-file settings; later tables win
    files = ["configs/hf/*.json"] # globs relative to the pyproject.toml's directory
    hf = true
    ignore = ["DS108"]

For each config file the nearest pyproject.toml above it that has a ``[tool.dstk]`` table is used.
Command-line flags win over the table; ``--ignore`` codes are added to the table's. Unknown keys and
wrong types in the table are usage errors (exit 2), never silently ignored.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import pathlib
import re

from dstk.errors import UsageError

_SETTINGS = {"ignore": list, "world_size": int, "tensor_parallel": int, "pipeline_stages": int, "hf": bool, "gpu": str}
_TOP_ONLY = {"deepspeed_version": str, "overrides": list}
_CODE = re.compile(r"^DS\d{3}$")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Settings:
    """Validation settings of one file (``None``: not set, the command line or the default decides)."""

    ignore: frozenset[str] = frozenset()
    """Finding codes dropped from the report."""
    world_size: int | None = None
    tensor_parallel: int | None = None
    pipeline_stages: int | None = None
    hf: bool | None = None
    gpu: str | None = None
    """As ``--gpu``: the catalog slug of the GPU the configs train on (precision checks, DS250)."""
    deepspeed_version: str | None = None
    """The DeepSpeed release the project targets (``dstk.validate.versions.select``: after the flag, before the
    installed deepspeed and pins)."""
    source: str | None = None
    """The pyproject.toml these came from."""


def parse_codes(text: str, *, where: str) -> frozenset[str]:
    """``"DS101,DS111"`` -> the codes; a malformed code is a usage error."""
    codes = [c.strip().upper() for c in text.split(",") if c.strip()]
    return _check_codes(codes, where=where)


def _check_codes(codes, *, where: str) -> frozenset[str]:
    from dstk.validate.codes import CODES

    for code in codes:
        if not isinstance(code, str) or not _CODE.match(code):
            raise UsageError(f"{where}: {code!r} is not a finding code", hint="codes look like DS101 (see `dstk "
                             "validate --help` and docs/validate.md)")
        if code not in CODES:
            raise UsageError(f"{where}: no finding has the code {code}",
                             hint="the codes are listed in docs/validate.md (Finding codes)")
    return frozenset(codes)


def _check(table: dict, *, where: str, allowed: dict) -> dict:
    out = {}
    for key, value in table.items():
        kind = allowed.get(key)
        if kind is None:
            from dstk.validate.schema import did_you_mean

            guess = did_you_mean(key, allowed)
            raise UsageError(f"{where}: unknown key '{key}'",
                             hint=f"did you mean '{guess}'?" if guess else "known keys: " + ", ".join(sorted(allowed)))
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(f"{where}: {key} must be a positive integer, got {value!r}", hint=f"e.g. {key} = 8")
        if kind is not int and not isinstance(value, kind):
            raise UsageError(f"{where}: {key} must be a {kind.__name__}, got {value!r}",
                             hint={"ignore": 'e.g. ignore = ["DS111"]', "hf": "hf = true"}.get(key, ""))
        if key == "ignore":
            value = _check_codes(value, where=f"{where}: ignore")
        out[key] = value
    return out


@functools.cache
def _load(path: str) -> dict | None:
    """The checked ``[tool.dstk]`` table of one pyproject.toml, or None when it has none."""
    import tomllib

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:  # a key given twice is one too: "Cannot overwrite a value (at line 3, ...)"
        import re

        at = re.search(r"at line (\d+), column (\d+)", str(exc))
        raise UsageError(f"not valid TOML ({exc})", location=f"{path}:{at[1]}:{at[2]}" if at else path,
                         hint="fix the file (a key given twice: keep one), or move [tool.dstk] out of it") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", hint="check its permissions") from None
    table = data.get("tool", {}).get("dstk") if isinstance(data.get("tool"), dict) else None
    if table is None:
        return None
    where = f"{path} [tool.dstk]"
    if not isinstance(table, dict):
        raise UsageError(f"{where}: must be a table", hint="write it as [tool.dstk]")
    checked = _check(table, where=where, allowed=_SETTINGS | _TOP_ONLY)
    overrides = []
    for i, entry in enumerate(checked.get("overrides", [])):
        at = f"{where} overrides[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("files"), list) or not entry["files"] or not all(
                isinstance(f, str) for f in entry["files"]):
            raise UsageError(f"{at}: needs files = [\"glob\", ...]",
                             hint='[[tool.dstk.overrides]]\nfiles = ["configs/hf/*.json"]\nhf = true')
        rest = _check({k: v for k, v in entry.items() if k != "files"}, where=at, allowed=_SETTINGS)
        overrides.append((tuple(entry["files"]), rest))
    checked["overrides"] = overrides
    return checked


def find_pyproject(config_path: str | os.PathLike) -> str | None:
    """The nearest pyproject.toml above ``config_path`` that has a ``[tool.dstk]`` table."""
    directory = pathlib.Path(os.path.abspath(config_path)).parent
    for folder in (directory, *directory.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and _load(str(candidate)) is not None:
            return str(candidate)
    return None


def settings_for(config_path: str | os.PathLike, *, pyproject: str | None = None) -> Settings:
    """The ``[tool.dstk]`` settings that apply to one config file (its overrides included)."""
    pyproject = pyproject or find_pyproject(config_path)
    if pyproject is None:
        return Settings()
    table = _load(pyproject) or {}
    merged = {k: v for k, v in table.items() if k in _SETTINGS}
    ignore = set(merged.pop("ignore", ()))
    relative = pathlib.Path(os.path.relpath(os.path.abspath(config_path), os.path.dirname(pyproject))).as_posix()
    for patterns, rest in table.get("overrides", []):
        if any(fnmatch.fnmatchcase(relative, p) or fnmatch.fnmatchcase(relative, p.lstrip("./")) for p in patterns):
            rest = dict(rest)
            ignore |= set(rest.pop("ignore", ()))
            merged.update(rest)
    return Settings(ignore=frozenset(ignore), deepspeed_version=table.get("deepspeed_version"), source=pyproject,
                    **merged)
