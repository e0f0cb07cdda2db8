"""Fuzz the intent loader: any YAML-shaped input gives an Intent or a DstkError with a hint,
never a traceback; an accepted intent satisfies its own rules."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstk.errors import DstkError
from dstk.intent import SECTIONS, Intent, intent_from_dict

FIELDS = {name: [f.name for f in dataclasses.fields(cls)] for name, cls in SECTIONS.items()}
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 5000), st.sampled_from([0, 1, 2, 3, 4, 8, 64, 4096, 2**20]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.sampled_from(["bf16", "fp16", "cpu", "h100-sxm", "adamw", "full", "megatron", "3e-4", "1e12", "none"]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3))


@st.composite
def intents(draw):
    data = {}
    for section, fields in FIELDS.items():
        if draw(st.booleans()) or section == "model":
            keys = draw(st.lists(st.sampled_from(fields + ["typo_key"]), max_size=6, unique=True))
            data[section] = {k: draw(values) for k in keys}
    if draw(st.integers(0, 9)) == 0:
        data["extra"] = {}
    return data


def _check_invariants(intent: Intent) -> None:
    c, t = intent.constraints, intent.training
    assert intent.cluster.world_size >= 1
    assert t.sequences_per_step >= 1 and t.steps >= 1
    for name in ("dp", "tp", "pp"):
        value = getattr(c, name)
        assert value is None or intent.cluster.world_size % value == 0
    if c.micro_batch is not None:
        assert t.sequences_per_step % c.micro_batch == 0
    assert intent.training.to_training().global_batch == t.sequences_per_step


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(intents())
def test_loader_never_crashes(data):
    try:
        intent = intent_from_dict(data, source="fuzz.yaml")
    except DstkError as exc:
        assert exc.message and exc.hint and exc.location == "fuzz.yaml"
        return
    _check_invariants(intent)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.integers(1, 16), st.sampled_from([1, 2, 3, 4, 8, 16, None]),
       st.sampled_from([1, 2, 4, None]), st.integers(1, 4096), st.sampled_from([64, 128, 1000, 4096]))
def test_valid_shapes_are_accepted_or_explained(nodes, per_node, tp, pp, batch, seq):
    data = {
        "model": {"num_layers": 8, "hidden_size": 256, "num_heads": 8, "vocab_size": 1000},
        "cluster": {"num_nodes": nodes, "gpus_per_node": per_node},
        "training": {"seq_len": seq, "global_batch": batch},
        "constraints": {k: v for k, v in {"tp": tp, "pp": pp}.items() if v is not None},
    }
    try:
        intent = intent_from_dict(data)
    except DstkError as exc:
        assert exc.hint
        world = nodes * per_node
        assert (tp or 1) * (pp or 1) > 0 and (world % ((tp or 1) * (pp or 1)) or per_node % (tp or 1))
        return
    _check_invariants(intent)
