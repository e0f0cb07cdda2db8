"""Environment for the ranks: ``--env K=V``, NCCL profiles and the ``.deepspeed_env`` file.

How a value reaches a remote rank depends on the launcher (deepspeed/launcher/runner.py and
multinode_runner.py, 0.19.8): for multi-node runs the runner reads ``.deepspeed_env`` with
``key, val = line.split('=', 1)``, strips the value and wraps it in ``"..."`` when it holds a
character outside ``[\\w@%+=:,./-]``. pdsh then hands ``export K="V";`` to a remote shell, while
mpirun/srun get ``K="V"`` as one argument with the quotes kept literally. So what a value may hold
depends on the launcher, and dstk refuses what cannot arrive intact instead of letting it be
mangled (or, worse, run: ``$(...)`` inside double quotes runs on every node).
"""

from __future__ import annotations

import re

from dstk.errors import DstkError
from dstk.findings import Finding
from dstk.resources import template

_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RUNNER_SAFE_RE = re.compile(r"[\w@%+=:,./-]*")  # the runner leaves these unquoted
# Inside the double quotes the runner adds, a shell still expands $ and ` and treats \ and " specially.
_DOUBLE_QUOTE_UNSAFE = set('$`\\"')

NCCL_PROFILES = ("ib", "roce", "ethernet", "single-node")
# Launchers whose remote side receives `.deepspeed_env` through a shell (pdsh) or as literal argv.
SHELL_EXPORT_LAUNCHERS = ("pdsh",)
ARGV_EXPORT_LAUNCHERS = ("openmpi", "mpich", "slurm")


def check_key(key: str) -> None:
    if not _KEY_RE.fullmatch(key):
        raise DstkError(f"environment variable name {key!r} is not valid",
                        hint="use letters, digits and '_', not starting with a digit")


def check_value(key: str, value: str) -> None:
    """Values no launcher can carry: newlines and NUL bytes."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise DstkError(f"{key}: the value holds a newline or NUL byte, which no launcher can pass on",
                        hint=f"give {key} a single-line value")


def parse_assignment(text: str) -> tuple[str, str]:
    """``K=V`` (the ``--env`` flag) -> (K, V). The value is taken verbatim."""
    key, sep, value = text.partition("=")
    if not sep:
        raise DstkError(f"--env {text!r}: expected KEY=VALUE", hint="e.g. --env NCCL_DEBUG=INFO")
    check_key(key)
    check_value(key, value)
    return key, value


def load_profile(name: str) -> dict[str, str]:
    """The variables of a shipped NCCL profile (``templates/nccl/<name>.env``), in file order."""
    if name not in NCCL_PROFILES:
        raise DstkError(f"unknown NCCL profile {name!r}", hint=f"choose one of {', '.join(NCCL_PROFILES)}")
    return parse_env_text(template("nccl", f"{name}.env").read_text(encoding="utf-8"))


def profile_comments(name: str) -> dict[str, str]:
    """{variable: the comment lines above it} for a shipped profile (for --dry-run and docs)."""
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in template("nccl", f"{name}.env").read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            pending.append(line.lstrip("# ").rstrip())
        elif "=" in line:
            comments[line.partition("=")[0]] = " ".join(pending)
            pending = []
        else:
            pending = []
    return comments


def parse_env_text(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise DstkError(f"line {number}: expected KEY=VALUE, got {line!r}")
        check_key(key)
        out[key] = value
    return out


def check_deepspeed_env(env: dict[str, str], *, launcher: str) -> None:
    """Refuse any value the runner would mangle on its way to the remote ranks for ``launcher``."""
    for key, value in env.items():
        check_key(key)
        check_value(key, value)
        if value != value.strip():
            raise DstkError(f"{key}: leading or trailing spaces would be stripped by the deepspeed runner",
                            hint=f"remove them from the value of {key}")
        if launcher in SHELL_EXPORT_LAUNCHERS:
            bad = sorted(set(value) & _DOUBLE_QUOTE_UNSAFE)
            if bad:
                raise DstkError(
                    f"{key}: the value holds {' '.join(repr(c) for c in bad)}, which the remote shell would expand "
                    "inside the runner's double quotes",
                    hint=f"set {key} in each node's own environment instead (e.g. its shell profile)")
        elif not _RUNNER_SAFE_RE.fullmatch(value):
            bad = sorted({c for c in value if not _RUNNER_SAFE_RE.fullmatch(c)})
            raise DstkError(
                f"{key}: the value holds {' '.join(repr(c) for c in bad)}; the {launcher} launcher would pass it "
                "with literal quotes around it",
                hint=f"use only letters, digits and @%+=:,./- in {key} (e.g. name the interface: =eth0), "
                     "or set it in each node's own environment")


def render_deepspeed_env(env: dict[str, str], *, launcher: str) -> str:
    """``.deepspeed_env`` text: ``KEY=VALUE`` lines, no blank or comment lines (the runner breaks on both)."""
    check_deepspeed_env(env, launcher=launcher)
    return "".join(f"{k}={v}\n" for k, v in env.items())


def lint_deepspeed_env(text: str) -> list[Finding]:
    """Problems in an existing ``.deepspeed_env`` that the runner would read (with line numbers)."""
    findings = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            findings.append(Finding(severity="error", code="DE001", line=number,
                                    message="blank line: the runner crashes on it (not enough values to unpack)",
                                    hint="delete the blank line"))
        elif line.lstrip().startswith("#"):
            findings.append(Finding(severity="error", code="DE002", line=number,
                                    message="comment line: the runner exports it, and with pdsh it comments out the rest "
                                            "of the remote command", hint="delete the comment line"))
        elif "=" not in line:
            findings.append(Finding(severity="error", code="DE003", line=number, message=f"expected KEY=VALUE, got {line!r}",
                                    hint="write KEY=VALUE"))
        elif not _KEY_RE.fullmatch(line.split("=", 1)[0].strip()):
            findings.append(Finding(severity="error", code="DE004", line=number,
                                    message=f"{line.split('=', 1)[0]!r} is not a variable name", hint="fix the name"))
    return findings
