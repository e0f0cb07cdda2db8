"""A small training script for `dstk launch`: the shape yours will have.

    dstk generate examples/intents/tiny-llama-cpu.yaml --output runs/tiny
    dstk launch runs/tiny -- examples/train.py --steps 20

`dstk launch` passes `--deepspeed_config RUN/ds_config.json` (the deepspeed runner adds
`--local_rank`). The model is the plan's (plan.json next to the config: its HF config, random
weights) or a tiny Llama; the data is random token ids, so the loss falls only as far as the
unigram statistics allow. Replace both with yours. Works on CPU ranks (gloo) and GPUs (NCCL).
"""

import argparse
import json
from pathlib import Path

import deepspeed
import torch
import transformers
from deepspeed.accelerator import get_accelerator

from dstk.launch.rank import exit_rank

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--deepspeed_config", required=True, help="passed by `dstk launch`")
parser.add_argument("--local_rank", type=int, default=0, help="passed by the deepspeed runner")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--seq-len", type=int, default=64)
args = parser.parse_args()

deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
plan_file = Path(args.deepspeed_config).with_name("plan.json")
hf = json.loads(plan_file.read_text())["model"].get("hf_config") if plan_file.is_file() else None
hf = dict(hf or {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512})
hf.setdefault("max_position_embeddings", args.seq_len)
torch.manual_seed(0)  # the same initial weights on every rank
model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(hf.pop("model_type"), **hf))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()],
                                       config=args.deepspeed_config)

# Each data-parallel rank reads its own batches; a skewed token distribution gives the model
# something to learn.
generator = torch.Generator().manual_seed(1 + torch.distributed.get_rank())
weights = torch.arange(model.config.vocab_size, 0, -1, dtype=torch.float) ** 2
micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
for step in range(1, args.steps + 1):
    for _ in range(accum):
        ids = torch.multinomial(weights, micro * args.seq_len, replacement=True, generator=generator)
        ids = ids.view(micro, args.seq_len).to(engine.device)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    if torch.distributed.get_rank() == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
# Wait for every rank, destroy the process group and exit without the abort that torch's gloo
# backend (CPU ranks) can hit while the interpreter finalizes.
exit_rank()
