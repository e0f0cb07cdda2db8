"""Exceptions that the CLI turns into exit codes.

Library code raises these with a message that says what is wrong and a hint that says how
to fix it; ``dstk.cli.main`` is the one place that prints them and picks the exit code.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INVALID = 1  # the input was read and is wrong (an invalid config, a plan that does not fit)
EXIT_USAGE = 2  # the command line is wrong or a path cannot be read
EXIT_INTERNAL = 3  # a bug in dstk (not the input's fault): report it


class DstkError(Exception):
    """A user-facing error: ``message`` says what is wrong, ``hint`` how to fix it."""

    exit_code = EXIT_INVALID

    def __init__(self, message: str, *, hint: str | None = None, location: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.location = location

    def render(self) -> str:
        where = f"{self.location}: " if self.location else ""
        text = f"error: {where}{self.message}"
        if self.hint:
            text += f"\n  fix: {self.hint}"
        return text


class UsageError(DstkError):
    """Bad command line or unreadable path (exit 2)."""

    exit_code = EXIT_USAGE


class Stopped(DstkError):
    """dstk stopped what it had started because it got a signal (SIGTERM, SIGHUP, SIGINT): it exits
    128 + the signal, as a shell reports a command the signal ended."""

    def __init__(self, signum: int, message: str, *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.signum = signum
        self.exit_code = 128 + signum

    def render(self) -> str:
        return f"dstk: {self.message}" + (f"\n  fix: {self.hint}" if self.hint else "")


TRAIN_STACK = ("torch", "deepspeed", "transformers", "datasets", "accelerate", "safetensors")
"""What ``pip install 'dstk[train]'`` brings; the fast commands need none of it."""


def require_train_stack(command: str, *, modules: tuple[str, ...] = TRAIN_STACK) -> None:
    """Fail in one line, before any work, when ``command`` needs the training stack and it is not
    installed (the core install carries only what validate, plan, generate and estimate need)."""
    import importlib.util

    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise DstkError(f"dstk {command} needs the training stack, and {', '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} not installed",
                        hint="pip install 'dstk[train]' (install torch first, pinned to the build you want)")
