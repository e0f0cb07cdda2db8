"""Fine-tuning on the plan: data, tokenizer, model, the DeepSpeed engine loop, checkpoints, export.

The parent process (``dstk finetune``) checks every input and prepares the data *before* any rank
starts (``dstk.train.prepare``); each rank then runs ``python -m dstk.train.worker SPEC`` under the
deepspeed runner (through ``dstk.launch``). Importing this package imports no torch.
"""
