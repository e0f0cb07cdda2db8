"""One rank of the ZeRO-3 gathered-parameter check: for each case, build a real HF model from its
config, ``deepspeed.initialize`` it with the case's ZeRO-3 config, train warm-up steps and then
measured steps, and print (rank 0, one JSON line) the most parameter elements gathered at once
during each measured step. Started by ``tests/test_zero3_gathered_peak.py`` through
``tests/dist.py``.

How it counts: DeepSpeed 0.19.8 gathers parameters only in
``PartitionedParameterCoordinator._fetch_sub_module_impl`` (the module's own all-gather, then the
prefetch; ``partitioned_param_coordinator.py:353-492``) and frees them only in
``release_sub_module`` / ``release_and_reset_all`` / ``release_backward_leftovers``. The count of
gathered elements therefore rises only inside a fetch, so the largest count of a step is seen at
the end of some fetch: a wrapper around ``_fetch_sub_module_impl`` sums, after each call,
``ds_numel`` of every parameter whose ``ds_status`` is not ``NOT_AVAILABLE`` (``AVAILABLE``, or
``INFLIGHT``: the gather's buffer is already allocated), leaving out ``ds_persist`` parameters
(kept whole all the time: ``model_states``' ``w * persistent``), and takes the maximum over the
step. The coordinator's own counter (``__n_available_params``) is reported beside it.

The first two steps are not measured: DeepSpeed records the module trace in the second one
(``reset_step``) and prefetches only from the third.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings

import deepspeed
import torch
import transformers
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

WARMUP_STEPS = 2
MEASURED_STEPS = 2
SEQ_LEN = 32

_state: dict = {"params": [], "peak": 0, "peak_counter": 0}


def gathered_elements() -> int:
    """Elements of the non-persistent parameters gathered now (AVAILABLE or INFLIGHT)."""
    return sum(p.ds_numel for p in _state["params"]
               if not p.ds_persist and p.ds_status != ZeroParamStatus.NOT_AVAILABLE)


def watch_fetches() -> None:
    """Wrap the coordinator's fetch so that every gather is followed by a count."""
    original = PartitionedParameterCoordinator._fetch_sub_module_impl

    def fetch_and_count(self, current_submodule, forward, is_leaf):
        original(self, current_submodule, forward, is_leaf)
        _state["peak"] = max(_state["peak"], gathered_elements())
        _state["peak_counter"] = max(_state["peak_counter"],
                                     self._PartitionedParameterCoordinator__n_available_params)

    PartitionedParameterCoordinator._fetch_sub_module_impl = fetch_and_count


def run_case(case: dict) -> dict:
    keys = dict(case["model"])
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys)
    ds = case["ds"]
    micro = ds["train_micro_batch_size_per_gpu"]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if case.get("recompute"):
        model.gradient_checkpointing_enable()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    _state["params"] = list(engine.module.parameters())
    persistent = sum(p.ds_numel for p in _state["params"] if p.ds_persist)
    gen = torch.Generator().manual_seed(1)
    steps = []
    for step in range(1, WARMUP_STEPS + MEASURED_STEPS + 1):
        _state["peak"] = _state["peak_counter"] = 0
        ids = torch.randint(0, config.vocab_size, (micro, SEQ_LEN), generator=gen)
        loss = engine(input_ids=ids, labels=ids).loss
        at_loss = gathered_elements()  # what forward hands to backward: held beside the logits
        engine.backward(loss)
        engine.step()
        if step > WARMUP_STEPS:
            steps.append({"peak": _state["peak"], "counter": _state["peak_counter"], "at_loss": at_loss})
    total = sum(p.ds_numel for p in _state["params"])
    engine.destroy()
    _state["params"] = []
    return {"steps": steps, "params": total, "persistent": persistent}


def main() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    watch_fetches()
    deepspeed.init_distributed(dist_backend="gloo")
    results = [run_case(case) for case in json.loads(sys.argv[1])]
    if torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    main()
