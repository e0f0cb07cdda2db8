"""Run a ``LaunchPlan``: write its files, start the runner, stream its output, judge the outcome.

The runner's exit code is not enough: it exits 0 when its child was killed by a signal
(``if result.returncode > 0``, deepspeed/launcher/runner.py 0.19.8). Each rank's wrapper
(``dstk.launch.rank``) prints a report line when its rank ends; a launch succeeds only when the
runner exited 0 *and* every rank reported exit code 0.

A multi-node pdsh launch runs its runner in a session of its own and handles SIGINT/SIGTERM/SIGHUP itself
(``_StopOnSignals``, ``dstk.launch.nodefail.NodeWatch.interrupt``): it stops only this run's processes,
by their tag, and exits 128 + the signal. A launch whose launch.py (or torchrun) runs on this machine
handles SIGTERM and SIGHUP the same way (``_LocalStop``); its Ctrl-C reaches the runner's whole group.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from dstk.launch.command import REPORT_TAG, LaunchPlan, LaunchSpec, check_pdsh_words, plan_launch
from dstk.launch.locks import check_op_locks, check_remote_op_locks, clear_locks_left, extensions_root, lock_files


TAIL_LINES = 400
"""Lines of the ranks' output kept for naming the cause of a failure."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class RankExit:
    rank: int | None
    """Global rank (``None`` when the wrapper could not tell)."""
    returncode: int
    """The script's exit code; ``-N`` when killed by signal ``N``."""
    host: str = ""
    stopped: bool = False
    """The rank was stopped by the launcher (SIGTERM/SIGINT), normally because another rank failed."""

    def describe(self) -> str:
        who = f"rank {self.rank}" + (f" on {self.host}" if self.host else "")
        if self.returncode == 0:
            return f"{who} finished"
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            text = f"{who} was killed by {name} (signal {-self.returncode})"
            return text + (", sent by the launcher after another rank failed" if self.stopped else "")
        return f"{who} exited with code {self.returncode}"


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class LaunchResult:
    returncode: int
    """What ``dstk launch`` exits with: 0, the failed rank's code, or 128 + signal (shell convention)."""
    runner_returncode: int
    ranks: tuple[RankExit, ...]
    """Reports in the order they arrived."""
    missing_ranks: tuple[int, ...]
    """Ranks that never reported (their wrapper was killed, or they never started)."""
    messages: tuple[str, ...]
    """One line per problem, first failure first."""
    tail: tuple[str, ...] = ()
    """The last lines the ranks printed (for ``dstk.launch.diagnose``)."""
    interrupted_by: int | None = None
    """The signal that made dstk stop the launch (pdsh: SIGINT/SIGTERM/SIGHUP; one node: SIGTERM/SIGHUP);
    ``returncode`` is then 128 + it."""


# pdsh prints every remote line as "HOST: line"; the host is a DNS
# name or an IPv4 address (dstk refuses anything else in a hostfile), so it holds no ": ".
_PDSH_PREFIX_RE = re.compile(r"[A-Za-z0-9._-]+: ")


def parse_report(line: str) -> RankExit | None:
    """The wrapper's report on ``line``, also behind pdsh's ``HOST: `` prefix; ``None`` for other lines."""
    if not line.startswith(REPORT_TAG):
        prefix = _PDSH_PREFIX_RE.match(line)
        if prefix is None or not line.startswith(REPORT_TAG, prefix.end()):
            return None
        line = line[prefix.end():]
    try:
        data = json.loads(line[len(REPORT_TAG):])
        return RankExit(rank=data.get("rank"), returncode=int(data["returncode"]),
                        host=str(data.get("host", "")), stopped=bool(data.get("stopped")))
    except (ValueError, KeyError, TypeError):
        return None


def _exit_code(code: int) -> int:
    return code if code > 0 else 128 + (-code) if code < 0 else 1


