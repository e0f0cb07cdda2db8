"""One failed node stops the whole multi-node (pdsh) launch: every node's ranks, found by the run's tag.

What DeepSpeed 0.19.8 does on its own when the ranks of one node fail (seen here with the loopback
sshd and pdsh of tests/services.py, unless a file is cited):

- launch.py on the failed node stops that node's other ranks and exits with the rank's code
  (deepspeed/launcher/launch.py ``main``: a child's non-zero exit calls ``sigkill_handler``). The
  other nodes' launch.py know nothing of it: their ranks wait in their next collective until the
  process group's timeout. NCCL does not notice a dead peer (10 min by DeepSpeed's default,
  ``DEEPSPEED_TIMEOUT`` in deepspeed/constants.py; 30 min under HF's ``ddp_timeout``). gloo does
  when the peer's socket closes ("Connection closed by peer", seen), but not a rank that waits
  elsewhere (the rendezvous store, a peer host that vanished without closing its sockets).
- pdsh (``-S``: exit with the largest remote code) waits for every node; it prints
  ``pdsh@HERE: NODE: ssh exited with exit code N`` when one node's command ends non-zero.
- The runner stops ranks only on SIGINT/SIGTERM, with ``pdsh -w HOSTS pkill -f "PYTHON -u -m
  deepspeed.launcher.launch"`` (multinode_runner.py ``PDSHRunner.get_cmd``): every launch.py of that
  interpreter on those hosts, other runs' too.
- Killing pdsh, or the ssh connections, leaves launch.py and the ranks running on every node
  (seen: reparented to init, still printing): sshd sends no SIGHUP to a command without a tty.

So ``dstk launch`` tags each launch with ``RUN_TAG_VAR=<random>`` in the runner's environment. The
runner exports every variable whose name starts with ``PYTHON`` to each node (runner.py
``EXPORT_ENVS``); Python ignores an unknown ``PYTHON_`` variable. Every launch.py, rank and process
a rank starts carries it. On the first failure -- a rank's report of a non-zero exit that the
launcher did not cause, or pdsh's "ssh exited with exit code N" / "ssh killed by signal N" (a dropped
connection, whose node's ranks live on) -- ``NodeWatch`` runs
``python -m dstk.launch.nodefail --tag TAG`` on every host over pdsh (``stop_command``). That
signals only this user's processes whose environment holds the tag and that are a rank (launch.py
sets ``LOCAL_RANK`` for each) or launch.py itself: SIGTERM, then SIGKILL after a grace
(``stop_tagged``). The runner, pdsh and ssh on the launching node carry the tag too, but are
neither, and are left alone. Each node's launch.py then exits, ssh ends, pdsh and the runner exit.
A runner still running ``RUNNER_WAIT_SECONDS`` later (a node that cannot be reached) has its
process tree on this machine killed with SIGKILL -- never SIGINT/SIGTERM, which would run the
runner's broad pkill.

Ctrl-C, SIGTERM and SIGHUP take the same path (``NodeWatch.interrupt``). A terminal sends Ctrl-C's SIGINT to its
whole foreground process group; the runner, pdsh and ssh would get it too, and the runner's handler
(runner.py ``sigkill_handler``: SIGINT then SIGTERM to pdsh, then the pkill above) would kill other runs'
launch.py. So ``dstk launch`` starts the runner in a session of its own (``start_new_session``: the
terminal's SIGINT reaches dstk only; pdsh and ssh inherit the runner's session), catches SIGINT/SIGTERM/SIGHUP
itself, runs the tagged stop on every host, and waits for the runner to end as after a failure; it never
signals the runner, except SIGKILL to its tree when it outlives ``RUNNER_WAIT_SECONDS``. It then exits
128 + the signal (130, 143, 129) with one line saying what it stopped.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

RUN_TAG_VAR = "PYTHON_DSTK_RUN_TAG"
"""Carries the run's tag to every node (the runner exports ``PYTHON*`` variables, runner.py ``EXPORT_ENVS``)."""

STOP_TAG = "DSTK_NODE_STOP "
"""Prefix of the line ``python -m dstk.launch.nodefail`` prints on each node (JSON after it)."""

GRACE_SECONDS = 5.0
"""From SIGTERM to SIGKILL for the tagged processes of a node."""

RUNNER_WAIT_SECONDS = 30.0
"""How long the runner may take to end once every node was told to stop, before its tree is killed."""

