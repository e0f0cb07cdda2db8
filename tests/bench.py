"""Load a script of benchmarks/ as a module, for tests that check the figures it prints."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(stem: str):
    """``benchmarks/<stem>.py`` as the module ``<stem>``, loaded once per session (its dataclasses look
    their module up in ``sys.modules``, and one benchmark imports another by name)."""
    if stem in sys.modules:
        return sys.modules[stem]
    spec = importlib.util.spec_from_file_location(stem, BENCHMARKS / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[stem]
        raise
    return module
