"""The flags of the fast commands: readable metavars, and shared flags that mean the same everywhere."""

from __future__ import annotations

import argparse
import re

import pytest

from dstk.cli import build_parser


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_command_is_found():
    assert {"estimate", "plan", "generate", "explain"} <= set(_subparsers())


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_no_internal_dest_as_metavar(name):
    """argparse shows the dest (I_MODEL__NUM_LAYERS) when a flag has no metavar."""
    text = _subparsers()[name].format_help()
    leaked = sorted(set(re.findall(r"\bI_[A-Z_]+__[A-Z_]+", text)))
    assert not leaked, f"dstk {name} --help shows {leaked}"
