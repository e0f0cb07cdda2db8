"""dstk: turn training intent into a DeepSpeed/Megatron plan, validated configs and launch commands.

The package is split in two: ``dstk`` holds family-agnostic machinery, ``dstk.models`` holds
everything about one model family per file. Importing ``dstk`` must stay cheap: nothing here
imports torch, deepspeed or transformers at module level.
"""

__version__ = "0.1.0"
