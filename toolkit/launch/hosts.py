"""Hosts: the hostfile, ``--hosts h1:8,h2:8`` and the runner's ``--include``/``--exclude`` filters.

The deepspeed runner reads a hostfile line by line with the regex ``^(\\S+)\\s+slots=(\\d+)``,
skips blank and ``#`` lines, ignores anything after the match and refuses duplicates
(deepspeed/launcher/runner.py, 0.19.8). dstk is stricter where the runner is silent: host names
must be plain DNS names or IPv4 addresses (they end up in ssh, pdsh and shell commands), slots
must be positive, and trailing text other than a comment is reported. Every problem is a
``Finding`` with its line number, all of them reported together.
"""

from __future__ import annotations

import dataclasses
import re

from dstk.errors import DstkError
from dstk.findings import Finding

# A DNS name (labels of letters, digits, '-', '_' separated by '.') or an IPv4 address. No
# spaces, quotes, ';', '$', '@' or ':' -- those would break the runner's NODE_SPEC syntax or
# a shell command line.
_HOST_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?")
_LINE_RE = re.compile(r"^(\S+)\s+slots=(\S+)(.*)$")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Host:
    name: str
    """Host name or IPv4 address, as ssh and the runner see it."""
    num_slots: int
    """Ranks (GPUs, or CPU ranks on a CPU-only machine) to start on this host."""
    line: int | None = None
    """1-based line in the hostfile it came from, when it came from one."""

    def __post_init__(self) -> None:
        if not is_valid_hostname(self.name):
            raise ValueError(f"name: not a valid host name: {self.name!r}")
        if not isinstance(self.num_slots, int) or isinstance(self.num_slots, bool) or self.num_slots < 1:
            raise ValueError(f"num_slots: expected a positive integer, got {self.num_slots!r}")


def is_valid_hostname(name: str) -> bool:
    return bool(_HOST_RE.fullmatch(name)) and ".." not in name


def _finding(code: str, line: int, message: str, hint: str) -> Finding:
    return Finding(severity="error", code=code, line=line, message=message, hint=hint)


MAX_SLOTS = 1024
"""Ranks on one node: no machine has more GPUs, and the runner would start that many processes."""

_OTHER_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
"""Characters ``str.splitlines`` breaks at but the runner's ``readlines`` does not."""


def check_hostfile(text: str) -> tuple[list[Host], list[Finding]]:
    """Parse hostfile text; return the hosts in rank order and every problem found (with line numbers).

    Lines are split as the runner reads the file (``readlines`` in text mode: ``\n`` once ``\r\n``
    and ``\r`` are translated), never at the other characters Python counts as line breaks: a line
    holding one of those is refused, since dstk and the runner would read it differently."""
    hosts: list[Host] = []
    findings: list[Finding] = []
    first_line: dict[str, int] = {}
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    for number, raw in enumerate(text.split("\n"), start=1):
        odd = _OTHER_BREAKS.search(raw)
        if odd:
            findings.append(_finding("HF007", number, f"the line holds {odd.group()!r}, which the deepspeed runner "
                                     "does not read as a line break (it reads the rest as part of this line)",
                                     "put each host on its own line, separated by a plain newline"))
            continue
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE_RE.match(line)
        if m is None:
            findings.append(_finding("HF001", number, f"bad entry {line!r}: expected 'HOST slots=N'",
                                     "write one host per line as 'worker-0 slots=8' (no spaces around '=')"))
            continue
        name, slots_text, rest = m.group(1), m.group(2), m.group(3).strip()
        ok = True
        if not is_valid_hostname(name):
            findings.append(_finding("HF002", number, f"host name {name!r} is not a plain DNS name or IPv4 address",
                                     "use letters, digits, '.', '-' and '_' only"))
            ok = False
        digits = slots_text.isascii() and slots_text.isdigit()
        shown = slots_text if len(slots_text) <= 20 else slots_text[:20] + f"... ({len(slots_text)} characters)"
        if not digits or not slots_text.lstrip("0"):
            findings.append(_finding("HF003", number, f"slots={shown}: expected a positive integer (digits 0-9)",
                                     "give the number of GPUs on the host, e.g. slots=8"))
            ok = False
        elif len(slots_text.lstrip("0")) > 4 or int(slots_text) > MAX_SLOTS:
            findings.append(_finding("HF008", number, f"slots={shown}: more than {MAX_SLOTS} ranks on one host",
                                     "give the number of GPUs on the host, e.g. slots=8; the runner would start "
                                     "that many processes"))
            ok = False
        if rest and not rest.startswith("#"):
            findings.append(Finding(severity="warning", code="HF004", line=number,
                                    message=f"text after the slot count is ignored by the deepspeed runner: {rest!r}",
                                    hint="remove it, or turn it into a '# comment'"))
        if name in first_line:
            findings.append(_finding("HF005", number, f"host {name!r} is listed twice (first on line {first_line[name]})",
                                     "list each host once; the runner refuses duplicates"))
            continue
        first_line[name] = number
        if ok:
            hosts.append(Host(name=name, num_slots=int(slots_text), line=number))
    if not hosts and not findings:
        findings.append(_finding("HF006", 1, "the hostfile lists no hosts", "add lines like 'worker-0 slots=8'"))
    return hosts, findings


