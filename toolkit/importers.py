"""Read another tool's training setup and say which dstk intent it implies (``dstk import``, ``--from``).

Formats, detected by content (``kind`` overrides):

- ``accelerate``: the YAML ``accelerate config`` writes (``distributed_type``, ``num_processes``,
  ``mixed_precision``, ``deepspeed_config`` with ``zero_stage`` / ``offload_*_device`` /
  ``gradient_accumulation_steps`` / ``gradient_clipping`` or ``deepspeed_config_file``; also
  ``fsdp_config`` and ``megatron_lm_config``). Keys: ``accelerate/commands/config/cluster.py``.
- ``llamafactory``: a LLaMA-Factory training YAML (``model_name_or_path``, ``cutoff_len``,
  ``finetuning_type``, ``deepspeed``, and the ``TrainingArguments`` keys it passes on).
- ``axolotl``: an axolotl YAML (``base_model``, ``sequence_len``, ``micro_batch_size``, ``deepspeed``...).
- ``hf-args``: ``TrainingArguments.to_json_string()`` (transformers 4 and 5), or ``hf-flags``: the
  command line of a ``run_clm.py``-style script (``--per_device_train_batch_size 8 ...``), launcher
  included (``torchrun --nproc_per_node``, ``accelerate launch --num_processes``, ``deepspeed --num_gpus``).
- ``megatron``: a Megatron-LM argument list (``--num-layers 24 --tensor-model-parallel-size 2 ...``).

LoRA/QLoRA settings (LLaMA-Factory's ``finetuning_type``/``lora_*``/``quantization_bit``, axolotl's ``adapter``/
``lora_*``/``load_in_4bit``) are carried; values a Trainer-based file leaves out take ``TrainingArguments``'
defaults; keys accelerate would refuse or silently ignore are named with the fix.

A followed DeepSpeed JSON adds its ZeRO stage, offload, batch triad, clipping, precision and optimizer;
``"auto"`` means "not fixed". Every key of the input becomes one report line: carried (with the intent
field it set), dropped (with why) or, for what the intent needed and the file did not say, assumed.
Values the user fixed (ZeRO stage, offload, micro-batch, tp/pp) become constraints, so the planner
prices the run as written; the rest is left to the planner.

Local files only: a model named by a hub id is resolved to a local path, the local HF cache, or a dstk
preset of the same name; otherwise it is an error that says how to point at a ``config.json``.
Pure: reads files, imports no torch, DeepSpeed or transformers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
from typing import Any

from dstk.errors import DstkError, UsageError

KINDS: tuple[str, ...] = ("accelerate", "llamafactory", "axolotl", "hf-args", "hf-flags", "megatron")
ACTIONS: tuple[str, ...] = ("carried", "dropped", "assumed")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ImportLine:
    """One value of the input (or one the intent needed) and what became of it."""

    action: str
    """carried, dropped or assumed."""
    key: str
    """The input's key (``cutoff_len``, ``--num-layers``, ``zero_optimization.stage``); for assumed, the field."""
    value: Any
    """The value as read (carried/dropped) or as assumed."""
    where: str
    """``file:line`` of the key, or the file alone."""
    target: str | None = None
    """The intent field it set (``training.seq_len``), None when dropped."""
    reason: str = ""
    """Why it was dropped or assumed, or how it was converted."""

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("action", "key", "value", "where", "target", "reason")}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ImportResult:
    """What ``import_file`` read: the kind, the intent (as sections of set values and as an ``Intent``),
    the report lines, and the DeepSpeed JSON files it followed."""

    kind: str
    source: str
    data: dict
    """Intent sections with the values the import set (flags included), as ``intent_from_dict`` reads them."""
    intent: Any
    """The checked ``dstk.intent.Intent``."""
    lines: tuple[ImportLine, ...]
    followed: tuple[str, ...] = ()
    origins: dict = dataclasses.field(default_factory=dict)
    """``"training.seq_len"`` -> where it came from, for the comments of the written YAML."""

    def to_dict(self) -> dict:
        return {"kind": self.kind, "source": self.source, "followed": list(self.followed),
                "intent": self.data, "lines": [line.to_dict() for line in self.lines]}


# ---------------------------------------------------------------------------------------------- reading


STDIN = "-"
"""The path that means standard input (``dstk import -``, ``--from -``)."""
STDIN_SOURCE = "<stdin>"
"""How standard input is named in report lines and errors."""
_MAX_STDIN_CHARS = 8 * 2**20


def _read_stdin(stream=None) -> str:
    import sys

    stream = stream if stream is not None else sys.stdin
    try:
        text = stream.read(_MAX_STDIN_CHARS + 1)
    except UnicodeDecodeError:
        raise UsageError(f"{STDIN_SOURCE}: not UTF-8 text", hint="pipe the config file itself") from None
    if len(text) > _MAX_STDIN_CHARS:
        raise UsageError(f"{STDIN_SOURCE}: more than {_MAX_STDIN_CHARS:,} characters, not a training config",
                         hint="pipe the config file itself, or give its path instead of -")
    if not text.strip():
        raise UsageError(f"{STDIN_SOURCE}: standard input is empty",
                         hint="pipe the file into it (dstk import - < accelerate_config.yaml), or give its path")
    return text


def _read_text(path: str) -> str:
    if path == STDIN:
        return _read_stdin()
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(_MAX_STDIN_CHARS + 1)  # /dev/zero would never end
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file", hint="check the path of the file to import") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory", hint="give the config file itself") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}",
                         hint="check the path and its permissions") from None
    if len(text) > _MAX_STDIN_CHARS:
        raise UsageError(f"{path}: more than {_MAX_STDIN_CHARS:,} characters, not a training config",
                         hint="give the config file itself")
    return text


def _load_mapping(text: str, *, source: str, strict_syntax: bool) -> tuple[Any, dict[str, int]]:
    """A YAML or JSON config and its dotted key paths (``deepspeed_config.zero_stage``) -> 1-based lines,
    through the intent's strict reader (``dstk.intent.parse_user_text``): a duplicate key (the tools'
    own readers, yaml.safe_load and json.load, keep the last one silently), an alias, deep nesting or
    NaN is refused with ``file:line``. YAML keeps PyYAML's values (``2e-5`` is a string there, as
    accelerate, LLaMA-Factory and axolotl read it); JSON keeps json's. Aliases are refused: no config
    under tests/data/import uses one, and none of the three tools documents them.

    A syntax error is an error when the format was named (``strict_syntax``); otherwise the text may
    be a command line (``run_clm.py --lr 1e-5 ...``), and (None, {}) lets detection go on."""
    import yaml

    from dstk.intent import parse_user_text

    if not strict_syntax:  # is it YAML/JSON at all? A command line need not be.
        try:
            (json.loads if text.lstrip().startswith("{") else yaml.safe_load)(text)
        except (json.JSONDecodeError, yaml.YAMLError):
            return None, {}
        except (ValueError, RecursionError):
            pass  # too deep, or a number too long: the strict reader names it
    return parse_user_text(text, source=source, what="config",
                           example="the config file as the tool wrote it (dstk import --kind KIND FILE)")


def _tokens(text: str) -> list[str]:
    """The words of a shell command line or an argument file: comments and line continuations removed,
    the script's own variables expanded (``_expand_shell``)."""
    try:
        return shlex.split(_expand_shell(text.replace("\\\n", " ")), comments=True)
    except ValueError as exc:
        raise DstkError(f"cannot split the command line: {exc}", hint="check the quoting") from None


_ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|declare\s+(?:-a\s+)?)?([A-Za-z_]\w*)=(.*)$")


def _expand_shell(text: str) -> str:
    """A launch script as the shell would run it, for the flags: ``NAME=value`` and ``NAME=( ... )`` lines
    (Megatron-LM's ``examples/gpt3/train_gpt3_175b_distributed.sh`` keeps every flag in arrays such as
    ``GPT_MODEL_ARGS=( --num-layers 96 ... )`` and launches ``torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py
    ${GPT_MODEL_ARGS[@]} ...``, with ``--nproc_per_node $GPUS_PER_NODE``) are taken out and their values put
    where ``$NAME``, ``${NAME}`` and ``${NAME[@]}`` stand. A variable the script does not set (``$1``) stays."""
    scalars: dict[str, str] = {}
    arrays: dict[str, str] = {}
    kept: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        bare = lines[i].split(" #")[0].split("\t#")[0].rstrip()
        match = _ASSIGN.match(bare) if not bare.lstrip().startswith("#") else None
        if match and match.group(2).startswith("("):
            name, body = match.group(1), [match.group(2)[1:]]
            while not body[-1].rstrip().endswith(")") and i + 1 < len(lines):
                i += 1
                body.append(lines[i].split(" #")[0].split("\t#")[0].rstrip())
            body[-1] = body[-1].rstrip()[:-1] if body[-1].rstrip().endswith(")") else body[-1]
            arrays[name] = " ".join(part.strip() for part in body)
        elif match and re.fullmatch(r"'[^']*'|\"[^\"]*\"|\S*", match.group(2).strip()):
            value = match.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            scalars[match.group(1)] = value
        else:
            kept.append(lines[i])
        i += 1
    if not scalars and not arrays:
        return text

    def substitute(body: str) -> str:
        for _ in range(4):  # values that name other variables
            new = re.sub(r"\"?\$\{(\w+)\[@\]\}\"?", lambda m: arrays.get(m.group(1), m.group(0)), body)
            new = re.sub(r"\$\{(\w+)\}|\$([A-Za-z_]\w*)",
                         lambda m: scalars.get(m.group(1) or m.group(2), m.group(0)), new)
            if new == body:
                break
            body = new
        return body

    arrays = {name: substitute(value) for name, value in arrays.items()}
    return substitute("\n".join(kept))


def detect_kind(text: str, data: Any) -> str | None:
    """The format of a file from its content; None when nothing matches."""
    if isinstance(data, dict):
        keys = set(data)
        if keys & {"distributed_type", "compute_environment"} or ("num_processes" in keys and "mixed_precision" in keys):
            return "accelerate"
        if keys & {"base_model", "sequence_len", "micro_batch_size", "base_model_config"}:
            return "axolotl"
        if keys & {"model_name_or_path", "cutoff_len", "finetuning_type"} and not keys & {"output_dir", "logging_dir"} \
                or keys & {"cutoff_len", "finetuning_type"}:
            return "llamafactory"
        if keys & {"per_device_train_batch_size", "learning_rate", "gradient_accumulation_steps"}:
            return "hf-args"
        return None
    if re.search(r"--(num-layers|hidden-size|tensor-model-parallel-size|num-attention-heads|micro-batch-size)\b", text):
        return "megatron"
    if re.search(r"--(per_device_train_batch_size|model_name_or_path|gradient_accumulation_steps|learning_rate|"
                 r"output_dir)\b", text):
        return "hf-flags"
    return None


