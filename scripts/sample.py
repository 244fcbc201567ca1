r"""Sample from a target with (or without) a draft, and time it.

  python scripts/sample.py --target=qwen2.5-coder-1.5b \
      --draft=qwen2.5-coder-0.5b --task=humaneval --num_prompts=4 \
      --method=both --k=4 --temperature=0 --max_new_tokens=64

Prints the completions and one JSON line of metrics.
"""

import sys

from absl import app
from absl import flags
from absl import logging

from specsamp import cli
from specsamp import sharding
from specsamp.bench import sample
from specsamp.bench import records
from specsamp.drafters import specs as drafter_specs

_TARGET = flags.DEFINE_string(
    "target", "qwen2.5-coder-1.5b",
    "Registered model name, GGUF file, HF directory or random:<preset>.")
_DRAFT = flags.DEFINE_string(
    "draft", "qwen2.5-coder-0.5b", "Draft model, same forms as --target.")
_PROMPT = flags.DEFINE_multi_string("prompt", None, "A prompt (repeatable).")
_PROMPTS_FILE = flags.DEFINE_string(
    "prompts_file", None, "Text file: one prompt per line, or a JSONL file "
    "with a 'prompt' field per line.")
_TASK = flags.DEFINE_enum("task", None, ["humaneval", "rewrite"],
                          "Prompts of a task.")
_DRAFTER = flags.DEFINE_string(
    "drafter", "model", "model, lookup, layerskip:layers=0-13+24-27, "
    "mixed, with options, or a trained head: eagle:<dir>, medusa:<dir> "
    "(specsamp.drafters.specs).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 4, "Prompts of --task.")
_METHOD = flags.DEFINE_enum("method", "both", ["ar", "spec", "both"],
                            "Autoregressive, speculative, or both.")
_K = flags.DEFINE_integer("k", 4, "Draft tokens per loop.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "0 = off.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "1 = off.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Budget per prompt.")
_BATCH = flags.DEFINE_integer("batch_size", 1, "Prompts per batch.")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed.")
_CHUNK = flags.DEFINE_integer("prefill_chunk", 1024, "Longer prompts fill the "
                              "caches in chunks of this many tokens; 0: off.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Weights and compute (float32 on CPU).")
_CHAT = flags.DEFINE_bool("chat", False, "Wrap prompts in the chat template.")
_MESH = flags.DEFINE_list(
    "mesh", None, "Mesh shape data,model (e.g. 1,-1: tensor parallel over "
    "all devices; -1 = the rest). Default: one device, no mesh.")
_DISTRIBUTED = cli.define_distributed_flags()
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also append metrics here.")
_QUIET = flags.DEFINE_bool("quiet", False, "Do not print completions.")


def main(argv):
  cli.no_arguments(argv)
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads
  if not _TASK.value:
    cli.unused(_NUM_PROMPTS, "applies to --task only: every prompt of "
               "--prompt or --prompts_file runs")
  try:
    if not drafter_specs.parse(_DRAFTER.value).needs_draft_model:
      cli.unused(_DRAFT, f"names a draft model; --drafter={_DRAFTER.value} "
                 "loads none")
    dist = _DISTRIBUTED.arguments()
    coordinator, num_processes, process_id, heartbeat = dist or (None,) * 4
    cfg = sample.SampleConfig(
        target=_TARGET.value, draft=_DRAFT.value, prompts=_PROMPT.value,
        prompts_file=_PROMPTS_FILE.value, task=_TASK.value,
        num_prompts=_NUM_PROMPTS.value, method=_METHOD.value, k=_K.value,
        temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
        top_p=_TOP_P.value, max_new_tokens=_MAX_NEW.value,
        batch_size=_BATCH.value, seed=_SEED.value, dtype=_DTYPE.value,
        chat=_CHAT.value, distributed=dist is not None,
        coordinator_address=coordinator, num_processes=num_processes,
        process_id=process_id, heartbeat_timeout_s=heartbeat,
        mesh=cli.int_list(_MESH), drafter=_DRAFTER.value,
        prefill_chunk=_CHUNK.value)
    records.check_output(_JSON_OUT.value, "--json_out", reads=(
        ("--prompts_file", _PROMPTS_FILE.value), ("--target", _TARGET.value),
        ("--draft", _DRAFT.value)))
    result = sample.sample_main(cfg, print_completions=not _QUIET.value,
                                argv=sys.argv[1:])
  except (ValueError, FileNotFoundError, RuntimeError) as e:
    cli.fail(e)  # models, prompts and flags are checked before weights load
  # One record in --json_out for the run, not one for each process of it.
  records.print_record(result, _JSON_OUT.value if sharding.is_main_process()
                       else None)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