def parse_hosts_flag(value: str) -> list[Host]:
    """``h1:8,h2:8`` -> hosts in that order (the ``--hosts`` flag)."""
    hosts: list[Host] = []
    seen: set[str] = set()
    for item in value.split(","):
        item = item.strip()
        name, sep, slots = item.rpartition(":")
        if not sep or not name or not (slots.isascii() and slots.isdigit()) or len(slots) > 6 or not 1 <= int(slots) <= MAX_SLOTS:
            raise DstkError(f"--hosts: bad entry {item!r}: expected HOST:SLOTS", hint="e.g. --hosts worker-0:8,worker-1:8")
        if not is_valid_hostname(name):
            raise DstkError(f"--hosts: {name!r} is not a plain DNS name or IPv4 address",
                            hint="use letters, digits, '.', '-' and '_' only")
        if name in seen:
            raise DstkError(f"--hosts: host {name!r} is listed twice", hint="list each host once")
        seen.add(name)
        hosts.append(Host(name=name, num_slots=int(slots)))
    return hosts


def render_hostfile(hosts: list[Host] | tuple[Host, ...]) -> str:
    return "".join(f"{h.name} slots={h.num_slots}\n" for h in hosts)


def parse_filter(spec: str, flag: str) -> dict[str, list[int] | None]:
    """``NAME[:SLOT[,SLOT...]][@NAME...]`` -> {name: slots or None for the whole host}."""
    out: dict[str, list[int] | None] = {}
    for node in spec.split("@"):
        name, sep, slots = node.partition(":")
        if not is_valid_hostname(name):
            raise DstkError(f"{flag} {spec!r}: {name!r} is not a host name", hint="the syntax is NAME[:SLOT,SLOT][@NAME...]")
        if sep:
            try:
                ids = sorted({int(s) for s in slots.split(",")})
            except ValueError:
                raise DstkError(f"{flag} {spec!r}: slots must be integers, got {slots!r}",
                                hint="e.g. worker-0:0,1") from None
            out[name] = ids
        else:
            out[name] = None
    return out


def apply_filters(hosts: list[Host] | tuple[Host, ...], *, include: str = "", exclude: str = "") -> dict[str, list[int]]:
    """What the runner will use: {host: slot ids}, in hostfile order, as ``parse_inclusion_exclusion`` does."""
    if include and exclude:
        raise DstkError("--include and --exclude cannot be combined", hint="use one of them")
    pool = {h.name: list(range(h.num_slots)) for h in hosts}
    spec, flag = (include, "--include") if include else (exclude, "--exclude")
    if not spec:
        return pool
    wanted = parse_filter(spec, flag)
    for name, ids in wanted.items():
        if name not in pool:
            raise DstkError(f"{flag}: host {name!r} is not in the host list", hint=f"hosts are: {', '.join(pool)}")
        for i in ids or []:
            if i not in pool[name]:
                raise DstkError(f"{flag}: host {name!r} has no slot {i}",
                                hint=f"{name} has slots 0..{len(pool[name]) - 1}")
    if include:
        return {n: (wanted[n] if wanted[n] is not None else pool[n]) for n in pool if n in wanted}
    out = {}
    for n, ids in pool.items():
        if n in wanted:
            if wanted[n] is None:
                continue
            ids = [i for i in ids if i not in wanted[n]]
            if not ids:
                continue
        out[n] = ids
    return out
