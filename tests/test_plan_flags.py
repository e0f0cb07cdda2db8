"""The flags of the fast commands: readable metavars, and shared flags that mean the same everywhere."""

from __future__ import annotations

import argparse
import json
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


def test_every_intent_field_has_a_flag():
    """The README promises that every intent field is also a flag: a field added to the intent
    dataclasses without one fails here."""
    import dataclasses

    from dstk import intent
    from dstk.commands.plan import _FLAGS

    switches = {("constraints", "offload"): "--no-offload", ("constraints", "tp_across_nodes"): "--tp-across-nodes"}
    flagged = {(section, field) for _, section, field, _ in _FLAGS} | set(switches)
    missing = [f"{section}.{f.name}" for section, cls in (("model", intent.ModelIntent),
                                                          ("cluster", intent.ClusterIntent),
                                                          ("training", intent.TrainingIntent),
                                                          ("constraints", intent.Constraints))
               for f in dataclasses.fields(cls) if (section, f.name) not in flagged]
    assert not missing, f"intent fields without a flag: {missing}"


def test_optimizer_flags_reach_the_generated_config(tmp_path):
    from pathlib import Path

    from dstk.cli import main

    intent = Path(__file__).parent.parent / "examples" / "intents" / "tiny-llama-cpu.yaml"
    assert main(["generate", str(intent), "--betas", "0.9", "0.99", "--weight-decay", "0", "--grad-clip", "0.5",
                 "--eps", "1e-6", "--min-lr-ratio", "0.2", "--output", str(tmp_path / "run")]) == 0
    ds = json.loads((tmp_path / "run" / "ds_config.json").read_text())
    assert ds["optimizer"]["params"]["betas"] == [0.9, 0.99] and ds["optimizer"]["params"]["weight_decay"] == 0
    assert ds["optimizer"]["params"]["eps"] == 1e-6 and ds["gradient_clipping"] == 0.5
    assert ds["scheduler"]["params"]["cos_min_ratio"] == 0.2
