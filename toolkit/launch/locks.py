"""Stale op-build locks in the torch extensions cache.

DeepSpeed builds its C++ ops (``deepspeed_shm_comm`` on CPU, ``fused_adam``, ...) just in time
with ``torch.utils.cpp_extension``, which guards each build directory with a ``lock`` file
(``torch.utils.file_baton.FileBaton``): the builder creates it with ``O_CREAT | O_EXCL``, keeps
the descriptor open while it builds, and deletes it at the end. A build killed half-way leaves
the file behind and every later start waits for it forever, silently. A lock that no live
process holds open is stale; this module finds those, without importing torch.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from dstk.errors import DstkError


def extensions_root(environ=os.environ) -> Path:
    """Where torch builds extensions: ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``."""
    root = environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root) if root else Path.home() / ".cache" / "torch_extensions"


def open_files(*, proc_dir: str = "/proc") -> set[str]:
    """Every file some process we can see holds open: the targets of the ``PROC_DIR/PID/fd/*`` links
    (an unlinked file's ends in `` (deleted)``); empty where there is no /proc."""
    held: set[str] = set()
    proc = Path(proc_dir)
    if not proc.is_dir():
        return held
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            for fd in (pid_dir / "fd").iterdir():
                try:
                    held.add(os.readlink(fd))
                except OSError:
                    continue
        except OSError:  # gone, or another user's process
            continue
    return held


def lock_files(root: Path) -> set[Path]:
    """Every lock file under ``root`` (an op's build directory, or one level deeper), held or not."""
    return {*root.glob("*/lock"), *root.glob("*/*/lock")} if root.is_dir() else set()


def clear_locks_left(root: Path, *, before: set[Path]) -> list[Path]:
    """Remove the stale locks under ``root`` that were not there ``before`` (``lock_files`` when a run
    started): what a build of that run left when it was killed half-way. Call it once every process
    of the run has ended and only for a run whose ranks all ran on this machine (another host's build
    holds a lock in a shared cache without this machine seeing it). Returns the removed paths."""
    removed = []
    for lock in find_stale_locks(root):
        if lock in before:
            continue
        try:
            lock.unlink()
            removed.append(lock)
        except OSError:  # released meanwhile, or not ours to remove
            continue
    return removed


def find_stale_locks(root: Path | None = None) -> list[Path]:
    """Lock files under ``root`` that no live process holds open."""
    root = extensions_root() if root is None else Path(root)
    if not root.is_dir():
        return []
    locks = sorted(lock_files(root))
    if not locks:
        return []
    held = open_files()
    return [p for p in locks if str(p.resolve()) not in held and str(p) not in held]


def rm_command(paths, *, host: str | None = None) -> str:
    """The shell command that removes ``paths``: ``rm PATH...`` here, ``ssh HOST 'rm PATH...'`` on ``host``."""
    rm = shlex.join(["rm", *map(str, paths)])
    return rm if host is None else shlex.join(["ssh", host, rm])


def check_op_locks(root: Path | None = None) -> None:
    """Raise a ``DstkError`` saying how to clear stale locks, instead of letting the launch hang."""
    stale = find_stale_locks(root)
    if stale:
        listed = " ".join(str(p) for p in stale)
        raise DstkError(
            f"stale op-build lock(s) in the torch extensions cache, left by a build that was killed: {listed}; "
            "DeepSpeed would wait for them forever",
            hint=f"no process holds them open, so remove them: {rm_command(stale)} "
                 "(the op is rebuilt on the next start)")


REMOTE_CONNECT_S, REMOTE_TIMEOUT_S = 10, 30
"""How long the scan waits for a node's ssh connection (pdsh's own default), and for its answer, before the
launch goes on without it: an unreachable node then fails the launch itself, with the runner's message."""
LOCKS_TAG = "DSTK_STALE_LOCKS "


def remote_stale_locks(hosts, *, python: str, cwd: str, root: str | None = None, env=None,
                       timeout_s: float = REMOTE_TIMEOUT_S) -> dict[str, list[str]]:
    """``{host: stale lock paths}`` of every host's torch extensions cache, asked at once by pdsh over ssh,
    as the runner reaches the nodes (``PDSH_SSH_ARGS_APPEND`` and ``~/.ssh/config`` apply alike), with the
    runner's ``cd CWD; PYTHON`` and ``python -m dstk.launch.probe --locks [ROOT]`` there (no torch import,
    ~0.1 s). ``root``: the ranks' cache when the launch sets ``TORCH_EXTENSIONS_DIR`` (``--env``); None: the
    node's own default, as its ranks see it. A host that does not answer (ssh fails, no dstk at ``python``)
    is left out: the launch itself says what fails there, and ``dstk doctor --hostfile`` checks it all."""
    import json
    import subprocess

    from dstk.launch.nodefail import _NODE_PREFIX_RE

    hosts = list(hosts)
    if not hosts:
        return {}
    remote = (f"cd {shlex.quote(cwd)}; {shlex.quote(python)} -m dstk.launch.probe --locks"
              + (f" {shlex.quote(root)}" if root else ""))
    argv = ["pdsh", "-S", "-t", str(REMOTE_CONNECT_S), "-u", str(int(timeout_s)), "-w", ",".join(hosts), remote]
    try:
        done = subprocess.run(argv, env={**(os.environ if env is None else env), "PDSH_RCMD_TYPE": "ssh"},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s + 30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        m = _NODE_PREFIX_RE.match(line)
        if m is None or not line[m.end():].startswith(LOCKS_TAG):
            continue
        try:
            stale = json.loads(line[m.end() + len(LOCKS_TAG):]).get("stale")
        except (ValueError, AttributeError):
            continue
        if isinstance(stale, list) and stale:
            found[m.group(1)] = [str(p) for p in stale]
    return {host: found[host] for host in hosts if host in found}


def check_remote_op_locks(hosts, *, python: str, cwd: str, root: str | None = None, env=None) -> None:
    """Raise a ``DstkError`` naming each host's stale locks and the ssh rm that clears them: a multi-node
    launch would hang on those nodes, and this machine cannot see their caches."""
    stale = remote_stale_locks(hosts, python=python, cwd=cwd, root=root, env=env)
    if stale:
        listed = "; ".join(f"on {host}: {' '.join(paths)}" for host, paths in stale.items())
        fixes = "; ".join(rm_command(paths, host=host) for host, paths in stale.items())
        raise DstkError(
            f"stale op-build lock(s) in a node's torch extensions cache, left by a build that was killed ({listed}); "
            "DeepSpeed would wait for them forever on that node and the whole launch with it",
            hint=f"no process there holds them open, so remove them: {fixes} (the op is rebuilt on the next "
                 "start; `dstk doctor --hostfile` checks every node)")