def judge(*, runner_returncode: int, ranks: list[RankExit], world_size: int, expect_reports: bool) -> LaunchResult:
    """Pure: the launch's outcome from the runner's exit code and the ranks' reports."""
    failed = [r for r in ranks if r.returncode != 0]
    # The culprit is the first failure that was not the launcher stopping a rank.
    failed.sort(key=lambda r: r.stopped)
    seen = {r.rank for r in ranks}
    missing = tuple(i for i in range(world_size) if i not in seen) if expect_reports else ()
    messages = [r.describe() for r in failed]
    messages += [f"rank {i} did not report how it ended (its process was killed, or it never started)" for i in missing]
    if runner_returncode != 0 and not failed:
        messages.append(f"the runner exited with code {runner_returncode}")
    if failed:
        code = _exit_code(failed[0].returncode)
    elif missing or runner_returncode != 0:
        code = _exit_code(runner_returncode)
    else:
        code = 0
    return LaunchResult(returncode=code, runner_returncode=runner_returncode, ranks=tuple(ranks),
                        missing_ranks=missing, messages=tuple(messages))


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write via a temp file in the same directory and ``os.replace``: never a half-written file.
    The file gets mode 0666 less the umask, as open(2) would give it (mkstemp's 0600 otherwise)."""
    from dstk.render import _umask

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _default_sink(stream: str, line: str) -> None:
    out = sys.stdout if stream == "stdout" else sys.stderr
    try:
        out.write(line)
        out.flush()
    except OSError:
        # EIO once the terminal hung up (SIGHUP), EPIPE once a pipe's reader ended: the line has nowhere to
        # go, and raising would stop draining the ranks' pipes (they would block) or cut a stop short.
        pass


RANK_IDENTITY_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")
"""What torch.distributed and the launchers set for one rank. A launcher is no rank: a value
inherited from the caller (a shell inside another job, a test session that ran DeepSpeed
in-process) would reach the runner, pdsh and ssh, and ``dstk.launch.nodefail`` would take them
for ranks of the run. launch.py sets the ranks' own."""


def launcher_environ() -> dict[str, str]:
    """This process's environment without ``RANK_IDENTITY_VARS``: what the runner starts from."""
    return {k: v for k, v in os.environ.items() if k not in RANK_IDENTITY_VARS}


def run_plan(plan: LaunchPlan, *, world_size: int, expect_reports: bool = True,
             sink: Callable[[str, str], None] = _default_sink, check_locks: bool = True,
             watch=None, local_stop: _LocalStop | None = None) -> LaunchResult:
    """Write the plan's files, run its command, stream output through ``sink(stream, line)``.

    ``watch``: a ``dstk.launch.nodefail.NodeWatch`` fed every output line, which stops every node's
    ranks when one node fails (multi-node pdsh launches). ``local_stop``: a ``_LocalStop`` for a plan whose
    launch.py or torchrun runs on this machine (its tag in ``plan.env``), which stops the run's processes here
    on SIGTERM/SIGHUP (and after a SIGINT, what the runner left)."""
    env = {**launcher_environ(), **plan.env, "PYTHONUNBUFFERED": "1"}
    if check_locks:
        check_op_locks(extensions_root(env))  # the ranks' cache: --env may set TORCH_EXTENSIONS_DIR
    for path, text in plan.files.items():
        write_atomic(path, text)
    # A watched (pdsh) launch: the runner gets a session of its own, so a terminal's Ctrl-C reaches dstk
    # only, and dstk stops the run itself (``_StopOnSignals``); the runner's own handler would run a pkill
    # of every launch.py of this interpreter on every host (dstk.launch.nodefail). A local launch keeps the
    # runner in dstk's group (Ctrl-C and Ctrl-Z reach every process, as without dstk) and handles SIGTERM and
    # SIGHUP, which the runner's default action turns into an orphaned launch.py (``_LocalStop``).
    stopper = (_StopOnSignals() if watch is not None
               else _StopOnSignals(signals=_LocalStop.SIGNALS) if local_stop is not None else None)
    if stopper is not None:
        stopper.install()
    # A rank stopped while DeepSpeed builds an op (its first start on this machine: minutes, silent) leaves
    # the build's lock, and every later start would wait for it forever: remove what this run left.
    ext_root = extensions_root(env)  # the ranks' cache: --env may set TORCH_EXTENSIONS_DIR
    lock_root = ext_root if local_stop is not None and len(plan.active) <= 1 else None
    locks_before = lock_files(lock_root) if lock_root is not None else set()
    try:
        proc = subprocess.Popen(plan.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=watch is not None)
    except BaseException:
        if stopper is not None:
            stopper.restore()
        raise
    reports: list[RankExit] = []
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    lock = threading.Lock()

    def pump(src, stream: str) -> None:
        for raw in iter(src.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            report = parse_report(line)
            with lock:
                if watch is not None:
                    watch.feed(line)  # may print the failure through sink: under the lock, as every line
                if report is not None:
                    reports.append(report)
                else:
                    tail.append(line)
                    sink(stream, line)
        src.close()

    done = threading.Event()

    def watch_builds() -> None:
        for op in _op_builds(done, root=ext_root):
            with lock:
                sink("stderr", f"dstk: DeepSpeed is building its op {op} (first start on this machine: a few "
                               f"minutes, silent; later starts reuse it)\n")

    threads = [threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True),
               threading.Thread(target=watch_builds, daemon=True)]
    for watcher in (watch, local_stop):
        if watcher is not None:
            watcher.start(proc)
    for t in threads:
        t.start()
    try:
        if stopper is not None:
            stopper.wait(proc, stop=watch if watch is not None else local_stop)
        else:
            proc.wait()
    except KeyboardInterrupt:
        # A sink that hides what the ranks print once the user asked to stop (dstk.train.logs.RunSink)
        getattr(sink, "interrupt", lambda: None)()
        # The local runner and launch.py got the terminal's SIGINT too and stop their ranks; a SIGINT
        # from elsewhere reaches them here. Give them time, then kill.
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if local_stop is not None:
            # the runner leaves 0.25 s after a SIGINT (Popen.wait), launch.py runs on where the SIGINT reached
            # dstk alone (kill -INT): stop what is left of the run
            local_stop.sweep()
        raise
    finally:
        done.set()
        for t in threads:
            t.join(timeout=10)
        if lock_root is not None and proc.poll() is not None:
            for lock in clear_locks_left(lock_root, before=locks_before):
                sink("stderr", f"dstk: removed {lock}: the run's build of DeepSpeed's op {lock.parent.name} was "
                               f"stopped half-way and left it; the next start builds the op again\n")
    result = judge(runner_returncode=proc.returncode, ranks=reports, world_size=world_size,
                   expect_reports=expect_reports)
    for watcher in (watch, local_stop):
        if watcher is not None and watcher.interrupted is not None:
            # The ranks were stopped because the user asked: no rank failed, and nothing needs a cause.
            result = dataclasses.replace(result, returncode=128 + watcher.interrupted, messages=(),
                                         interrupted_by=watcher.interrupted)
    return dataclasses.replace(result, tail=tuple(tail))


class _StopOnSignals:
    """Handlers for ``signals`` during the wait on a launch. The handler only notes the first signal; ``wait``
    sees it within ``POLL_SECONDS`` (or once the runner ended, when the signal reached it too: ``timeout`` and
    systemd signal the whole group) and has ``stop.interrupt(signum)`` stop the run. Later signals are ignored:
    the stop is under way, and another Ctrl-C must not cut it short and leave ranks running. A SIGHUP that
    was ignored when dstk started (``nohup``) stays ignored: the run's processes inherit that too, and the run
    survives a closed terminal, as asked. Signal handlers exist in the main thread only; elsewhere nothing
    changes."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    """A watched (pdsh) launch: its runner has a session of its own, so the terminal reaches dstk only."""
    POLL_SECONDS = 0.2

    def __init__(self, *, signals: tuple[int, ...] = SIGNALS) -> None:
        self.signals = signals
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals:
            if signum != signal.SIGHUP or signal.getsignal(signum) is not signal.SIG_IGN:
                self._previous[signum] = signal.signal(signum, self._handler)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handler(self, signum, _frame) -> None:
        if self.signum is None:
            self.signum = signum

    def wait(self, proc: subprocess.Popen, *, stop) -> None:
        try:
            while self.signum is None:
                try:
                    proc.wait(timeout=self.POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    pass
            if self.signum is not None:
                stop.interrupt(self.signum)
            proc.wait()
        finally:
            self.restore()


class _LocalStop:
    """Stops a launch whose launch.py (or torchrun) runs on this machine when dstk gets SIGTERM or SIGHUP.

    Without it the signal ends dstk alone: the deepspeed runner, which dstk waits on, gets nothing; and where it
    gets the signal too (a terminal's hangup, ``timeout``, systemd), it has no handler on a single-node launch
    (runner.py ``main`` installs ``sigkill_handler`` only for a multi-node pdsh launch) and dies by it, while
    launch.py and the ranks run on, reparented to init. launch.py itself stops its ranks on SIGINT/SIGTERM
    (launch.py ``sigkill_handler``: ``terminate_process_tree``, SIGTERM to each rank's tree, SIGKILL to what
    is left after 30 s) and dies by SIGHUP; torchrun's agent stops its workers on SIGTERM/SIGINT/SIGHUP/SIGQUIT
    (torch/distributed/elastic/multiprocessing/api.py ``_terminate_process_handler``).

    So ``interrupt`` says so in one line, then: torchrun gets the signal (it stops its workers itself); for the
    deepspeed runner, this run's launch.py and ranks -- found by the run's tag, never by a name other runs share
    (``dstk.launch.nodefail.stop_tagged``) -- get SIGTERM, and SIGKILL after ``grace_seconds``: launch.py's own
    grace, so a rank that saves a checkpoint on SIGTERM has what DeepSpeed gives it. The runner is never
    signalled: it exits once launch.py did. The stop runs again every ``RESTOP_SECONDS`` while the runner lives
    (a signal before the runner started launch.py); a runner that outlives ``runner_wait_seconds`` has its tree
    SIGKILLed; last, anything of the run still tagged is stopped (``sweep``)."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)
    GRACE_SECONDS = 30.0
    """SIGTERM to SIGKILL for the run's processes: launch.py's ``psutil.wait_procs(children, timeout=30)``
    (deepspeed/launcher/launch.py ``terminate_process_tree``, 0.19.8), and torchrun's ``_shutdown`` timeout."""

    def __init__(self, *, tag: str, torchrun: bool = False, grace_seconds: float = GRACE_SECONDS,
                 runner_wait_seconds: float | None = None, sink: Callable[[str, str], None] | None = None):
        from dstk.launch.nodefail import RUNNER_WAIT_SECONDS

        self.tag, self.torchrun, self.grace_seconds, self.sink = tag, torchrun, grace_seconds, sink
        self.runner_wait_seconds = (grace_seconds + RUNNER_WAIT_SECONDS if runner_wait_seconds is None
                                    else runner_wait_seconds)
        self.interrupted: int | None = None
        """The signal that stopped the launch (``interrupt``)."""
        self.signalled: set[int] = set()
        self.killed: set[int] = set()
        """Of ``signalled``, the pids still alive after the grace: SIGKILLed."""
        self.runner_killed = False
        self._proc: subprocess.Popen | None = None

    def start(self, proc: subprocess.Popen) -> None:
        self._proc = proc

    def interrupt(self, signum: int) -> None:
        """Stop the run because dstk got ``signum``, in the calling thread; return once the runner ended."""
        import time

        from dstk.launch.nodefail import RESTOP_SECONDS, _signal_name, kill_tree

        self.interrupted = signum
        if self.sink is not None:
            what = "torchrun and its ranks" if self.torchrun else "this run's launch.py and ranks"
            self.sink("stderr", f"dstk: {_signal_name(signum)}: stopping {what} on this machine\n")
        proc = self._proc
        if self.torchrun and proc is not None and proc.poll() is None:
            proc.send_signal(signum)
        deadline = time.monotonic() + self.runner_wait_seconds
        while proc is not None:
            if not self.torchrun:
                self._stop()
            left = deadline - time.monotonic()
            try:
                proc.wait(timeout=max(0.0, min(RESTOP_SECONDS, left) if not self.torchrun else left))
                break
            except subprocess.TimeoutExpired:
                if self.torchrun or left <= RESTOP_SECONDS:
                    self.runner_killed = True
                    kill_tree(proc.pid)
                    proc.wait()
                    break
        self.sweep()

    def sweep(self) -> None:
        """Stop what is left of the run on this machine (a rank or launch.py that outlived its parent)."""
        from dstk.launch.nodefail import tagged_pids

        if tagged_pids(tag=self.tag):
            self._stop()

    def _stop(self) -> None:
        from dstk.launch.nodefail import stop_tagged

        report = stop_tagged(tag=self.tag, grace_seconds=self.grace_seconds)
        self.signalled.update(report.terminated, report.killed)
        self.killed.update(report.killed)

    def messages(self) -> list[str]:
        """After ``interrupt``: ``stopped by SIGTERM: stopped this run's processes on this machine: N processes``
        (launch.py, each rank's wrapper and script, what they started), and what had to be killed."""
        from dstk.launch.nodefail import _signal_name

        if self.interrupted is None:
            return []
        n, k = len(self.signalled), len(self.killed)
        line = f"stopped by {_signal_name(self.interrupted)}: "
        if self.torchrun:
            line += "torchrun stopped its ranks"
        else:
            line += f"stopped this run's processes on this machine ({n} process{'es' if n != 1 else ''}" + (
                f", {k} after SIGTERM left {'them' if k > 1 else 'it'} running: SIGKILL)" if k else ")")
        out = [line]
        if self.torchrun and self.signalled:
            out.append(f"{n} process{'es' if n != 1 else ''} of the run outlived torchrun: stopped them")
        if self.runner_killed:
            out.append(f"the {'torchrun' if self.torchrun else 'runner'} had not ended "
                       f"{self.runner_wait_seconds:g} s after that: killed it")
        return out


def _op_builds(done: threading.Event, *, interval: float = 1.0, root: Path | None = None):
    """Yield each op DeepSpeed starts building while the launch runs: torch's extension builder
    holds ``<extensions root>/<op>/lock`` for the whole build (``dstk.launch.locks``), and the ranks
    print nothing until it ends. Loading an op already built takes the same lock for a moment (torch's
    ``_jit_compile`` checks the sources' version under it), so a lock counts as a build only when the
    same file (inode and times) is still there at the next poll, ``interval`` later. ``root``: the ranks'
    extensions cache (their ``TORCH_EXTENSIONS_DIR``, which ``--env`` may set), this process's by default."""
    root, seen, pending = extensions_root() if root is None else root, set(), {}
    seen.update(p.parent.name for p in lock_files(root))  # stale: reported earlier
    while not done.wait(interval):
        now = {}
        for lock in lock_files(root):
            if lock.parent.name in seen:
                continue
            try:
                st = lock.stat()
            except OSError:  # released between the listing and the stat: a load's version check
                continue
            now[lock] = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
            if pending.get(lock) == now[lock]:
                seen.add(lock.parent.name)
                yield lock.parent.name
        pending = now


def _check_env_files(plan: LaunchPlan, sink: Callable[[str, str], None]) -> None:
    """The runner reads ~/.deepspeed_env and ./.deepspeed_env for multi-node runs (or only DS_ENV_FILE,
    when dstk writes one): refuse the lines it breaks on, and say which file is no longer read."""
    from dstk.errors import DstkError
    from dstk.findings import has_errors, render_text
    from dstk.launch.env import lint_deepspeed_env

    home = Path.home() / ".deepspeed_env"
    if "DS_ENV_FILE" in plan.env:
        for path in {home, Path.cwd() / ".deepspeed_env"}:
            if path.is_file():
                sink("stderr", f"dstk: warning: {path} is not read for this launch (dstk passes --env and the NCCL "
                               f"profile in {plan.env['DS_ENV_FILE']}); add what you need from it with --env\n")
        return
    for path in (home, Path.cwd() / ".deepspeed_env"):
        if path.is_file():
            findings = lint_deepspeed_env(path.read_text(encoding="utf-8", errors="replace"))
            if has_errors(findings):
                raise DstkError("the deepspeed runner would read this .deepspeed_env and break on it:\n"
                                + render_text(str(path), findings),
                                hint="fix those lines, or move the variables to `dstk launch --env K=V`")


def stop_guards(spec: LaunchSpec, *, sink: Callable[[str, str], None] = _default_sink):
    """``(spec, plan, watch, local_stop)``: ``spec`` with a run tag where it needs one, its plan, and what stops
    the run's processes when one node fails or dstk gets a signal, for ``run_plan``. A multi-node pdsh launch
    gets a ``NodeWatch`` (every node's ranks, by the tag); a launch whose launch.py or torchrun runs on this
    machine gets a ``_LocalStop`` (SIGTERM/SIGHUP stop it by the tag). Without one of them a signal ends dstk
    alone and the run's ranks go on, orphaned."""
    from dstk.launch.nodefail import NodeWatch, new_run_tag

    watch = local_stop = None
    if spec.launcher == "pdsh" and spec.hosts and spec.node_rank is None:
        spec = dataclasses.replace(spec, run_tag=spec.run_tag or new_run_tag())
        plan = plan_launch(spec)
        watch = NodeWatch(hosts=plan.active, tag=spec.run_tag, python=spec.python, cwd=os.getcwd(),
                          env=launcher_environ(), sink=sink)
    elif not spec.hosts or spec.node_rank is not None:
        # launch.py (or torchrun) runs here, as the runner's child: SIGTERM/SIGHUP stop it by the run's tag
        spec = dataclasses.replace(spec, run_tag=spec.run_tag or new_run_tag())
        plan = plan_launch(spec)
        local_stop = _LocalStop(tag=spec.run_tag, torchrun=spec.launcher == "torchrun", sink=sink)
    else:
        plan = plan_launch(spec)
    return spec, plan, watch, local_stop


def run_launch(spec: LaunchSpec, *, sink: Callable[[str, str], None] = _default_sink) -> int:
    """Run ``spec``: rank-prefixed output through ``sink``; non-zero when any rank failed or was killed.

    Returns the exit code of ``LaunchResult``; the problems go to ``sink("stderr", ...)``."""
    if spec.launcher == "slurm" and "SLURM_KILL_ON_BAD_EXIT" in os.environ:
        from dstk.launch.command import slurm_launcher_args

        # srun reads it, but the flag dstk adds would override it: the user's value becomes the flag
        spec = dataclasses.replace(spec, launcher_args=slurm_launcher_args(
            spec.launcher_args, environ_kill=os.environ["SLURM_KILL_ON_BAD_EXIT"]))
    plan = plan_launch(spec)
    if not spec.module:
        # a stale lock hangs the start: say so first (run_plan checks again, cheaply)
        check_op_locks(extensions_root({**launcher_environ(), **plan.env}))
        if not Path(spec.script).is_file():
            from dstk.errors import UsageError

            raise UsageError(f"{spec.script}: no such training script (from {os.getcwd()})",
                             hint="give the path of your script after `--` (it gets --deepspeed_config "
                                  "RUN/ds_config.json); examples/train.py is a small one to start from")
    if spec.launcher == "pdsh" and spec.hosts and spec.node_rank is None:
        check_pdsh_words([os.getcwd()])  # pdsh runs `cd <cwd>;` on every node, unquoted
        # every node's own cache (a container's, a node-local /tmp), which this machine cannot see: a stale
        # lock there hangs that node's ranks, and the whole launch with them
        check_remote_op_locks(plan.active, python=spec.python, cwd=os.getcwd(),
                              root=dict(spec.env).get("TORCH_EXTENSIONS_DIR"), env=launcher_environ())
    if spec.hosts and spec.node_rank is None:
        _check_env_files(plan, sink)
    # With node_rank set only this node's ranks report here.
    expected = spec.world_size if spec.node_rank is None else 0
    spec, plan, watch, local_stop = stop_guards(spec, sink=sink)
    try:
        result = run_plan(plan, world_size=expected, expect_reports=spec.prefix_output, sink=sink, watch=watch,
                          local_stop=local_stop)
    finally:
        from dstk.launch.shm import remove_run_buffers

        # DeepSpeed's CPU shm all-reduce never unlinks its 66 MiB per-rank buffers (dstk.launch.shm):
        # free this run's (its port), success or failure; one a live process maps or holds open is kept.
        remove_run_buffers(master_port=spec.master_port)
    if spec.node_rank is not None and spec.prefix_output and len(result.ranks) < spec.gpus_per_node:
        lost = spec.gpus_per_node - len(result.ranks)
        result = dataclasses.replace(result, returncode=result.returncode or 1,
                                     messages=result.messages + (f"{lost} rank(s) of this node did not report how they ended",))
    if local_stop is not None and result.interrupted_by is not None:
        for message in local_stop.messages():
            sink("stderr", f"dstk: {message}\n")
        return result.returncode
    if watch is not None:
        watch.join(timeout=watch.grace_seconds + 90)
        for message in watch.messages():
            sink("stderr", f"dstk: {message}\n")
        if result.interrupted_by is not None:
            return result.returncode
        if watch.failure is not None and not any(r.returncode != 0 and not r.stopped for r in result.ranks):
            # No rank report names the culprit (--no-prefix, or its wrapper died): exit with the failed node's
            # code; the runner's is pdsh's largest, which counts the nodes dstk stopped (ssh gives 255 for a
            # remote command ended by a signal).
            result = dataclasses.replace(result, returncode=_exit_code(watch.failure.returncode), messages=tuple(
                m for m in result.messages if not m.startswith("the runner exited with code")))
    if spec.launcher == "slurm" and not result.ranks and result.returncode != 0 and result.interrupted_by is None:
        from dstk.launch.slurm import srun_task_exits

        # No wrapper reports (--no-prefix): srun's "task N: Exited with exit code C" lines name the rank that
        # failed first; srun's own code is its tasks' largest (143 for the ones it terminated afterwards).
        exits = srun_task_exits(result.tail)
        if exits:
            judged = judge(runner_returncode=result.runner_returncode, ranks=exits, world_size=spec.world_size,
                           expect_reports=False)
            result = dataclasses.replace(result, returncode=judged.returncode, ranks=judged.ranks,
                                         messages=judged.messages)
    for message in result.messages:
        sink("stderr", f"dstk: {message}\n")
    if result.returncode != 0:
        for found in explain_failure(result, run_dir=spec.run_dir):
            sink("stderr", "dstk: " + found.render().replace("\n", "\ndstk: ") + "\n")
        hint = resume_after(result, spec=spec)
        if hint is not None:
            sink("stderr", "dstk: " + hint.render().replace("\n", "\ndstk: ") + "\n")
    return result.returncode


def resume_after(result: LaunchResult, *, spec: LaunchSpec):
    """``dstk.launch.diagnose.resume_hint`` for a launch whose ranks were killed by a signal or never
    reported (a lost GPU or node; a rank that raised an error is not one): for ``dstk finetune``'s
    ranks (``-m dstk.train.worker OUT/finetune.json``) the command that resumes on the rest."""
    from dstk.launch.diagnose import resume_hint

    lost = tuple(r.rank for r in result.ranks if r.returncode < 0 and not r.stopped and r.rank is not None)
    lost += result.missing_ranks
    output, trainer = None, "native"
    if spec.module and spec.script in ("dstk.train.worker", "dstk.train.hf_worker") and spec.script_args:
        output = str(Path(spec.script_args[0]).parent)
        trainer = "hf" if spec.script == "dstk.train.hf_worker" else "native"
    return resume_hint(world_size=spec.world_size, lost_ranks=lost, finetune_output=output, trainer=trainer)


def explain_failure(result: LaunchResult, *, run_dir: str | os.PathLike | None = None) -> list:
    """The causes ``dstk.launch.diagnose`` names in a failed launch's output and signals, with the
    run directory's plan (its memory estimate and smaller layouts) when there is one."""
    from dstk.launch.diagnose import diagnose

    plan = None
    if run_dir is not None:
        try:
            plan = json.loads((Path(run_dir) / "plan.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            plan = None
    signals = tuple(-r.returncode for r in result.ranks if r.returncode < 0 and not r.stopped)
    return diagnose(list(result.tail), signals=signals, plan=plan)