def _flag_lines(text: str) -> dict[str, int]:
    """``--flag`` (and ``flag``, for the TrainingArguments names) -> the 1-based line it first appears on."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for match in re.finditer(r"(?<![\w-])(--[A-Za-z][\w-]*)", line.split(" #")[0]):
            flag = match.group(1)
            lines.setdefault(flag, number)
            lines.setdefault(flag[2:].replace("-", "_"), number)
    return lines


def _parse_flags(words: list[str]) -> list[tuple[str, Any]]:
    """``--key value`` / ``--key=value`` / bare ``--flag`` (true) pairs, in order."""
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--") and len(word) > 2:
            if "=" in word:
                key, value = word.split("=", 1)
                out.append((key, value))
            elif i + 1 < len(words) and not (words[i + 1].startswith("--") and len(words[i + 1]) > 2):
                out.append((word, words[i + 1]))
                i += 1
            else:
                out.append((word, True))
        i += 1
    return out


def _scalar(value: Any) -> Any:
    """A command-line word as YAML would read it (``8`` -> 8, ``1e-5`` -> 1e-05, ``True`` -> True)."""
    if not isinstance(value, str):
        return value
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


# ---------------------------------------------------------------------------------------------- facts


@dataclasses.dataclass(kw_only=True, slots=True)
class _Fact:
    value: Any
    key: str
    where: str
    note: str = ""
    raw: Any = None
    """The value as the file wrote it (``DEEPSPEED``, ``true``), when it differs from ``value``."""


class _Reader:
    """Collects facts (what the run does, in dstk's words) and one report line per input key."""

    def __init__(self, *, source: str, lines: dict[str, int] | None = None):
        self.source = source
        self.key_lines = lines or {}
        self.facts: dict[str, _Fact] = {}
        self.lines: list[ImportLine] = []
        self.followed: list[str] = []
        self.path_notes: dict[str, str] = {}
        """A followed file's path -> how it was found, when not where the tool itself would look."""

    def where(self, key: str) -> str:
        line = self.key_lines.get(key)
        return f"{self.source}:{line}" if line else self.source

    def set(self, name: str, value: Any, key: str, *, note: str = "", where: str | None = None,
            override: bool = False, raw: Any = None) -> None:
        """Record a fact; a second, different value for it is dropped (or wins, with ``override``)."""
        at = where or self.where(key)
        old = self.facts.get(name)
        if old is not None and old.value == value and old.key != key:
            self.lines.append(ImportLine(action="carried", key=key, value=_plain(value if raw is None else raw),
                                         where=at, reason=f"agrees with {old.key} ({old.where})"))
            return
        if old is not None and old.value is None and value is not None:
            override = True  # an "auto" the file left open, now fixed by a followed config
        if old is not None and old.value != value and not override:
            self.drop(key, value, f"{old.key} ({old.where}) already sets it to {old.value!r}; "
                                  "transformers refuses a DeepSpeed value that contradicts its arguments"
                      if "deepspeed" in note or "/" in key else f"{old.key} already sets it to {old.value!r}",
                      where=at)
            return
        if old is not None and old.value != value:
            note = (note + "; " if note else "") + f"overrides {old.key} ({old.where})"
            self.drop(old.key, old.value if old.raw is None else old.raw, f"{key} ({at}) decides it", where=old.where)
        self.facts[name] = _Fact(value=value, key=key, where=at, note=note, raw=raw)

    def drop(self, key: str, value: Any, reason: str, *, where: str | None = None) -> None:
        self.lines.append(ImportLine(action="dropped", key=key, value=_plain(value), where=where or self.where(key),
                                     reason=reason))

    def get(self, name: str) -> Any:
        fact = self.facts.get(name)
        return None if fact is None else fact.value


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


NO_EFFECT = "no effect on memory or step time (not part of a dstk intent)"
DATA_KEY = "a data/logging/output setting: no effect on the plan"


def _number(r: _Reader, key: str, value: Any, *, kind=float, minimum: float | None = None) -> Any:
    if isinstance(value, str):
        value = _scalar(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DstkError(f"{key} is {value!r}: expected a number", location=r.where(key),
                        hint=f"write a number for {key}")
    if kind is int:
        if value != int(value):
            raise DstkError(f"{key} is {value!r}: expected a whole number", location=r.where(key),
                            hint=f"write a whole number for {key}")
        value = int(value)
    if minimum is not None and value < minimum:
        raise DstkError(f"{key} is {value!r}: expected at least {minimum}", location=r.where(key),
                        hint=f"write a number >= {minimum} for {key}")
    return value


# HF ``optim`` names -> dstk's optimizer families (transformers ``OptimizerNames``).
def _hf_optimizer(name: str) -> tuple[str | None, str]:
    n = str(name).lower()
    if n.startswith("adafactor"):
        return "adafactor", ""
    if "lion" in n:
        return "lion", "8-bit states priced as 32-bit (an upper bound)" if "8bit" in n else ""
    if n in ("sgd",) or n.startswith("sgd"):
        return "sgd", ""
    if n.startswith(("adagrad", "rmsprop")):
        return "sgd", f"{name} keeps one fp32 state per parameter: priced as SGD with momentum"
    if "adam" in n:
        note = "8-bit/paged states priced as fp32 AdamW (an upper bound)" if ("8bit" in n or "paged" in n) else ""
        return "adamw", note
    return None, f"optimizer {name!r} has no dstk family (adamw, adam, sgd, lion, adafactor)"


_SCHEDULES = {"cosine": "cosine", "cosine_with_min_lr": "cosine", "cosine_warmup_with_min_lr": "cosine",
              "linear": "linear", "constant": "constant", "constant_with_warmup": "constant"}


def _hf_common(r: _Reader, data: dict, *, handled: set[str]) -> None:
    """The ``TrainingArguments`` keys that LLaMA-Factory, run_clm flags and the JSON dump share."""
    for key, value in data.items():
        if key in handled:
            continue
        if key == "per_device_train_batch_size":
            r.set("micro_batch", _number(r, key, value, kind=int, minimum=1), key)
        elif key == "gradient_accumulation_steps":
            r.set("grad_accum", _number(r, key, value, kind=int, minimum=1), key)
        elif key == "learning_rate":
            r.set("lr", _number(r, key, value), key)
        elif key == "weight_decay":
            r.set("weight_decay", _number(r, key, value, minimum=0), key)
        elif key in ("adam_beta1", "adam_beta2"):
            r.set(key, _number(r, key, value), key)
        elif key == "adam_epsilon":
            r.set("eps", _number(r, key, value), key)
        elif key == "max_grad_norm":
            r.set("grad_clip", _number(r, key, value, minimum=0), key)
        elif key == "max_steps":
            steps = _number(r, key, value, kind=int)
            if steps > 0:
                r.set("train_steps", steps, key)
            else:
                r.drop(key, value, "-1 means \"train num_train_epochs\": the step count then needs the dataset size")
        elif key == "num_train_epochs":
            r.drop(key, value, "epochs need the dataset size; give the step count (--train-steps) or the token "
                               "budget (--num-tokens)")
        elif key == "lr_scheduler_type":
            schedule = _SCHEDULES.get(str(value).lower())
            if schedule:
                r.set("schedule", schedule, key, note="" if schedule == value else f"{value} -> {schedule}")
            else:
                r.drop(key, value, "dstk schedules are cosine, linear and constant")
        elif key == "lr_scheduler_kwargs":
            ratio = value.get("min_lr_rate") if isinstance(value, dict) else None
            if ratio is not None:
                r.set("min_lr_ratio", _number(r, key, ratio), key)
            else:
                r.drop(key, value, "only min_lr_rate has a dstk field (min_lr_ratio)" if value else "unset")
        elif key == "warmup_steps":
            steps = _number(r, key, value, minimum=0)
            if 0 < steps < 1:
                r.set("warmup_ratio", steps, key, note="a float below 1 is a ratio of the total steps (transformers 5)")
            elif steps >= 1:
                r.set("warmup_steps", int(steps), key)
            else:
                r.drop(key, value, "0: the learning rate starts at its peak; dstk needs at least 1 step (assumed 1)")
                r.set("warmup_steps", 1, key)
        elif key == "warmup_ratio":
            ratio = _number(r, key, value, minimum=0)
            if ratio > 0:
                r.set("warmup_ratio", ratio, key)
            else:
                r.drop(key, value, "0: no warmup ratio")
        elif key in ("bf16", "fp16", "pure_bf16"):
            if value is True or value == "true":
                r.set("precision", "fp16" if key == "fp16" else "bf16", key, raw=value,
                      note="pure_bf16: bf16 weights and states, priced as bf16 mixed precision (an upper bound)"
                      if key == "pure_bf16" else "")
            elif value == "auto":
                r.set("precision", None, key, raw=value, note='"auto": bf16 where the GPU has it, else fp16 (dstk\'s default)')
            else:
                r.drop(key, value, "false: not this precision")
        elif key == "optim":
            family, note = _hf_optimizer(value)
            if family:
                r.set("optimizer", family, key, raw=value, note=note or (f"{value} -> {family}" if value != family else ""))
            else:
                r.drop(key, value, note)
        elif key in ("gradient_checkpointing", "activation_checkpointing"):
            if value is True:
                r.set("recompute", "full", key, raw=value,
                      note="HF gradient checkpointing recomputes each layer: full")
            else:
                r.drop(key, value, "off: recomputation left to the planner (pin it with --recompute none)")
        elif key == "deepspeed":
            if value in (None, "", {}):
                r.drop(key, value, "no DeepSpeed config")
            else:
                _follow_deepspeed(r, key, value)
        elif key in ("fsdp", "fsdp_config") and value:
            r.drop(key, value, "FSDP through the Trainer: dstk renders DeepSpeed; FULL_SHARD prices as ZeRO-3 "
                               "(pin it with --zero 3)")
        elif key in ("block_size", "max_seq_length", "max_length", "model_max_length"):
            if value in (None, -1):
                r.drop(key, value, "unset")
            else:
                r.set("seq_len", _number(r, key, value, kind=int, minimum=1), key)
        elif key in ("model_name_or_path", "config_name"):
            if value:
                r.set("model", str(value), key, override=key == "config_name")
            else:
                r.drop(key, value, "unset")
        elif key == "torch_compile" and value is True:
            r.drop(key, value, "compilation speed-up is not priced: step time is an upper bound")
        elif key == "tf32":
            r.drop(key, value, "TF32 matmuls touch fp32 work only; the plan prices the 16-bit path")
        elif key in ("per_device_eval_batch_size", "eval_strategy", "evaluation_strategy", "eval_steps"):
            r.drop(key, value, "evaluation: not part of the training step")
        else:
            r.drop(key, value, NO_EFFECT)


# ---------------------------------------------------------------------------------------------- DeepSpeed JSON


def _resolve_path(r: _Reader, key: str, value: str, *, what: str) -> str:
    """A path as the tool would open it (relative to the working directory), else next to the file, else
    relative to a directory above the file (nearest first): LLaMA-Factory's examples name
    ``examples/deepspeed/ds_z3_config.json`` from ``examples/train_lora/``, for ``llamafactory-cli train`` run
    from the repository's root. A path found only above the file is said in the report."""
    candidates = [value]
    above: list[str] = []
    if not os.path.isabs(value) and r.source != STDIN_SOURCE:
        here = os.path.dirname(os.path.abspath(r.source))
        candidates.append(os.path.join(here, value))
        parent = os.path.dirname(here)
        while parent != here:
            above.append(os.path.join(parent, value))
            here, parent = parent, os.path.dirname(parent)
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    for candidate in above:
        if os.path.isfile(candidate):
            base = candidate[: -len(value)].rstrip(os.sep) or os.sep
            r.path_notes[candidate] = (f"not in the working directory nor next to {os.path.basename(r.source)}: "
                                       f"read from {base}, the nearest directory above the file that has it (the "
                                       f"tool opens it relative to the directory it runs in: run it from {base})")
            return candidate
    beside = ("; standard input has no directory of its own" if r.source == STDIN_SOURCE
              else f", next to {os.path.basename(r.source)} and in the directories above it")
    raise DstkError(f"{key}: {what} {value!r} does not exist (looked in the working directory{beside})",
                    location=r.where(key),
                    hint=f"fix the path in {key}, run dstk from the directory the tool runs in, or copy the file "
                         "next to the one you import")


def _follow_deepspeed(r: _Reader, key: str, value: Any) -> None:
    from dstk.validate import read_document

    if isinstance(value, dict):
        doc_config, positions, source = value, {}, f"{r.source} ({key})"
    else:
        path = _resolve_path(r, key, str(value), what="DeepSpeed config")
        try:
            doc = read_document(path)
        except OSError as exc:
            raise UsageError(f"{path}: cannot read it: {exc.strerror or exc}", location=r.where(key),
                             hint="check the path") from None
        errors = [f for f in doc.findings if f.severity == "error"]
        if errors or not isinstance(doc.config, dict):
            f = errors[0] if errors else None
            at = path + (f":{f.line}:{f.column}" if f and f.line is not None else "")
            raise DstkError(f"the DeepSpeed config {key} points at is not valid: "
                            f"{f.message if f else 'not a JSON object'}", location=at,
                            hint=(f.hint if f and f.hint else "fix the file, then import again"))
        doc_config, positions, source = doc.config, doc.positions, path
        r.followed.append(path)
    r.lines.append(ImportLine(action="carried", key=key, value=_plain(value) if isinstance(value, str) else "{...}",
                              where=r.where(key), target=None, reason=f"followed: {source}"
                              + (f"; {r.path_notes[source]}" if source in r.path_notes else "")))
    _read_deepspeed(r, doc_config, positions=positions, source=source)


def _read_deepspeed(r: _Reader, config: dict, *, positions: dict, source: str) -> None:
    """What a DeepSpeed config fixes, as facts; ``"auto"`` and absent keys fix nothing."""

    def at(pointer: str) -> str:
        pos = positions.get(pointer)
        return f"{source}:{pos[0]}" if pos else source

    def key(pointer: str) -> str:
        return pointer.strip("/").replace("/", ".")

    def fixed(pointer: str, value: Any) -> bool:
        if value == "auto":
            r.drop(key(pointer), value, '"auto": filled by the Trainer/accelerate; not fixed', where=at(pointer))
            return False
        return True

    for name, value in config.items():
        pointer = f"/{name}"
        if name == "zero_optimization" and isinstance(value, dict):
            for zk, zv in value.items():
                zp = f"{pointer}/{zk}"
                if zk == "stage":
                    if fixed(zp, zv):
                        if zv not in (0, 1, 2, 3) or isinstance(zv, bool):
                            raise DstkError(f"{key(zp)} is {zv!r}", location=at(zp), hint="write 0, 1, 2 or 3")
                        r.set("zero_stage", zv, key(zp), where=at(zp), note="deepspeed")
                elif zk in ("offload_optimizer", "offload_param") and isinstance(zv, dict):
                    device = zv.get("device", "none")
                    dp = f"{zp}/device"
                    if fixed(dp, device):
                        if device not in ("none", "cpu", "nvme", None):
                            raise DstkError(f"{key(dp)} is {device!r}", location=at(dp), hint='write "cpu", "nvme" or "none"')
                        target = "offload_optimizer" if zk == "offload_optimizer" else "offload_params"
                        r.set(target, device or "none", key(dp), where=at(dp), note="deepspeed")
                        if device == "nvme" and zv.get("nvme_path"):
                            r.set("nvme_path", zv["nvme_path"], key(f"{zp}/nvme_path"), where=at(f"{zp}/nvme_path"))
                    for extra in zv:
                        if extra not in ("device", "nvme_path"):
                            r.drop(key(f"{zp}/{extra}"), zv[extra], "an offload tuning knob: not part of the intent",
                                   where=at(f"{zp}/{extra}"))
                elif zk in ("cpu_offload", "cpu_offload_param") and zv is True:
                    target = "offload_optimizer" if zk == "cpu_offload" else "offload_params"
                    r.set(target, "cpu", key(zp), where=at(zp), note="the deprecated form of offload to cpu")
                else:
                    r.drop(key(zp), zv, "a ZeRO tuning knob (buckets, overlap): `dstk estimate --config` prices it; "
                                        "the planner picks its own", where=at(zp))
        elif name == "train_micro_batch_size_per_gpu":
            if fixed(pointer, value):
                r.set("micro_batch", _ds_int(value, pointer, at), key(pointer), where=at(pointer), note="deepspeed")
        elif name == "gradient_accumulation_steps":
            if fixed(pointer, value):
                r.set("grad_accum", _ds_int(value, pointer, at), key(pointer), where=at(pointer), note="deepspeed")
        elif name == "train_batch_size":
            if fixed(pointer, value):
                r.set("global_batch", _ds_int(value, pointer, at), key(pointer), where=at(pointer), note="deepspeed")
        elif name == "gradient_clipping":
            if fixed(pointer, value):
                r.set("grad_clip", float(value), key(pointer), where=at(pointer), note="deepspeed")
        elif name in ("bf16", "bfloat16", "fp16") and isinstance(value, dict):
            enabled = value.get("enabled", False)
            if fixed(f"{pointer}/enabled", enabled):
                if enabled is True:
                    r.set("precision", "fp16" if name == "fp16" else "bf16", key(f"{pointer}/enabled"), raw=True,
                          where=at(f"{pointer}/enabled"), note="deepspeed")
                else:
                    r.drop(key(f"{pointer}/enabled"), enabled, "disabled", where=at(f"{pointer}/enabled"))
            for extra in value:
                if extra != "enabled":
                    r.drop(key(f"{pointer}/{extra}"), value[extra], "loss-scaling knob: no effect on the plan",
                           where=at(f"{pointer}/{extra}"))
        elif name == "optimizer" and isinstance(value, dict):
            _read_ds_optimizer(r, value, pointer=pointer, at=at, fixed=fixed)
        elif name == "scheduler" and isinstance(value, dict):
            params = value.get("params") or {}
            sp = f"{pointer}/params"
            kind = value.get("type")
            mapped = {"WarmupCosineLR": "cosine", "WarmupDecayLR": "linear", "WarmupLR": "constant"}.get(kind)
            if mapped:
                r.set("schedule", mapped, key(f"{pointer}/type"), where=at(f"{pointer}/type"),
                      note=f"DeepSpeed {kind} -> {mapped}", override=True)
            else:
                r.drop(key(f"{pointer}/type"), kind, "dstk schedules are cosine, linear and constant",
                       where=at(f"{pointer}/type"))
            for pk, pv in params.items():
                pp_ = f"{sp}/{pk}"
                if not fixed(pp_, pv):  # "auto": one dropped line
                    continue
                if pk == "warmup_num_steps":
                    r.set("warmup_steps", max(1, int(pv)), key(pp_), where=at(pp_), note="deepspeed")
                elif pk == "total_num_steps":
                    r.set("train_steps", int(pv), key(pp_), where=at(pp_), note="deepspeed")
                elif pk == "cos_min_ratio":
                    r.set("min_lr_ratio", float(pv), key(pp_), where=at(pp_), note="deepspeed")
                else:
                    r.drop(key(pp_), pv, NO_EFFECT, where=at(pp_))
        elif name == "tensor_parallel" and isinstance(value, dict) and (value.get("autotp_size") or 0) > 1:
            r.set("tp", int(value["autotp_size"]), key(f"{pointer}/autotp_size"), where=at(f"{pointer}/autotp_size"),
                  note="DeepSpeed AutoTP")
        elif name == "activation_checkpointing":
            r.drop(key(pointer), value, "DeepSpeed's checkpointing settings apply only when the model calls "
                                        "deepspeed.checkpointing; recomputation left to the planner", where=at(pointer))
        else:
            r.drop(key(pointer), value, NO_EFFECT, where=at(pointer))


def _ds_int(value: Any, pointer: str, at) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise DstkError(f"{pointer.strip('/')} is {value!r}: DeepSpeed expects a whole number >= 1",
                        location=at(pointer), hint='write a number, or "auto" under transformers\' Trainer')
    return int(value)


def _read_ds_optimizer(r: _Reader, block: dict, *, pointer: str, at, fixed) -> None:
    kind = block.get("type")
    tp = f"{pointer}/type"
    if isinstance(kind, str) and kind != "auto":
        n = kind.lower()
        params = block.get("params") or {}
        if n == "adam":
            family = "adam" if params.get("adam_w_mode") is False else "adamw"
        else:
            family = {"adamw": "adamw", "lamb": "adamw", "lion": "lion", "sgd": "sgd", "adafactor": "adafactor",
                      "adagrad": "sgd", "onebitadam": "adamw", "zerooneadam": "adamw", "onebitlamb": "adamw",
                      "muadamw": "adamw", "muadam": "adamw", "musgd": "sgd", "muon": "sgd"}.get(n)
        if family:
            r.set("optimizer", family, "optimizer.type", where=at(tp), override=True,
                  note=f"DeepSpeed's optimizer block replaces the Trainer's optim ({kind} -> {family})")
        else:
            r.drop("optimizer.type", kind, "no dstk optimizer family for it", where=at(tp))
    for pk, pv in (block.get("params") or {}).items():
        pp_ = f"{pointer}/params/{pk}"
        k = pp_.strip("/").replace("/", ".")
        if not fixed(pp_, pv):
            continue
        if pk == "lr":
            r.set("lr", float(pv), k, where=at(pp_), note="deepspeed")
        elif pk == "weight_decay":
            r.set("weight_decay", float(pv), k, where=at(pp_), note="deepspeed")
        elif pk == "eps":
            r.set("eps", float(pv), k, where=at(pp_), note="deepspeed")
        elif pk == "betas" and isinstance(pv, (list, tuple)) and len(pv) == 2:
            r.set("adam_beta1", float(pv[0]), k, where=at(pp_), note="deepspeed")
            r.set("adam_beta2", float(pv[1]), k, where=at(pp_), note="deepspeed")
        else:
            r.drop(k, pv, NO_EFFECT, where=at(pp_))


# ---------------------------------------------------------------------------------------------- formats


_ACCELERATE_QUIET = {"compute_environment", "debug", "machine_rank", "main_process_ip", "main_process_port",
                     "main_training_function", "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster",
                     "tpu_use_sudo", "gpu_ids", "enable_cpu_affinity", "dynamo_config", "tpu_name", "tpu_zone",
                     "commands", "command_file", "downcast_bf16"}
_FSDP_STAGES = {"FULL_SHARD": 3, "1": 3, "HYBRID_SHARD": 3, "SHARD_GRAD_OP": 2, "2": 2, "_HYBRID_SHARD_ZERO2": 2,
                "NO_SHARD": 0, "3": 0}


def _read_accelerate(r: _Reader, data: dict) -> None:
    dist = str(data.get("distributed_type", "NO"))
    for key, value in data.items():
        if key == "distributed_type":
            if value == "DEEPSPEED":
                r.set("engine", "deepspeed", key, raw=value)
            elif value == "MEGATRON_LM":
                r.set("engine", "megatron", key, raw=value)
            elif value in ("MULTI_GPU", "NO"):
                r.set("zero_stage", 0, key, raw=value, note="DDP keeps a full replica of weights, gradients and optimizer "
                                                 "states on every GPU: ZeRO-0")
                r.set("offload", False, key, raw=value, note="DDP does not offload")
            elif value == "FSDP":
                r.lines.append(ImportLine(action="carried", key=key, value=value, where=r.where(key),
                                          reason="FSDP priced as the ZeRO stage of the same sharding; dstk renders "
                                                 "DeepSpeed"))
            else:
                r.drop(key, value, "not a GPU training setup dstk plans (DEEPSPEED, MULTI_GPU, FSDP, MEGATRON_LM, NO)")
        elif key == "num_processes":
            r.set("world", _number(r, key, value, kind=int, minimum=1), key)
        elif key == "num_machines":
            r.set("num_nodes", _number(r, key, value, kind=int, minimum=1), key)
        elif key == "mixed_precision":
            mp = str(value).lower()
            block = data.get("deepspeed_config")
            refused = ""
            if dist == "DEEPSPEED" and isinstance(block, dict) and block.get("deepspeed_config_file") not in (
                    None, "", "none"):
                refused = (f"; but {_REFUSED_FIX} and pass --mixed_precision {mp} to accelerate launch, or set it "
                           "in the DeepSpeed file")
            if mp in ("bf16", "fp16"):
                r.set("precision", mp, key, note=refused.removeprefix("; but "))
            elif mp == "no":
                r.set("precision", "fp32", key, note="'no': fp32 training" + refused)
            elif mp == "fp8":
                r.set("precision", "bf16", key, note="fp8 priced as bf16 (dstk has no fp8 path): an upper bound"
                      + refused)
            else:
                r.drop(key, value, "expected no, fp16, bf16 or fp8")
        elif key == "use_cpu":
            if value is True:
                r.set("gpu", "cpu", key, note="CPU ranks on gloo")
            else:
                r.drop(key, value, "false: GPUs")
        elif key == "deepspeed_config" and isinstance(value, dict):
            if dist != "DEEPSPEED":
                r.drop(key, "{...}", f"ignored by accelerate: distributed_type is {dist}")
                continue
            _read_accelerate_deepspeed(r, value)
        elif key == "fsdp_config" and isinstance(value, dict):
            if dist != "FSDP":
                r.drop(key, "{...}", f"ignored by accelerate: distributed_type is {dist}")
                continue
            _read_accelerate_fsdp(r, value)
        elif key == "megatron_lm_config" and isinstance(value, dict):
            if dist != "MEGATRON_LM":
                r.drop(key, "{...}", f"ignored by accelerate: distributed_type is {dist}")
                continue
            for mk, mv in value.items():
                k = f"{key}.{mk}"
                if mk == "megatron_lm_tp_degree":
                    r.set("tp", _number(r, k, mv, kind=int, minimum=1), k)
                elif mk == "megatron_lm_pp_degree":
                    r.set("pp", _number(r, k, mv, kind=int, minimum=1), k)
                elif mk == "megatron_lm_use_distributed_optimizer" and mv is True:
                    r.set("zero_stage", 1, k, note="distributed optimizer = ZeRO-1")
                elif mk == "megatron_lm_recompute_activations" and mv is True:
                    r.set("recompute", "selective", k, note="Megatron's --recompute-activations is selective")
                else:
                    r.drop(k, mv, "the planner decides it (sequence parallelism, micro-batches, gradient clipping)")
        elif key in _ACCELERATE_QUIET:
            r.drop(key, value, "a launch setting: no effect on the plan")
        elif key not in _ACCELERATE_KEYS:
            r.drop(key, value, "not a key of an accelerate config: `accelerate launch` refuses the file (ValueError: "
                               "unknown keys)" + _did_you_mean(key, _ACCELERATE_KEYS) + "; fix or delete it")
        else:
            r.drop(key, value, NO_EFFECT)


_ACCELERATE_KEYS = frozenset({
    "command_file", "commands", "compute_environment", "debug", "deepspeed_config", "distributed_type",
    "downcast_bf16", "dynamo_config", "enable_cpu_affinity", "fp8_config", "fsdp_config", "gpu_ids", "machine_rank",
    "main_process_ip", "main_process_port", "main_training_function", "megatron_lm_config", "mixed_precision",
    "mpirun_config", "num_machines", "num_processes", "parallelism_config", "rdzv_backend", "same_network", "tpu_env",
    "tpu_name", "tpu_use_cluster", "tpu_use_sudo", "tpu_vm", "tpu_zone", "use_cpu", "fp16", "dynamo_backend"})
"""The top-level keys accelerate 1.16 reads (``ClusterConfig``'s fields, ``commands/config/config_args.py``, plus
the old ``fp16`` and ``dynamo_backend`` it converts); ``load_config_from_file`` refuses any other with a ValueError."""

_ACCELERATE_DS_KEYS = frozenset({
    "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
    "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping",
    "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile", "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter", "deepspeed_multinode_launcher", "deepspeed_moe_layer_cls_names"})
"""The ``deepspeed_config`` keys of accelerate 1.16 (``accelerate launch``'s DeepSpeed arguments, which
``_validate_launch_command`` fills from the block); any other key is ignored without a word."""

_ACCELERATE_REFUSED_WITH_FILE = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                                 "offload_optimizer_device", "offload_param_device", "offload_param_nvme_path",
                                 "offload_optimizer_nvme_path", "zero3_save_16bit_model")
"""Inline keys accelerate refuses next to ``deepspeed_config_file`` (``DeepSpeedPlugin._deepspeed_config_checks``,
accelerate 1.16 ``utils/dataclasses.py``: a ValueError when the plugin is built); ``mixed_precision`` from the
YAML too."""

_REFUSED_FIX = ("accelerate refuses it next to deepspeed_config_file (ValueError in "
                "DeepSpeedPlugin._deepspeed_config_checks when the run starts): delete it from the YAML")


def _did_you_mean(key: str, known) -> str:
    import difflib

    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _read_accelerate_deepspeed(r: _Reader, block: dict) -> None:
    config_file = block.get("deepspeed_config_file")
    has_file = bool(config_file) and config_file != "none"
    for dk, dv in block.items():
        k = f"deepspeed_config.{dk}"
        if dk not in _ACCELERATE_DS_KEYS:
            r.drop(k, dv, "not a deepspeed_config key of accelerate, which ignores it without a word"
                          + _did_you_mean(dk, _ACCELERATE_DS_KEYS)
                          + "; DeepSpeed's own keys go in the file deepspeed_config_file names")
            continue
        if has_file and dk in _ACCELERATE_REFUSED_WITH_FILE:
            r.drop(k, dv, f"{_REFUSED_FIX}; the DeepSpeed file decides")
            continue
        if dk == "zero_stage":
            if dv not in (0, 1, 2, 3) or isinstance(dv, bool):
                raise DstkError(f"{k} is {dv!r}", location=r.where(k), hint="write 0, 1, 2 or 3")
            r.set("zero_stage", dv, k)
        elif dk in ("offload_optimizer_device", "offload_param_device"):
            if dv not in ("none", "cpu", "nvme"):
                raise DstkError(f"{k} is {dv!r}", location=r.where(k), hint="write none, cpu or nvme")
            r.set("offload_optimizer" if "optimizer" in dk else "offload_params", dv, k)
        elif dk in ("offload_optimizer_nvme_path", "offload_param_nvme_path"):
            if dv and dv != "none":
                r.set("nvme_path", str(dv), k)
            else:
                r.drop(k, dv, "unset")
        elif dk == "gradient_accumulation_steps":
            r.set("grad_accum", _number(r, k, dv, kind=int, minimum=1), k)
        elif dk == "gradient_clipping":
            r.set("grad_clip", _number(r, k, dv, minimum=0), k)
        elif dk == "deepspeed_config_file":
            if dv and dv != "none":
                _follow_deepspeed(r, k, dv)
            else:
                r.drop(k, dv, "unset")
        elif dk in ("zero3_init_flag", "zero3_save_16bit_model"):
            r.drop(k, dv, "a load/save-time choice: the plan prices the training step")
        else:
            r.drop(k, dv, "a launch setting: no effect on the plan")


def _read_accelerate_fsdp(r: _Reader, block: dict) -> None:
    for fk, fv in block.items():
        k = f"fsdp_config.{fk}"
        if fk == "fsdp_sharding_strategy":
            stage = _FSDP_STAGES.get(str(fv).upper())
            if stage is None:
                r.drop(k, fv, "unknown sharding strategy")
            else:
                r.set("zero_stage", stage, k, note=f"{fv} shards like ZeRO-{stage}")
        elif fk == "fsdp_reshard_after_forward":
            stage = 3 if fv in (True, "FULL_SHARD") else 2 if fv in (False, "SHARD_GRAD_OP") else None
            if stage is None:
                r.drop(k, fv, "unknown value")
            else:
                r.set("zero_stage", stage, k, note=f"FSDP2 reshard_after_forward={fv}: ZeRO-{stage}")
        elif fk == "fsdp_offload_params":
            if fv is True:
                r.set("offload_params", "cpu", k, note="FSDP CPU offload moves parameters and the optimizer step")
                r.set("offload_optimizer", "cpu", k)
            else:
                r.set("offload_params", "none", k)
        elif fk == "fsdp_activation_checkpointing":
            if fv is True:
                r.set("recompute", "full", k)
            else:
                r.drop(k, fv, "off: recomputation left to the planner")
        else:
            r.drop(k, fv, "an FSDP wrapping/state-dict setting: no effect on the plan")


_LF_DATA = {"dataset", "dataset_dir", "template", "max_samples", "overwrite_cache", "preprocessing_num_workers",
            "dataloader_num_workers", "output_dir", "logging_steps", "save_steps", "plot_loss",
            "overwrite_output_dir", "save_only_model", "report_to", "val_size", "eval_dataset", "do_train",
            "do_eval", "resume_from_checkpoint", "trust_remote_code", "ddp_timeout", "save_strategy",
            "save_total_limit", "run_name", "seed", "tokenized_path", "mix_strategy", "streaming", "buffer_size"}


def _read_llamafactory(r: _Reader, data: dict) -> None:
    handled = set()
    for key, value in data.items():
        if key == "cutoff_len":
            r.set("seq_len", _number(r, key, value, kind=int, minimum=1), key)
        elif key == "finetuning_type":
            if value == "full":
                r.lines.append(ImportLine(action="carried", key=key, value=value, where=r.where(key),
                                          reason="full fine-tuning is what dstk plans"))
            elif value == "lora":
                r.lines.append(ImportLine(action="carried", key=key, value=value, where=r.where(key),
                                          target="training.lora_rank", reason="LoRA adapters on a frozen base"))
            else:
                r.drop(key, value, f"{value}: dstk plans full training or LoRA; the plan prices full training "
                                   "(an upper bound)")
        elif key == "stage":
            if value in ("pt", "sft"):
                r.lines.append(ImportLine(action="carried", key=key, value=value, where=r.where(key),
                                          reason="one model trained by next-token loss: what dstk plans"))
            else:
                r.drop(key, value, f"{value}: a reference/reward model is not priced; the plan covers the "
                                   "trained model only")
        elif key == "disable_gradient_checkpointing":
            if value is True:
                r.drop(key, value, "checkpointing off: recomputation left to the planner")
            else:
                r.set("recompute", "full", key, raw=value,
                      note="LLaMA-Factory checkpoints every layer unless this is true")
        elif key == "flash_attn":
            v = str(value).lower()
            if v == "fa2":
                r.set("attention", "flash", key, raw=value)
            elif v in ("sdpa", "auto"):
                r.set("attention", "sdpa", key, note="auto: SDPA where torch has it" if v == "auto" else "")
            elif v == "disabled":
                r.set("attention", "eager", key, raw=value)
            else:
                r.drop(key, value, "expected auto, disabled, sdpa or fa2")
        elif key in _LF_LORA_KEYS:
            continue  # read below, once finetuning_type is known
        elif key in ("freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules"):
            r.drop(key, value, "freeze tuning: dstk prices full training (an upper bound)")
        elif key in _LF_DATA:
            r.drop(key, value, DATA_KEY)
        elif key in ("packing", "neat_packing"):
            r.drop(key, value, "packing fills each sequence to cutoff_len: the plan already prices full sequences")
        else:
            continue
        handled.add(key)
    if "disable_gradient_checkpointing" not in data:
        r.set("recompute", "full", "disable_gradient_checkpointing (absent)", where=r.source, raw=False,
              note="LLaMA-Factory checkpoints every layer unless it is true (ModelArguments default: false)")
    _read_llamafactory_lora(r, data)
    handled |= _LF_LORA_KEYS
    _hf_common(r, data, handled=handled)


_LF_LORA_KEYS = frozenset({"lora_rank", "lora_alpha", "lora_dropout", "lora_target", "quantization_bit",
                           "quantization_method", "use_dora", "pissa_init", "additional_target", "use_rslora",
                           "loraplus_lr_ratio"})


def _read_llamafactory_lora(r: _Reader, data: dict) -> None:
    """LLaMA-Factory's adapter keys (``LoraArguments`` / ``FinetuningArguments`` / ``QuantizationArguments``,
    LLaMA-Factory ``src/llamafactory/hparams``): ``finetuning_type`` defaults to ``lora``, ``lora_rank`` to 8,
    ``lora_alpha`` to 2 x rank (dstk's default too), ``lora_dropout`` to 0, ``lora_target`` to ``all`` (every
    linear module: dstk's ``all-linear``); ``quantization_bit: 4`` with bitsandbytes (the default method) is QLoRA."""
    kind = data.get("finetuning_type", "lora")
    given = [k for k in data if k in _LF_LORA_KEYS]
    if kind != "lora":
        for key in given:
            r.drop(key, data[key], f"finetuning_type is {kind}: LLaMA-Factory trains no LoRA adapters, so it "
                                   "does not use this")
        return
    if "finetuning_type" not in data:
        r.lines.append(ImportLine(action="carried", key="finetuning_type (absent)", value="lora", where=r.source,
                                  target="training.lora_rank", reason="LLaMA-Factory's default (FinetuningArguments): "
                                  "LoRA adapters on a frozen base; write finetuning_type: full for full training"))
    if "lora_rank" in data:
        r.set("lora_rank", _number(r, "lora_rank", data["lora_rank"], kind=int, minimum=1), "lora_rank")
    else:
        r.set("lora_rank", 8, "lora_rank (absent)", where=r.source, note="LLaMA-Factory's default rank (LoraArguments)")
    if data.get("lora_alpha") is not None:
        r.set("lora_alpha", _number(r, "lora_alpha", data["lora_alpha"], minimum=0), "lora_alpha")
    elif "lora_alpha" in data:
        r.drop("lora_alpha", None, "unset: 2 x rank, LLaMA-Factory's default and dstk's")
    if data.get("lora_dropout"):
        r.set("lora_dropout", _number(r, "lora_dropout", data["lora_dropout"], minimum=0), "lora_dropout")
    elif "lora_dropout" in data:
        r.drop("lora_dropout", data["lora_dropout"], "0: no dropout, dstk's default")
    target = data.get("lora_target", "all")
    if target is None or str(target).strip() in ("", "all"):
        if "lora_target" in data:
            r.set("lora_targets", "all-linear", "lora_target", raw=target,
                  note="all: every linear module of the layers (dstk's all-linear)")
    else:
        names = ",".join(t.strip() for t in str(target).split(",") if t.strip())
        r.set("lora_targets", names, "lora_target", raw=target)
    bits = data.get("quantization_bit")
    method = str(data.get("quantization_method") or "bnb").lower()
    if bits in (None, "", "none"):
        if "quantization_bit" in data:
            r.drop("quantization_bit", bits, "unset: 16-bit base weights")
    elif bits == 4 and method in ("bnb", "bitsandbytes"):
        r.set("lora_bits", 4, "quantization_bit", note="4-bit bitsandbytes base weights: QLoRA (NF4)")
    else:
        r.drop("quantization_bit", bits, f"{bits}-bit {method} base weights: dstk prices LoRA on 16-bit base weights "
                                         "(an upper bound); only 4-bit bitsandbytes (QLoRA) is priced")
    if "quantization_method" in data:
        r.drop("quantization_method", data["quantization_method"],
               "read with quantization_bit" if bits == 4 and method in ("bnb", "bitsandbytes") else
               "only 4-bit bitsandbytes is priced")
    for key, reason in (("use_dora", "DoRA adds a magnitude vector and a weight norm per adapted module: priced as "
                                     "plain LoRA (a lower bound)"),
                        ("additional_target", "these modules train in full (weights, gradients, optimizer states): "
                                              "not priced, the plan is a lower bound"),
                        ("pissa_init", "an initialisation: no effect on memory or step time"),
                        ("use_rslora", "a scaling rule: no effect on memory or step time"),
                        ("loraplus_lr_ratio", "a learning-rate ratio: no effect on memory or step time")):
        if key in data:
            if data[key] in (None, False, ""):
                r.drop(key, data[key], "off")
            else:
                r.drop(key, data[key], reason)


_AXOLOTL_DATA = {"datasets", "dataset_prepared_path", "val_set_size", "output_dir", "special_tokens", "tokens",
                 "wandb_project", "wandb_entity", "wandb_watch", "wandb_name", "wandb_log_model", "logging_steps",
                 "evals_per_epoch", "saves_per_epoch", "eval_steps", "save_steps", "train_on_inputs",
                 "group_by_length", "hub_model_id", "resume_from_checkpoint", "local_rank", "strict", "debug",
                 "tokenizer_type", "tokenizer_config", "model_type", "trust_remote_code", "chat_template",
                 "eval_sample_packing", "pad_to_sequence_len", "early_stopping_patience", "seed", "xformers_attention",
                 "dataset_processes", "shuffle_merged_datasets", "test_datasets", "eval_max_new_tokens"}


def _read_axolotl(r: _Reader, data: dict) -> None:
    renamed = {"sequence_len": "max_seq_length", "micro_batch_size": "per_device_train_batch_size",
               "optimizer": "optim", "lr_scheduler": "lr_scheduler_type", "num_epochs": "num_train_epochs"}
    common: dict = {}
    for key, value in data.items():
        if key in ("base_model", "base_model_config"):
            if value:
                r.set("model", str(value), key, override=key == "base_model_config")
            else:
                r.drop(key, value, "unset")
        elif key == "sequence_len":
            r.set("seq_len", _number(r, key, value, kind=int, minimum=1), key)
        elif key == "batch_size":
            r.set("batch_per_rank", _number(r, key, value, kind=int, minimum=1), key,
                  note="axolotl: gradient_accumulation_steps = batch_size / micro_batch_size")
        elif key == "cosine_min_lr_ratio":
            r.set("min_lr_ratio", _number(r, key, value), key)
        elif key == "flash_attention":
            if value is True:
                r.set("attention", "flash", key, raw=value)
            else:
                r.drop(key, value, "off")
        elif key == "sdp_attention":
            if value is True:
                r.set("attention", "sdpa", key)
            else:
                r.drop(key, value, "off")
        elif key in _AXOLOTL_LORA_KEYS:
            continue  # read below, once adapter is known
        elif key == "sample_packing":
            r.drop(key, value, "packing fills each sequence to sequence_len: the plan already prices full sequences")
        elif key in _AXOLOTL_DATA:
            r.drop(key, value, DATA_KEY)
        elif key in renamed:
            common[renamed[key]] = value
            r.key_lines.setdefault(renamed[key], r.key_lines.get(key, 0))
        else:
            common[key] = value
    _read_axolotl_lora(r, data)
    # Report axolotl's own key names, not the TrainingArguments ones they map to.
    start = len(r.lines)
    back = {v: k for k, v in renamed.items()}
    try:
        _hf_common(r, common, handled=set())
    except DstkError as exc:
        for new, old in back.items():
            exc.message = exc.message.replace(new, old)
            exc.hint = exc.hint and exc.hint.replace(new, old)
        raise
    r.lines[start:] = [dataclasses.replace(line, key=back.get(line.key, line.key)) for line in r.lines[start:]]
    for fact in r.facts.values():
        fact.key = back.get(fact.key, fact.key)


_AXOLOTL_LORA_KEYS = frozenset({"adapter", "lora_r", "lora_alpha", "lora_dropout", "lora_target_linear",
                                 "lora_target_modules", "lora_model_dir", "load_in_8bit", "load_in_4bit",
                                 "peft_use_dora", "lora_modules_to_save", "lora_fan_in_fan_out", "peft_use_rslora"})


def _read_axolotl_lora(r: _Reader, data: dict) -> None:
    """axolotl's adapter keys (its config schema, ``utils/schemas/peft.py``; ``loaders/adapter.py`` builds peft's
    ``LoraConfig`` from them): ``adapter: lora`` or ``qlora`` (4-bit bitsandbytes base, ``load_in_4bit``),
    ``lora_r``, ``lora_alpha``, ``lora_dropout``, ``lora_target_linear: true`` (every linear module: dstk's
    ``all-linear``) or ``lora_target_modules`` (names)."""
    adapter = data.get("adapter")
    given = [k for k in data if k in _AXOLOTL_LORA_KEYS and k != "adapter"]
    if not adapter:
        if "adapter" in data:
            r.drop("adapter", adapter, "unset: full fine-tuning")
        for key in given:
            value = data[key]
            if value in (None, False, "", []):
                r.drop(key, value, "unset")
            elif key in ("load_in_8bit", "load_in_4bit"):
                r.drop(key, value, "a quantized base without an adapter: dstk prices full 16-bit training")
            else:
                r.drop(key, value, "no adapter: axolotl trains every parameter, so it does not use this")
        return
    if adapter not in ("lora", "qlora"):
        r.drop("adapter", adapter, f"{adapter}: dstk plans full training or LoRA/QLoRA; the plan prices full "
                                   "training (an upper bound)")
        for key in given:
            r.drop(key, data[key], f"adapter is {adapter}: not planned")
        return
    qlora = adapter == "qlora"
    r.lines.append(ImportLine(action="carried", key="adapter", value=adapter, where=r.where("adapter"),
                              target="training.lora_rank", reason="LoRA adapters on a frozen base"
                              + (" quantized to 4 bits (QLoRA)" if qlora else "")))
    if data.get("lora_r") is not None:
        r.set("lora_rank", _number(r, "lora_r", data["lora_r"], kind=int, minimum=1), "lora_r")
    else:
        r.set("lora_rank", 8, "lora_r (absent)", where=r.source, note="peft's LoraConfig default r = 8")
    if data.get("lora_alpha") is not None:
        r.set("lora_alpha", _number(r, "lora_alpha", data["lora_alpha"], minimum=0), "lora_alpha")
    if data.get("lora_dropout"):
        r.set("lora_dropout", _number(r, "lora_dropout", data["lora_dropout"], minimum=0), "lora_dropout")
    elif "lora_dropout" in data:
        r.drop("lora_dropout", data["lora_dropout"], "0: no dropout, dstk's default")
    modules = data.get("lora_target_modules")
    if isinstance(modules, str):
        modules = [m.strip() for m in modules.split(",") if m.strip()]
    if data.get("lora_target_linear") is True:
        r.set("lora_targets", "all-linear", "lora_target_linear", raw=True,
              note="every linear module of the layers (dstk's all-linear)")
        if modules:
            r.drop("lora_target_modules", modules, "lora_target_linear: true already adapts every linear module")
    elif modules:
        r.set("lora_targets", ",".join(str(m) for m in modules), "lora_target_modules", raw=modules)
    else:
        for key in ("lora_target_linear", "lora_target_modules"):
            if key in data:
                r.drop(key, data[key], "unset")
        r.lines.append(ImportLine(action="assumed", key="training.lora_targets", value="all-linear", where=r.source,
                                  target="training.lora_targets", reason="neither lora_target_linear nor "
                                  "lora_target_modules is set: dstk's default, every linear module (pass "
                                  "--lora-targets q,v for others)"))
    if qlora or data.get("load_in_4bit") is True:
        key = "load_in_4bit" if data.get("load_in_4bit") is True else "adapter"
        r.set("lora_bits", 4, key, raw=data.get(key), note="4-bit bitsandbytes base weights: QLoRA (NF4)")
        if key != "load_in_4bit" and "load_in_4bit" in data:
            r.drop("load_in_4bit", data["load_in_4bit"], "adapter: qlora loads the base in 4 bits")
    elif "load_in_4bit" in data:
        r.drop("load_in_4bit", data["load_in_4bit"], "off: 16-bit base weights")
    if data.get("load_in_8bit") is True:
        r.drop("load_in_8bit", True, "an 8-bit base: dstk prices LoRA on 16-bit base weights (an upper bound); "
                                     "only 4-bit QLoRA is priced")
    elif "load_in_8bit" in data:
        r.drop("load_in_8bit", data["load_in_8bit"], "off")
    for key, reason in (("lora_modules_to_save", "these modules train in full (weights, gradients, optimizer "
                                                 "states): not priced, the plan is a lower bound"),
                        ("peft_use_dora", "DoRA adds a magnitude vector and a weight norm per adapted module: priced "
                                          "as plain LoRA (a lower bound)"),
                        ("lora_model_dir", "adapters loaded from a directory: the same sizes are priced"),
                        ("lora_fan_in_fan_out", "a weight layout flag: no effect on memory or step time"),
                        ("peft_use_rslora", "a scaling rule: no effect on memory or step time")):
        if key in data:
            r.drop(key, data[key], "unset" if data[key] in (None, False, "", []) else reason)


_LAUNCHER = {"--nproc_per_node": "gpus_per_node", "--nproc-per-node": "gpus_per_node", "--num_gpus": "gpus_per_node",
             "--num-gpus": "gpus_per_node", "--nnodes": "num_nodes", "--num_nodes": "num_nodes",
             "--num-nodes": "num_nodes", "--num_processes": "world", "--num-processes": "world",
             "--num_machines": "num_nodes", "--num-machines": "num_nodes"}


def _read_hf_flags(r: _Reader, text: str) -> None:
    words = _tokens(text)
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    launcher = words[:script] if script is not None else []
    args = words[script + 1:] if script is not None else words
    for key, value in _parse_flags(launcher):
        if key in _LAUNCHER:
            r.set(_LAUNCHER[key], _number(r, key, value, kind=int, minimum=1), key)
        elif key in ("--config_file", "--config-file"):
            r.drop(key, value, "import the accelerate config itself: dstk import " + str(value))
        else:
            r.drop(key, value, "a launch setting: no effect on the plan")
    data: dict = {}
    for key, value in _parse_flags(args):
        data[key[2:].replace("-", "_")] = _scalar(value)
    _hf_common(r, data, handled=set())


_MEGATRON_INTS = {"--num-layers": "num_layers", "--hidden-size": "hidden_size", "--num-attention-heads": "num_heads",
                  "--num-query-groups": "num_kv_heads", "--vocab-size": "vocab_size", "--seq-length": "seq_len",
                  "--micro-batch-size": "micro_batch", "--global-batch-size": "global_batch",
                  "--tensor-model-parallel-size": "tp", "--pipeline-model-parallel-size": "pp",
                  "--lr-warmup-iters": "warmup_steps", "--train-iters": "train_steps",
                  "--virtual-pipeline-model-parallel-size": "virtual_stages"}
_MEGATRON_FLOATS = {"--lr": "lr", "--weight-decay": "weight_decay", "--adam-beta1": "adam_beta1",
                    "--adam-beta2": "adam_beta2", "--adam-eps": "eps", "--clip-grad": "grad_clip"}
_MEGATRON_IGNORED = {"--group-query-attention", "--normalization", "--position-embedding-type",
                     "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--max-position-embeddings",
                     "--tokenizer-type", "--make-vocab-size-divisible-by", "--attention-dropout", "--hidden-dropout",
                     "--init-method-std", "--data-path", "--split", "--save", "--load", "--log-interval",
                     "--save-interval", "--eval-interval", "--eval-iters", "--vocab-file", "--merge-file",
                     "--tokenizer-model", "--distributed-backend", "--seed"}


def _read_megatron(r: _Reader, text: str) -> None:
    words = _tokens(text)
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if script is not None:
        for key, value in _parse_flags(words[:script]):
            if key in _LAUNCHER:
                r.set(_LAUNCHER[key], _number(r, key, value, kind=int, minimum=1), key)
            else:
                r.drop(key, value, "a launch setting: no effect on the plan")
        words = words[script + 1:]
    flags = _parse_flags(words)
    given = {k for k, _ in flags}
    swiglu = "--swiglu" in given or "--quick-geglu" in given  # gated MLPs: three matrices of width ffn
    ffn_seen = None
    for key, value in flags:
        if key in _MEGATRON_INTS:
            name = _MEGATRON_INTS[key]
            n = _number(r, key, value, kind=int, minimum=1)
            if name == "num_kv_heads" and "--group-query-attention" not in given:
                r.drop(key, value, "ignored by Megatron without --group-query-attention")
                continue
            r.set(name, n, key)
        elif key in _MEGATRON_FLOATS:
            r.set(_MEGATRON_FLOATS[key], _number(r, key, value), key)
        elif key == "--ffn-hidden-size":
            ffn_seen = _number(r, key, value, kind=int, minimum=1)
            if swiglu:
                r.set("ffn_hidden_size", ffn_seen, key)
            else:
                r.set("ffn_hidden_size", max(1, round(2 * ffn_seen / 3)), key,
                      note=f"a GELU MLP of width {ffn_seen} has the parameters of a SwiGLU MLP of width 2/3 of it "
                           "(dstk's generic decoder is SwiGLU)")
        elif key in ("--swiglu", "--quick-geglu"):
            r.lines.append(ImportLine(action="carried", key=key, value=True, where=r.where(key),
                                      reason="dstk's generic decoder is SwiGLU" + (
                                          ": a GeGLU has the same matrices" if key == "--quick-geglu" else "")))
        elif key in ("--bf16", "--fp16"):
            r.set("precision", key[2:], key, raw=value)
        elif key == "--min-lr":
            r.set("min_lr", _number(r, key, value, minimum=0), key)
        elif key == "--lr-decay-style":
            if value in ("cosine", "linear", "constant"):
                r.set("schedule", value, key)
            else:
                r.drop(key, value, "dstk schedules are cosine, linear and constant")
        elif key == "--lr-warmup-fraction":
            r.set("warmup_ratio", _number(r, key, value), key)
        elif key == "--train-samples":
            r.set("train_samples", _number(r, key, value, kind=int, minimum=1), key)
        elif key == "--use-distributed-optimizer":
            r.set("zero_stage", 1, key, raw=value, note="the distributed optimizer shards optimizer states: ZeRO-1")
        elif key == "--recompute-activations":
            r.set("recompute", "selective", key, raw=value)
        elif key == "--recompute-granularity":
            if value in ("full", "selective"):
                r.set("recompute", value, key)
            else:
                r.drop(key, value, "expected full or selective")
        elif key in ("--use-flash-attn", "--attention-backend"):
            if key == "--attention-backend" and value in ("unfused", "local"):
                r.set("attention", "eager", key, raw=value, note="materialised scores, priced as eager")
            elif key == "--attention-backend" and value == "auto":
                r.drop(key, value, "TransformerEngine picks the kernel at run time: priced as SDPA")
            elif key == "--attention-backend" and value not in ("flash", "fused"):
                r.drop(key, value, "not a value Megatron-LM takes (flash, fused, unfused, local or auto): "
                                   "it would refuse the argument; priced as SDPA")
            else:
                r.set("attention", "flash", key)
        elif key == "--optimizer":
            if value in ("adam", "sgd"):
                r.set("optimizer", "adamw" if value == "adam" else "sgd", key,
                      note="Megatron's adam decouples weight decay: AdamW" if value == "adam" else "")
            else:
                r.drop(key, value, "no dstk optimizer family for it")
        elif key == "--num-layers-per-virtual-pipeline-stage":
            r.set("layers_per_virtual", _number(r, key, value, kind=int, minimum=1), key)
        elif key == "--sequence-parallel":
            r.drop(key, value, "the megatron engine's planner turns sequence parallelism on with tp > 1 itself")
        elif key in _MEGATRON_IGNORED:
            r.drop(key, value, NO_EFFECT if key != "--max-position-embeddings" else
                   "the sequence length is --seq-length")
        else:
            r.drop(key, value, NO_EFFECT)
    if not ({"--bf16", "--fp16"} & given):
        r.set("precision", "fp32", "--bf16/--fp16", note="neither flag: Megatron trains in fp32")
    r.set("engine", "megatron", "(a Megatron-LM argument list)", where=r.source)
    if "--vocab-size" not in given and any(k == "--tokenizer-type" and v == "GPT2BPETokenizer" for k, v in flags):
        r.set("vocab_size", 50257, "--tokenizer-type", note="GPT-2 BPE has 50257 tokens (Megatron pads it)")


# ---------------------------------------------------------------------------------------------- the model


_SUFFIXES = ("-instruct", "-chat", "-hf", "-base", "-it")


def preset_for(name: str) -> str | None:
    """The dstk preset a hub id names (``meta-llama/Llama-2-7b-hf`` -> ``llama-2-7b``), or None.

    The repository name, lower-cased, less the usual suffixes (-hf, -instruct, -chat, -base, -it) and
    the ``meta-`` prefix, must equal a preset slug (``Qwen2.5-7B-Instruct`` -> ``qwen2.5-7b``)."""
    from dstk.models import presets

    catalog = presets()
    base = name.rstrip("/").split("/")[-1].lower()
    candidates = [base]
    stem = base
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if stem.endswith(suffix):
                stem = stem[: -len(suffix)]
                candidates.append(stem)
                changed = True
    candidates += [c.removeprefix("meta-") for c in candidates]
    return next((c for c in candidates if c in catalog), None)


def _hf_cache_config(name: str) -> str | None:
    """``config.json`` of a hub id already in the local HF cache (``$HF_HOME/hub``), if any."""
    home = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface")), "hub")
    snapshots = os.path.join(home, "models--" + name.replace("/", "--"), "snapshots")
    try:
        for snap in sorted(os.listdir(snapshots)):
            path = os.path.join(snapshots, snap, "config.json")
            if os.path.isfile(path):
                return path
    except OSError:
        return None
    return None


def _resolve_model(r: _Reader, fact: _Fact) -> tuple[str, str]:
    """(intent model name, how) for a name read from the file."""
    from dstk.models import presets

    name = fact.value
    if name.strip().lower() in presets():
        return name.strip().lower(), "a dstk preset"
    for candidate in (name, os.path.join(os.path.dirname(os.path.abspath(r.source)), name)):
        if os.path.isdir(candidate) and os.path.isfile(os.path.join(candidate, "config.json")) \
                or os.path.isfile(candidate) and candidate.endswith(".json"):
            return os.path.abspath(candidate) if candidate != name else name, "a local HF config"
    cached = _hf_cache_config(name)
    if cached:
        return os.path.dirname(cached), "the local HF cache"
    preset = preset_for(name)
    if preset:
        return preset, f"dstk preset {preset} (the hub id's name; nothing is downloaded)"
    raise DstkError(f"{fact.key}: model {name!r} is a hub id or a path that does not exist, and dstk reads local "
                    "files only", location=fact.where,
                    hint="download the model's config.json (e.g. `hf download "
                         f"{name} config.json --local-dir models/x`) and pass --model models/x/config.json, "
                         "or pass --model PRESET (`dstk models` lists them)")


# ---------------------------------------------------------------------------------------------- the intent


def _flag_overrides(overrides: dict | None) -> dict[str, dict]:
    out = {s: {} for s in ("model", "cluster", "training", "constraints")}
    for section, values in (overrides or {}).items():
        out[section].update({k: v for k, v in values.items() if v is not None})
    return out


def import_file(path: str | os.PathLike, *, kind: str | None = None, overrides: dict | None = None) -> ImportResult:
    """Read ``path`` (``-``: standard input, named ``<stdin>``; its format told from the content alone)
    and build the intent it implies. ``overrides`` are the command line's intent
    values (``{"model": {"name": ...}, "cluster": {"gpus_per_node": 8, ...}}``); they win, and a
    model given there is not resolved from the file. Raises ``DstkError`` (exit 1) or ``UsageError``
    (exit 2) with the location and a fix; never writes anything."""
    path = os.fspath(path)
    text = _read_text(path)
    if path == STDIN:
        path = STDIN_SOURCE
    data, key_lines = None, {}
    if kind is not None and kind not in KINDS:
        raise UsageError(f"--kind {kind}: unknown format", hint=f"one of {', '.join(KINDS)}")
    if kind in (None, "accelerate", "llamafactory", "axolotl", "hf-args"):
        stripped = text.lstrip()
        if kind is not None or stripped.startswith("{") or not stripped.startswith("-"):
            data, key_lines = _load_mapping(text, source=path, strict_syntax=kind is not None)
        if isinstance(data, str):  # a command line read as a YAML scalar
            data = None
    found = kind or detect_kind(text, data)
    if found is None and path == STDIN_SOURCE:
        raise UsageError(f"{STDIN_SOURCE}: cannot tell the format from the content (standard input has no file name "
                         "to go by)", hint=f"name it: dstk import - --kind KIND (KIND: {', '.join(KINDS)}); for "
                         "plan/generate/estimate/explain/finetune, pipe what it writes on: "
                         "... | dstk import - --kind KIND | dstk plan -")
    if found is None:
        raise UsageError(f"{path}: not a format dstk imports",
                         hint=f"dstk reads {', '.join(KINDS)}; name one with --kind if detection missed it")
    if found in ("accelerate", "llamafactory", "axolotl", "hf-args") and not isinstance(data, dict):
        raise DstkError(f"a {found} file is a mapping of keys, got {type(data).__name__}", location=path,
                        hint="check the file, or pick another --kind")
    if found in ("hf-flags", "megatron"):
        key_lines = _flag_lines(text)
    r = _Reader(source=path, lines=key_lines)
    {"accelerate": lambda: _read_accelerate(r, data), "llamafactory": lambda: _read_llamafactory(r, data),
     "axolotl": lambda: _read_axolotl(r, data), "hf-args": lambda: _hf_common(r, data, handled=set()),
     "hf-flags": lambda: _read_hf_flags(r, text), "megatron": lambda: _read_megatron(r, text)}[found]()
    return _build(r, kind=found, overrides=_flag_overrides(overrides))


def _build(r: _Reader, *, kind: str, overrides: dict[str, dict]) -> ImportResult:
    from dstk.intent import intent_from_dict

    sections: dict[str, dict] = {s: {} for s in ("model", "cluster", "training", "constraints")}
    origins: dict[str, str] = {}
    carried: list[ImportLine] = []
    assumed: list[ImportLine] = []

    def put(section: str, field: str, value: Any, fact_name: str | None = None, *, reason: str = "") -> None:
        target = f"{section}.{field}"
        if field in overrides[section]:
            return
        sections[section][field] = value
        fact = r.facts.get(fact_name) if fact_name else None
        if fact is not None:
            origins[target] = f"{fact.key} ({fact.where})"
            shown = fact.value if fact.raw is None else fact.raw
            carried.append(ImportLine(action="carried", key=fact.key, value=_plain(shown), where=fact.where,
                                      target=target, reason="; ".join(x for x in (fact.note, reason) if x)))
        else:
            origins[target] = f"assumed: {reason}"
            assumed.append(ImportLine(action="assumed", key=target, value=_plain(value), where=r.source,
                                      target=target, reason=reason))

    f = r.facts
    # model
    if "name" in overrides["model"] or (overrides["model"] and "model" in f):
        if "model" in f:
            r.drop(f["model"].key, f["model"].value, "--model given on the command line wins", where=f["model"].where)
    elif "model" in f:
        name, how = _resolve_model(r, f["model"])
        put("model", "name", name, "model", reason=how)
    elif "num_layers" in f or "hidden_size" in f or overrides["model"]:
        # the file's dimensions, completed by the flags' (a Megatron script without --vocab-size: --vocab-size N)
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size"):
            if field in f:
                put("model", field, f[field].value, field)
        missing = [d for d in ("num_layers", "hidden_size", "num_heads", "vocab_size")
                   if d not in f and d not in overrides["model"]]
        if missing:
            raise DstkError(f"the model needs {', '.join(missing)}, which the file does not give", location=r.source,
                            hint="add " + " ".join(f"--{m.replace('_', '-').replace('num-heads', 'num-attention-heads')} N"
                                                   for m in missing) + " to the file, or pass "
                            + " ".join(f"--{m.replace('_', '-')} N" for m in missing) + " to dstk")
    else:
        raise UsageError(f"{r.source}: the file ({kind}) names no model",
                         hint="pass --model NAME|PATH (a preset from `dstk models` or a local HF config.json)")

    # cluster
    flag_nodes = overrides["cluster"].get("num_nodes")
    flag_per_node = overrides["cluster"].get("gpus_per_node")
    world = f["world"].value if "world" in f else None
    nodes = f["num_nodes"].value if "num_nodes" in f else None
    per_node = f["gpus_per_node"].value if "gpus_per_node" in f else None
    if flag_nodes is not None or flag_per_node is not None:
        for name in ("world", "num_nodes", "gpus_per_node"):
            if name in f:
                r.drop(f[name].key, f[name].value, "--gpus / --gpus-per-node / --nodes given on the command line win",
                       where=f[name].where)
    if flag_nodes is None and flag_per_node is None:
        if world is not None:
            nodes = nodes or 1
            if world % nodes:
                fact = f["world"]
                raise DstkError(f"{fact.key} {world} is not a multiple of {f['num_nodes'].key} {nodes}",
                                location=fact.where, hint="give the same number of processes on every machine")
            one = "one machine (num_machines absent)"
            if "num_nodes" not in f and world > 8:
                one += (f": accelerate starts all {world} processes on the machine it runs on unless launched with "
                        f"--num_machines; for nodes of 8 GPUs pass --gpus {world} --gpus-per-node 8")
            put("cluster", "num_nodes", nodes, "num_nodes" if "num_nodes" in f else None,
                reason="" if "num_nodes" in f else one)
            put("cluster", "gpus_per_node", world // nodes, "world", reason="")
            origins["cluster.gpus_per_node"] = f"{f['world'].key} / {nodes} node(s) ({f['world'].where})"
        elif per_node is not None:
            put("cluster", "gpus_per_node", per_node, "gpus_per_node")
            put("cluster", "num_nodes", nodes or 1, "num_nodes" if nodes else None,
                reason="" if nodes else "one node (--nnodes absent)")
        else:
            assumed.append(ImportLine(action="assumed", key="cluster", value="1 x 8", where=r.source,
                                      target="cluster.num_nodes", reason="the file does not say how many GPUs: "
                                      "the intent's default, 1 node x 8 GPUs (pass --gpus N)"))
            origins["cluster.gpus_per_node"] = "assumed: the intent's default (pass --gpus N)"
    if "gpu" in f:
        put("cluster", "gpu", f["gpu"].value, "gpu")
    elif "gpu" not in overrides["cluster"]:
        assumed.append(ImportLine(action="assumed", key="cluster.gpu", value="h100-sxm", where=r.source,
                                  target="cluster.gpu", reason="the file names no GPU type: the intent's default "
                                                               "(pass --gpu TYPE; `dstk gpus` lists them)"))
        origins["cluster.gpu"] = "assumed: the intent's default (pass --gpu TYPE)"

    # constraints
    engine = f["engine"].value if "engine" in f else "deepspeed"
    if "engine" in f:
        put("constraints", "engine", engine, "engine")
    if kind in ("accelerate", "llamafactory", "axolotl", "hf-args", "hf-flags") and engine == "deepspeed":
        for field in ("tp", "pp"):
            if field not in f:
                put("constraints", field, 1, reason="the Trainer/accelerate runs DeepSpeed data-parallel: no "
                                                    f"{'pipeline engine' if field == 'pp' else 'tensor parallelism'}"
                                                    + (" (AutoTP needs tensor_parallel.autotp_size)"
                                                       if field == "tp" else ""))
    for field in ("tp", "pp", "zero_stage", "offload_optimizer", "offload_params", "nvme_path", "micro_batch",
                  "recompute", "offload"):
        if field in f:
            put("constraints", field, f[field].value, field)
    offloads = [sections["constraints"].get(k) for k in ("offload_optimizer", "offload_params")]
    if "offload" not in f and any(o in ("cpu", "nvme") for o in offloads):
        sections["constraints"]["offload"] = True
    if "layers_per_virtual" in f and "num_layers" in f:
        pp = f["pp"].value if "pp" in f else 1
        per_stage = f["num_layers"].value // pp
        lpv = f["layers_per_virtual"].value
        if per_stage % lpv == 0 and per_stage // lpv > 1:
            put("constraints", "virtual_stages", per_stage // lpv, "layers_per_virtual",
                reason=f"{per_stage} layers per stage / {lpv}")
    elif "virtual_stages" in f:
        put("constraints", "virtual_stages", f["virtual_stages"].value, "virtual_stages")

    # training
    for field in ("seq_len", "lr", "weight_decay", "eps", "grad_clip", "schedule", "optimizer", "attention",
                  "train_steps", "min_lr_ratio", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout",
                  "lora_bits"):
        if field in f:
            put("training", field, f[field].value, field)
    if "precision" in f:
        if f["precision"].value is None:
            carried.append(ImportLine(action="carried", key=f["precision"].key, value="auto", where=f["precision"].where,
                                      target="training.precision", reason=f["precision"].note))
        else:
            put("training", "precision", f["precision"].value, "precision")
    if "seq_len" not in f and "seq_len" not in overrides["training"]:
        assumed.append(ImportLine(action="assumed", key="training.seq_len", value=2048, where=r.source,
                                  target="training.seq_len", reason="the file gives no sequence length: the intent's "
                                                                    "default 2048 (pass --seq-len N)"))
        origins["training.seq_len"] = "assumed: the intent's default (pass --seq-len N)"
    if "adam_beta1" in f or "adam_beta2" in f:
        b1 = f["adam_beta1"].value if "adam_beta1" in f else 0.9
        b2 = f["adam_beta2"].value if "adam_beta2" in f else 0.999
        put("training", "betas", [b1, b2], "adam_beta1" if "adam_beta1" in f else "adam_beta2")
        if "adam_beta1" in f and "adam_beta2" in f:
            b = f["adam_beta2"]
            carried.append(ImportLine(action="carried", key=b.key, value=b.value, where=b.where, target="training.betas"))
    if kind in ("llamafactory", "axolotl", "hf-args", "hf-flags"):
        _trainer_defaults(f, sections["training"], put, kind=kind)
    if "min_lr" in f and "lr" in f and "min_lr_ratio" not in f:
        put("training", "min_lr_ratio", f["min_lr"].value / f["lr"].value, "min_lr",
            reason=f"{f['min_lr'].value} / lr {f['lr'].value}")
    # batch: global = micro x accumulation x dp, dp = world / (tp x pp)
    world_now = _world(sections["cluster"], overrides["cluster"])
    tp = overrides["constraints"].get("tp") or sections["constraints"].get("tp") or 1
    pp = overrides["constraints"].get("pp") or sections["constraints"].get("pp") or 1
    micro = f["micro_batch"].value if "micro_batch" in f else None
    accum = f["grad_accum"].value if "grad_accum" in f else None
    if "batch_per_rank" in f and micro and accum is None:
        accum = max(1, f["batch_per_rank"].value // micro)
    dp = world_now // (tp * pp) if world_now % (tp * pp) == 0 else None
    if "global_batch" in f:
        put("training", "global_batch", f["global_batch"].value, "global_batch")
        if micro and accum and dp and micro * accum * dp != f["global_batch"].value:
            fact = f["global_batch"]
            raise DstkError(f"{fact.key} {fact.value} != micro-batch {micro} x accumulation {accum} x dp {dp} = "
                            f"{micro * accum * dp}", location=fact.where,
                            hint="DeepSpeed refuses this triad; make train_batch_size the product (or \"auto\")")
        if accum is not None:
            carried.append(ImportLine(action="carried", key=f["grad_accum"].key, value=accum, where=f["grad_accum"].where,
                                      target="training.global_batch", reason="implied by the global batch"))
    elif micro is not None and dp is not None and "global_batch" not in overrides["training"]:
        accum_key = f["grad_accum"].key if "grad_accum" in f else ("batch_size" if "batch_per_rank" in f else None)
        if accum is None:
            accum = 1
            assumed.append(ImportLine(action="assumed", key="gradient accumulation", value=1, where=r.source,
                                      target="training.global_batch",
                                      reason="not fixed: 1, the Trainer's and accelerate's default"))
        put("training", "global_batch", micro * accum * dp, "micro_batch",
            reason=f"global batch = {micro} per GPU x {accum} accumulation x dp {dp}")
        origins["training.global_batch"] = (f"{f['micro_batch'].key} {micro} x {accum_key or 'accumulation'} {accum} "
                                            f"x dp {dp}")
        if accum_key and "grad_accum" in f:
            carried.append(ImportLine(action="carried", key=f["grad_accum"].key, value=accum,
                                      where=f["grad_accum"].where, target="training.global_batch",
                                      reason=f"{micro} x {accum} x dp {dp}"))
    elif "global_batch" not in overrides["training"]:
        if accum is not None:
            r.drop(f["grad_accum"].key, accum, "without a fixed micro-batch the global batch is unknown; the "
                                               "planner picks micro-batch x accumulation", where=f["grad_accum"].where)
        assumed.append(ImportLine(action="assumed", key="training.global_batch", value=None, where=r.source,
                                  target="training.global_batch", reason="the micro-batch is not fixed: the intent's "
                                  "default, about 1M tokens per step (pass --global-batch N)"))
        origins["training.global_batch"] = "assumed: about 1M tokens per step (pass --global-batch N)"
    if "train_samples" in f:
        gb = sections["training"].get("global_batch") or overrides["training"].get("global_batch")
        if gb:
            put("training", "train_steps", -(-f["train_samples"].value // gb), "train_samples",
                reason=f"{f['train_samples'].value} samples / {gb} per step")
    steps = sections["training"].get("train_steps") or overrides["training"].get("train_steps")
    if "warmup_steps" in f:
        put("training", "warmup_steps", f["warmup_steps"].value, "warmup_steps")
    elif "warmup_ratio" in f:
        if steps:
            put("training", "warmup_steps", max(1, round(f["warmup_ratio"].value * steps)), "warmup_ratio",
                reason=f"{f['warmup_ratio'].value} x {steps} steps")
        else:
            fact = f["warmup_ratio"]
            r.drop(fact.key, fact.value, "a warmup ratio needs the step count, which the file does not fix: the "
                                         "intent's 100 warmup steps are used (pass --train-steps N to convert the "
                                         "ratio, or --warmup-steps N)",
                   where=fact.where)

    # flags win
    for section, values in overrides.items():
        for field, value in values.items():
            target = f"{section}.{field}"
            sections[section][field] = list(value) if isinstance(value, tuple) else value
            origins[target] = "command line"
            carried.append(ImportLine(action="carried", key=_flag_name(section, field), value=_plain(value),
                                      where="command line", target=target, reason="a flag wins over the file"))
    if "name" in sections["model"] and any(k in sections["model"] for k in ("num_layers", "hidden_size")):
        if "name" in overrides["model"]:
            sections["model"] = {"name": sections["model"]["name"]}
        else:
            sections["model"] = {k: v for k, v in sections["model"].items() if k != "name"}
    if sections["constraints"].get("offload") is False and any(
            sections["constraints"].get(k) in ("cpu", "nvme") for k in ("offload_optimizer", "offload_params")):
        sections["constraints"]["offload"] = True
    data = {s: v for s, v in sections.items() if v}
    data.setdefault("model", sections["model"])
    intent = intent_from_dict(data, source=f"the intent imported from {r.source}")
    if "lora_targets" in f and "lora_targets" not in overrides["training"] and intent.training.lora_rank:
        _check_lora_targets(intent, f["lora_targets"])
    lines = tuple(carried) + tuple(line for line in r.lines if line.action == "carried") \
        + tuple(line for line in r.lines if line.action == "dropped") + tuple(assumed)
    return ImportResult(kind=kind, source=r.source, data=data, intent=intent, lines=lines,
                        followed=tuple(r.followed), origins=origins)


_TRAINER_DEFAULTS = (("lr", "learning_rate", 5e-5), ("weight_decay", "weight_decay", 0.0),
                     ("betas", "adam_beta1/adam_beta2", [0.9, 0.999]), ("eps", "adam_epsilon", 1e-8),
                     ("schedule", "lr_scheduler_type", "linear"))
"""``TrainingArguments``' defaults where dstk's intent has others (transformers 5.25 ``training_args.py``:
learning_rate 5e-5, lr_scheduler_type linear, weight_decay 0.0, adam_beta1/2 0.9/0.999, adam_epsilon 1e-8)."""


def _trainer_defaults(f: dict, training: dict, put, *, kind: str) -> None:
    """What a Trainer-based run uses for the optimizer values its file leaves out: the Trainer's defaults, not
    dstk's (lr 3e-4, weight decay 0.1, betas 0.9/0.95, cosine to 10%), so that ``dstk generate`` writes back the
    run the tool would have made. axolotl's own defaults for the learning rate and schedule are not read here:
    dstk's stay, said in the report. transformers' cosine and linear schedules decay to 0
    (``get_cosine_schedule_with_warmup``, ``get_linear_schedule_with_warmup``): min_lr_ratio 0 unless the
    file gives ``min_lr_rate`` (cosine_with_min_lr) or axolotl's ``cosine_min_lr_ratio``."""
    tool = {"llamafactory": "LLaMA-Factory", "axolotl": "axolotl"}.get(kind, "the Trainer")
    for field, key, value in _TRAINER_DEFAULTS:
        if field in training or (field == "betas" and ("adam_beta1" in f or "adam_beta2" in f)) or field in f:
            continue
        if kind == "axolotl" and field in ("lr", "schedule"):
            continue
        put("training", field, value, reason=f"{key} not set: {tool} runs TrainingArguments' default")
    schedule = f.get("schedule")
    if training.get("schedule") == "cosine" and schedule is not None and schedule.key in (
            "lr_scheduler_type", "lr_scheduler") and "min_lr_ratio" not in f and "min_lr_ratio" not in training:
        put("training", "min_lr_ratio", 0.0, reason=f"{schedule.key} cosine decays the learning rate to 0 in "
                                                    "transformers (no min_lr_rate)")


def _check_lora_targets(intent, fact: _Fact) -> None:
    """The file's LoRA target names against the model's family, so a wrong one is reported at its line with the
    family's names (``dstk plan`` would name ``--lora-targets`` instead of the file's key)."""
    from dstk.models import get_model
    from dstk.train.lora import resolve_targets

    m = intent.model
    try:
        family = get_model(m.name).family if m.name else "generic"
        resolve_targets(family=family, targets=intent.training.lora_targets)
    except DstkError as exc:
        if "--lora-targets" not in exc.message:
            return  # the model itself is wrong: plan says so with its own fix
        raise DstkError(exc.message.replace("--lora-targets", f"{fact.key}:"), location=fact.where,
                        hint=(exc.hint or "") + " (LLaMA-Factory: all = every linear module; axolotl: "
                                                "lora_target_linear: true)") from None


def _flag_name(section: str, field: str) -> str:
    """The command-line flag of an intent field (``--model`` for model.name)."""
    from dstk.commands.plan import _FLAGS

    return next((flag for flag, s, f, _ in _FLAGS if (s, f) == (section, field)), f"--{field.replace('_', '-')}")


def _world(cluster: dict, flags: dict) -> int:
    nodes = flags.get("num_nodes") or cluster.get("num_nodes") or 1
    per_node = flags.get("gpus_per_node") or cluster.get("gpus_per_node") or 8
    return nodes * per_node


# ---------------------------------------------------------------------------------------------- output


def render_intent_yaml(result: ImportResult) -> str:
    """The intent as YAML, every value with a comment saying where it came from."""
    import yaml

    head = [f"# Imported by `dstk import` from {result.source} ({result.kind}).",
            *(f"# Followed DeepSpeed config: {p}" for p in result.followed),
            "#",
            "# Each value says where it came from; `dstk import` lists what it dropped and why.",
            "# Constraints are what the file fixed: delete one to let the planner choose it.",
            "# Plan it: dstk plan THIS_FILE   (flags still win, e.g. --gpu a100-80gb)"]
    out = list(head)
    for section in ("model", "cluster", "training", "constraints"):
        values = result.data.get(section)
        if not values:
            continue
        out.append(f"{section}:")
        for field, value in values.items():
            text = yaml.safe_dump({field: value}, default_flow_style=True, width=10**6).strip()
            text = text[1:-1] if text.startswith("{") else text
            origin = result.origins.get(f"{section}.{field}")
            line = f"  {text}"
            out.append(f"{line:<40} # {origin}" if origin else line)
    return "\n".join(out) + "\n"


def report_lines(result: ImportResult) -> list[str]:
    """One human line per report entry: ``carried  cutoff_len = 4096 -> training.seq_len  (file:12)``."""
    out = []
    quiet = [line for line in result.lines if line.action == "dropped" and line.reason in (NO_EFFECT, DATA_KEY)]
    for line in result.lines:
        if line in quiet:
            continue
        value = json.dumps(line.value) if not isinstance(line.value, str) else line.value
        if line.action == "carried":
            text = f"carried  {line.key} = {value}" + (f" -> {line.target}" if line.target else "")
        elif line.action == "dropped":
            text = f"dropped  {line.key} = {value}"
        else:
            text = f"assumed  {line.key}" + ("" if line.value is None else f" = {value}")
        if line.reason:
            text += f": {line.reason}"
        out.append(f"{text}  ({line.where})")
    if quiet:
        out.append(f"dropped  {len(quiet)} more with no effect on the plan: "
                   + ", ".join(line.key for line in quiet))
    return out


# ---------------------------------------------------------------------------------------------- estimate --from


def estimate_args(args):
    """``dstk estimate --from FILE``: the imported setup as estimate's own flags (a new Namespace).

    Flags given on the command line win (they are passed to the import as overrides); the file's
    constraints (ZeRO stage, offload, tp/pp, micro-batch, recompute) become the layout, DeepSpeed's
    and dstk's defaults fill what neither says. ``--gpu h100-sxm`` (estimate's default) counts as not given."""
    import argparse

    if getattr(args, "intent", None):
        raise UsageError("give --intent FILE or --from FILE, not both", hint="drop one of them")
    over: dict[str, dict] = {"model": {}, "cluster": {}, "training": {}, "constraints": {}}
    if args.model:
        over["model"]["name"] = args.model
    for dim in ("num_layers", "hidden_size", "num_heads", "vocab_size", "ffn_hidden_size", "num_kv_heads"):
        if getattr(args, dim, None) is not None:
            over["model"][dim] = getattr(args, dim)
    if args.params is not None:
        raise UsageError("--params and --from: the imported file names the model", hint="drop --params, or use --model")
    if args.gpus is not None:
        per_node = args.gpus_per_node or min(args.gpus, 8)
        if args.gpus % per_node:
            raise UsageError(f"--gpus {args.gpus} is not a multiple of --gpus-per-node {per_node}",
                             hint="give whole nodes, e.g. --gpus 16 --gpus-per-node 8")
        over["cluster"].update(num_nodes=args.gpus // per_node, gpus_per_node=per_node)
    if args.gpu not in (None, "h100-sxm"):
        over["cluster"]["gpu"] = args.gpu
    for flag, section, field in (("seq_len", "training", "seq_len"), ("global_batch", "training", "global_batch"),
                                 ("precision", "training", "precision"), ("optimizer", "training", "optimizer"),
                                 ("zero", "constraints", "zero_stage"), ("tp", "constraints", "tp"),
                                 ("pp", "constraints", "pp"), ("micro_batch", "constraints", "micro_batch"),
                                 ("offload_optimizer", "constraints", "offload_optimizer"),
                                 ("offload_params", "constraints", "offload_params"),
                                 ("recompute", "constraints", "recompute")):
        if getattr(args, flag, None) is not None:
            over[section][field] = getattr(args, flag)
    if over["constraints"].get("offload_optimizer", "none") != "none" or \
            over["constraints"].get("offload_params", "none") != "none":
        over["constraints"]["offload"] = True
    intent = import_file(args.from_file, overrides=over).intent
    m, cl, t, c = intent.model, intent.cluster, intent.training, intent.constraints
    values = dict(vars(args))
    values.update(
        model=m.name, **{d: getattr(m, d) for d in ("num_layers", "hidden_size", "num_heads", "vocab_size",
                                                    "ffn_hidden_size", "num_kv_heads")},
        gpus=cl.world_size, gpus_per_node=cl.gpus_per_node, gpu=cl.gpu,
        interconnect=args.interconnect or cl.interconnect, hardware=args.hardware or cl.hardware,
        seq_len=t.seq_len, global_batch=t.sequences_per_step, precision=t.precision, optimizer=t.optimizer,
        tokens=args.tokens or t.num_tokens, zero=c.zero_stage, tp=c.tp, pp=c.pp, micro_batch=c.micro_batch,
        offload_optimizer=c.offload_optimizer, offload_params=c.offload_params, recompute=c.recompute,
    )
    if args.attention is None and t.attention is not None:
        values["attention"] = t.attention
    values["from_file"] = None
    return argparse.Namespace(**values)