RESTOP_SECONDS = 5.0
"""While the runner lives on after a stop, the stop runs again this often (``NodeWatch._stop``)."""

_LAUNCH_MODULE = b"deepspeed.launcher.launch"


def new_run_tag() -> str:
    """A fresh random tag (16 hex digits): no two launches share one."""
    return secrets.token_hex(8)


def _environ(pid: int, proc_root: Path) -> dict[bytes, bytes] | None:
    try:
        raw = (proc_root / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return None
    return dict(item.partition(b"=")[::2] for item in raw.split(b"\0") if item)


def tagged_pids(*, tag: str, proc_root: str | os.PathLike = "/proc", uid: int | None = None) -> list[int]:
    """Pids of ``uid``'s processes (default: ours) whose environment holds ``RUN_TAG_VAR=tag`` and that are
    a rank or a process a rank started (``LOCAL_RANK`` set, as launch.py sets it for each rank) or a
    node's launch.py (its command line runs ``deepspeed.launcher.launch``); never this process."""
    root = Path(proc_root)
    uid = os.getuid() if uid is None else uid
    want = tag.encode()
    found = []
    for entry in root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        env = _environ(int(entry.name), root)
        if env is None or env.get(RUN_TAG_VAR.encode()) != want:
            continue
        if b"LOCAL_RANK" not in env:
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not runs_launch_module(cmdline):
                continue
        found.append(int(entry.name))
    return sorted(found)


def runs_launch_module(argv: list[bytes]) -> bool:
    """``argv`` is ``PYTHON [FLAGS] -m deepspeed.launcher.launch ...`` (pure). Only the interpreter's own
    ``-m`` counts: pdsh's and ssh's argv hold the same words as parts of the remote command."""
    for i, arg in enumerate(argv[1:], start=1):
        if arg == b"-m":
            return argv[i + 1:i + 2] == [_LAUNCH_MODULE]
        if not arg.startswith(b"-"):
            return False
    return False


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class StopReport:
    """What ``stop_tagged`` did on one node."""

    terminated: tuple[int, ...]
    """Pids sent SIGTERM."""
    killed: tuple[int, ...]
    """Pids still alive after the grace, sent SIGKILL."""
    left: tuple[int, ...]
    """Pids still alive at the end (none unless a process is stuck in the kernel)."""


def _alive(pid: int, proc_root: Path) -> bool:
    try:
        state = (proc_root / str(pid) / "stat").read_text().rsplit(") ", 1)[-1][:1]
    except OSError:
        return False
    return state not in ("Z", "X")


def _signal(pids: list[int], signum: int) -> list[int]:
    sent = []
    for pid in pids:
        try:
            os.kill(pid, signum)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return sent


def stop_tagged(*, tag: str, grace_seconds: float = GRACE_SECONDS, proc_root: str | os.PathLike = "/proc") -> StopReport:
    """SIGTERM the run's processes on this machine (``tagged_pids``), SIGKILL what is left after
    ``grace_seconds`` (and any tagged process that appeared meanwhile), then wait up to 5 s for them to go."""
    root = Path(proc_root)
    terminated = _signal(tagged_pids(tag=tag, proc_root=root), signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(_alive(p, root) for p in terminated):
        time.sleep(0.1)
    rest = sorted({p for p in terminated if _alive(p, root)} | set(tagged_pids(tag=tag, proc_root=root)))
    killed = _signal(rest, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p, root) for p in killed):
        time.sleep(0.1)
    return StopReport(terminated=tuple(terminated), killed=tuple(killed),
                      left=tuple(p for p in killed if _alive(p, root)))


def stop_command(*, hosts: list[str], tag: str, python: str, cwd: str,
                 grace_seconds: float = GRACE_SECONDS) -> list[str]:
    """The pdsh command that runs ``stop_tagged`` on every host (pure); run it with ``PDSH_RCMD_TYPE=ssh``,
    as the runner runs its own. The remote shell gets the same ``cd CWD; PYTHON ...`` the runner sends."""
    remote = (f"cd {shlex.quote(cwd)}; {shlex.quote(python)} -m dstk.launch.nodefail --tag {shlex.quote(tag)} "
              f"--grace-seconds {grace_seconds:g}")
    return ["pdsh", "-S", "-w", ",".join(hosts), remote]


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class NodeFailure:
    """The first failure seen in a multi-node launch's output."""

    node: str
    """The host as pdsh names it (the hostfile's name); empty when the line had no pdsh prefix."""
    rank: int | None
    """Global rank, when a rank's report gave it (pdsh's own line does not)."""
    returncode: int
    """The rank's exit code (``-N`` for signal N), or the node's ssh exit code."""
    line: str
    """The output line that told."""

    def describe(self, *, node_ranks: tuple[int, ...] = ()) -> str:
        """One line; ``node_ranks``: the global ranks the node ran, named when the line gave no rank.
        launch.py exits ``256 - N`` when a rank was killed by signal N (``sys.exit(-N)``: 247 for SIGKILL,
        seen here); ssh exits 255 for its own failures (the node went down or cannot be reached) and, seen
        here, when the remote command ended by a signal."""
        where = f"node {self.node}" if self.node else "a node"
        if self.rank is None:
            notes = []
            if self.returncode == 255:
                notes.append("ssh's code: the connection failed, or the node's launcher was ended by a signal")
            elif 192 <= self.returncode <= 254:
                try:
                    notes.append(f"a rank was killed by {signal.Signals(256 - self.returncode).name}")
                except ValueError:
                    pass
            if node_ranks:
                notes.append(f"rank{'s' if len(node_ranks) > 1 else ''} {', '.join(map(str, node_ranks))} ran there")
            if self.returncode < 0:  # pdsh: "ssh killed by signal N" (the connection's client on this machine)
                text = f"{where} failed: its ssh connection was killed by {_signal_name(-self.returncode)}"
            else:
                text = f"{where} failed: its launcher exited with code {self.returncode}"
            return text + (f" ({'; '.join(notes)})" if notes else "")
        if self.returncode < 0:
            try:
                how = f"was killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                how = f"was killed by signal {-self.returncode}"
        else:
            how = f"exited with code {self.returncode}"
        return f"{where} failed: rank {self.rank} {how}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_PDSH_EXIT_RE = re.compile(r"^pdsh@[^:\s]+: ([A-Za-z0-9._-]+): ssh (exited with exit code|killed by signal) (\d+)\s*$")
_NODE_PREFIX_RE = re.compile(r"^([A-Za-z0-9._-]+): ")
_RANK_PREFIX_RE = re.compile(r"^\[rank (\d+)\] ")
_WHY_RE = re.compile(r"\b\w*(Error|Exception|Interrupt)\b|\bKilled\b|\bterminate called\b|\bAborted\b")
_LAUNCH_EXIT_RE = re.compile(r"exits with return code = -?\d+")
"""launch.py's line for a rank that ended non-zero (launch.py ``sigkill_handler``): the why of a rank killed by
a signal, which prints no error of its own."""


def failure_from_line(line: str) -> NodeFailure | None:
    """The failure ``line`` reports (pure): a rank's non-zero report that the launcher did not cause,
    behind pdsh's ``NODE: `` prefix, or pdsh's ``ssh exited with exit code N`` (N > 0); else ``None``."""
    from dstk.launch.run import parse_report

    m = _PDSH_EXIT_RE.match(line)
    if m is not None:
        code = int(m.group(3)) if m.group(2).startswith("exited") else -int(m.group(3))
        return NodeFailure(node=m.group(1), rank=None, returncode=code, line=line.rstrip("\n")) if code else None
    report = parse_report(line)
    if report is None or report.returncode == 0 or report.stopped:
        return None
    prefix = _NODE_PREFIX_RE.match(line)
    return NodeFailure(node=prefix.group(1) if prefix else "", rank=report.rank, returncode=report.returncode,
                       line=line.rstrip("\n"))


def why_line(lines: list[str], *, failure: NodeFailure) -> str | None:
    """The last line of the failed rank's (or node's) own output that names an error (pure): the last
    ``...Error: ...``/``Killed``/``terminate called`` line behind its ``NODE: [rank R] `` prefix; else, for a
    node, the last line where its launch.py says a rank ended non-zero."""
    return (_last_match(lines, failure=failure, pattern=_WHY_RE)
            or (_last_match(lines, failure=dataclasses.replace(failure, rank=None), pattern=_LAUNCH_EXIT_RE)
                if failure.node else None))


def _last_match(lines: list[str], *, failure: NodeFailure, pattern: re.Pattern) -> str | None:
    for line in reversed(lines):
        rest = line
        if failure.node:
            m = _NODE_PREFIX_RE.match(rest)
            if m is None or m.group(1) != failure.node:
                continue
            rest = rest[m.end():]
        if failure.rank is not None:
            m = _RANK_PREFIX_RE.match(rest)
            if m is None or int(m.group(1)) != failure.rank:
                continue
        if pattern.search(rest) and not rest.startswith("pdsh@"):
            return line.rstrip("\n")
    return None


class NodeWatch:
    """Watches a multi-node launch's output lines; on the first failure, stops every node's ranks.

    ``feed(line)`` is called with each line of the runner's output (from any thread); ``start(proc)``
    with the runner's process. The stop runs in a thread: ``stop_command`` over pdsh, then, if the
    runner has not ended ``runner_wait_seconds`` later, SIGKILL to its process tree on this machine."""

    def __init__(self, *, hosts: list[str] | dict[str, list[int]], tag: str, python: str, cwd: str,
                 env: dict[str, str] | None = None,
                 grace_seconds: float = GRACE_SECONDS, runner_wait_seconds: float = RUNNER_WAIT_SECONDS,
                 sink: Callable[[str, str], None] | None = None):
        self.hosts, self.tag, self.python, self.cwd = list(hosts), tag, python, cwd
        self.node_ranks: dict[str, tuple[int, ...]] = {}
        """{host: its global ranks}, in rank order, when ``hosts`` is the runner's {host: slots}."""
        if isinstance(hosts, dict):
            first = 0
            for host, slots in hosts.items():
                self.node_ranks[host] = tuple(range(first, first + len(slots)))
                first += len(slots)
        self.env = env if env is not None else dict(os.environ)
        self.grace_seconds, self.runner_wait_seconds = grace_seconds, runner_wait_seconds
        self.sink = sink
        self.failure: NodeFailure | None = None
        self.stopped: dict[str, tuple[int, int]] = {}
        """{host: (processes signalled there, of them SIGKILLed after the grace)}, from each node's ``STOP_TAG`` line."""
        self.stop_problem: str | None = None
        self.runner_killed = False
        self.interrupted: int | None = None
        """The signal (SIGINT/SIGTERM/SIGHUP) that stopped the launch (``interrupt``); no failure is looked for after it."""
        self._lines: collections.deque[str] = collections.deque(maxlen=2000)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def start(self, proc: subprocess.Popen) -> None:
        self._proc = proc

    def feed(self, line: str) -> None:
        failure = failure_from_line(line)
        with self._lock:
            self._lines.append(line)
            # after a signal the nodes end because dstk stopped them: none of that is a failure
            if failure is None or self.failure is not None or self.interrupted is not None:
                return
            self.failure = failure
            self._thread = threading.Thread(target=self._stop, daemon=True)
        if self.sink is not None:
            self.sink("stderr", f"dstk: {self._describe(failure)}; stopping the ranks on every node "
                                f"({', '.join(self.hosts)})\n")
        self._thread.start()

    def interrupt(self, signum: int) -> None:
        """Stop the run because dstk got ``signum`` (SIGINT/SIGTERM/SIGHUP), in the calling thread: say so, run the
        tagged stop on every host, wait for the runner to end (SIGKILL to its tree after
        ``runner_wait_seconds``). A failure's stop already under way is waited for instead of repeated.
        The runner gets no SIGINT/SIGTERM from here: its handler would run the broad pkill."""
        with self._lock:
            self.interrupted = signum
            running = self._thread
        if self.sink is not None:
            self.sink("stderr", f"dstk: {_signal_name(signum)}: stopping this run's ranks on every node "
                                f"({', '.join(self.hosts)})\n")
        if running is not None:
            running.join(self.grace_seconds + 60 + self.runner_wait_seconds + 30)
        if running is None or (self._proc is not None and self._proc.poll() is None):
            self._stop()

    def _stop(self) -> None:
        """The tagged stop on every host, again every ``RESTOP_SECONDS`` while the runner lives on (a node whose
        launch.py started after the last stop: Ctrl-C early in the launch, a slow ssh); the runner's tree is
        SIGKILLed once it outlives ``runner_wait_seconds``, and the nodes are stopped once more after that."""
        proc = self._proc
        deadline = time.monotonic() + self.runner_wait_seconds
        while True:
            self._stop_nodes()
            if proc is None:
                return
            left = deadline - time.monotonic()
            try:
                proc.wait(timeout=max(0.0, min(RESTOP_SECONDS, left)))
                return
            except subprocess.TimeoutExpired:
                if left <= RESTOP_SECONDS:
                    self.runner_killed = True
                    kill_tree(proc.pid)
                    self._stop_nodes()  # a launch.py that a killed ssh had started just before
                    return

    def _stop_nodes(self) -> None:
        argv = stop_command(hosts=self.hosts, tag=self.tag, python=self.python, cwd=self.cwd,
                            grace_seconds=self.grace_seconds)
        try:
            done = subprocess.run(argv, env={**self.env, "PDSH_RCMD_TYPE": "ssh"}, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=self.grace_seconds + 60)
            for line in done.stdout.splitlines():
                m = _NODE_PREFIX_RE.match(line)
                if m and line[m.end():].startswith(STOP_TAG):
                    data = json.loads(line[m.end() + len(STOP_TAG):])
                    signalled = set(data.get("terminated", ())) | set(data.get("killed", ()))
                    before = self.stopped.get(m.group(1), (0, 0))
                    self.stopped[m.group(1)] = (before[0] + len(signalled), before[1] + len(data.get("killed", ())))
            missing = [h for h in self.hosts if h not in self.stopped]
            if missing:
                self.stop_problem = (f"could not stop the ranks on {', '.join(missing)} (pdsh exited "
                                     f"{done.returncode}: {done.stderr.strip()[-300:]})")
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            self.stop_problem = f"could not run {argv[0]} to stop the other nodes: {exc}"

    def _describe(self, failure: NodeFailure) -> str:
        return failure.describe(node_ranks=self.node_ranks.get(failure.node, ()))

    def _host_order(self, host: str) -> int:
        return self.hosts.index(host) if host in self.hosts else len(self.hosts)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def messages(self) -> list[str]:
        """Lines for ``dstk: ...`` after the launch: the failure, the line that says why, what was stopped
        (after a signal: ``stopped by SIGINT: stopped this run's ranks on every node: ...``)."""
        if self.failure is None and self.interrupted is None:
            return []
        with self._lock:
            lines = list(self._lines)
        out = []
        if self.failure is not None:
            out.append(f"{self._describe(self.failure)} first")
            why = why_line(lines, failure=self.failure)
            if why:
                why = why.strip()
                # launch.py's line holds the rank's whole argv before the exit code: keep both ends
                out.append(f"  why: {why if len(why) <= 300 else why[:140] + ' ... ' + why[-150:]}")
        if self.stopped:
            out.append(("" if self.interrupted is None else f"stopped by {_signal_name(self.interrupted)}: ")
                       + "stopped this run's ranks on every node: " + ", ".join(
                f"{h} ({n} process{'es' if n != 1 else ''}" + (f", {k} after SIGTERM left {'them' if k > 1 else 'it'} running: "
                                                               f"SIGKILL)" if k else ")")
                for h, (n, k) in sorted(self.stopped.items(), key=lambda item: self._host_order(item[0]))))
        elif self.interrupted is not None:
            out.append(f"stopped by {_signal_name(self.interrupted)}")
        if self.stop_problem:
            out.append(self.stop_problem)
        if self.runner_killed:
            out.append(f"the runner had not ended {self.runner_wait_seconds:g} s after that: killed it")
        return out


def kill_tree(pid: int, *, proc_root: str | os.PathLike = "/proc") -> None:
    """SIGKILL ``pid`` and its descendants on this machine (children first found through /proc)."""
    root = Path(proc_root)
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in root.iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(") ", 1)[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children[ppid].append(int(entry.name))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    _signal(tree, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    """``python -m dstk.launch.nodefail --tag TAG [--grace-seconds S]``: stop this run's processes on this
    node (``stop_tagged``) and print one ``DSTK_NODE_STOP {json}`` line."""
    parser = argparse.ArgumentParser(prog="python -m dstk.launch.nodefail", description=main.__doc__.split(":")[0])
    parser.add_argument("--tag", required=True, help="the run's tag (its PYTHON_DSTK_RUN_TAG)")
    parser.add_argument("--grace-seconds", type=float, default=GRACE_SECONDS, help="SIGTERM to SIGKILL")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not re.fullmatch(r"[0-9a-f]{8,64}", args.tag):
        parser.error("--tag: expected the hex tag dstk launch made")
    report = stop_tagged(tag=args.tag, grace_seconds=args.grace_seconds)
    print(STOP_TAG + json.dumps(dataclasses.asdict(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
