"""The ``dstk`` command line: a thin layer over the library.

Each subcommand lives in ``dstk.commands.<name>`` and provides::

    HELP: str                                   # one line for ``dstk --help``
    def configure(parser: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int    # the exit code

Command modules must be cheap to import (no torch/deepspeed/transformers at module level):
``dstk --help`` imports all of them. This module is the one place where exceptions become
exit codes: 0 ok, 1 invalid input, 2 usage error; tracebacks only with ``--debug``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from dstk import __version__
from dstk.errors import EXIT_INTERNAL, EXIT_USAGE, DstkError

# Order is the order shown in --help. A module that does not exist yet is simply not offered.
COMMANDS = (
    "demo",
    "validate",
    "schema",
    "estimate",
    "plan",
    "generate",
    "import",
    "upgrade",
    "explain",
    "launch",
    "doctor",
    "finetune",
    "export",
    "models",
    "gpus",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 itself; keep its code, add a hint
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n  fix: see `{self.prog} --help`\n")
        raise SystemExit(EXIT_USAGE)


def _command_modules(only: str | None = None):
    for name in COMMANDS if only is None else (only,):
        module_name = f"dstk.commands.{name}" + ("_" if name == "import" else "")  # a keyword: import_.py
        if importlib.util.find_spec(module_name) is None:
            continue
        yield name, importlib.import_module(module_name)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that subcommand (so ``dstk validate FILE`` imports validate's module,
    not every command's)."""
    parser = _Parser(
        prog="dstk",
        description="DeepSpeed/Megatron configuration toolkit: intent -> plan -> artifacts -> launch.",
    )
    parser.add_argument("--version", action="version", version=f"dstk {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in _command_modules(only):
        p = sub.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP))
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    first = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS and "-h" not in words[:1] and "--help" not in words[:1]
                          else None)
    try:
        args = parser.parse_args(argv)
    except DstkError as exc:  # a flag's type names itself and a fix (dstk.intent.flag_number)
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args._run(args) or 0)
    except DstkError as exc:
        if args.debug:
            raise
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug in dstk: say so plainly, traceback on request
        if args.debug:
            raise
        print(
            f"internal error (a bug in dstk {__version__}, not in your input): {type(exc).__name__}: {exc}\n"
            "  fix: rerun with --debug and report the traceback, the command line and the input files",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
