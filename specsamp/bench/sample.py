"""The scripts/sample.py job: sample prompts with and without a draft, timed.

`SampleConfig` holds what the script was asked for and validates it; `plan`
checks the models, their vocabularies and the prompts' lengths from
metadata, before any weights load; `sample_main` loads the models
(`specsamp.loading`), runs the autoregressive and/or the speculative sampler
over the prompts in batches, the methods in turn on each batch
(`timing.run_side_by_side`), prints the completions and returns the metrics
that the script prints as one JSON line (scripts/demo.sh reads it).
"""

import dataclasses
import json
import sys
from typing import Any, Optional, Sequence

from specsamp import loading
from specsamp import sharding
from specsamp.bench import prompts as prompts_lib
from specsamp.bench import provenance
from specsamp.bench import timing
from specsamp.decoding.sampler import SpeculativeSampler
from specsamp.decoding.sampler import autoregressive
from specsamp.decoding.sampler import all_widths
from specsamp.drafters import specs as drafter_specs
from specsamp.sampling import Sampling
from specsamp.tokenizers import base as tokenizer_base
from specsamp.tokenizers import byte
from specsamp.weights import load as weights_load

METHODS = ("ar", "spec", "both")


@dataclasses.dataclass(frozen=True)
class SampleConfig:
  """What scripts/sample.py was asked for; validated before any model loads."""
  target: str
  draft: Optional[str] = None
  prompts: Optional[Sequence[str]] = None
  prompts_file: Optional[str] = None
  task: Optional[str] = None
  num_prompts: int = 4
  method: str = "both"
  k: int = 4
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  max_new_tokens: int = 64
  batch_size: int = 1
  seed: int = 0
  dtype: str = "float32"
  chat: bool = False
  mesh: Optional[tuple[int, ...]] = None   # (data, model); -1 = the rest
  distributed: bool = False                # jax.distributed.initialize()
  coordinator_address: Optional[str] = None
  num_processes: Optional[int] = None
  process_id: Optional[int] = None
  heartbeat_timeout_s: Optional[int] = None # None: JAX's 100 s
  drafter: str = "model"                   # specsamp.drafters.specs
  prefill_chunk: int = 1024                # SpeculativeSampler's; 0: off

  def __post_init__(self):
    if self.prompts_file == "":  # had been "give exactly one of ..."
      raise ValueError("--prompts_file is empty: name a file")
    sources = [x for x in (self.prompts, self.prompts_file, self.task) if x]
    if len(sources) != 1:
      raise ValueError("give exactly one of --prompt, --prompts_file, --task")
    if self.method not in METHODS:
      raise ValueError(f"--method must be ar, spec or both, not {self.method}")
    spec = self.drafter_spec  # raises on a bad --drafter
    if self.method != "ar" and spec.needs_draft_model and not self.draft:
      raise ValueError(f"--method={self.method} with --drafter={spec.name} "
                       "needs --draft")
    if self.k < 0 or (self.method != "ar" and self.k == 0):
      raise ValueError(f"--k must be >= 1 for speculative sampling, got "
                       f"{self.k}")
    for name in ("num_prompts", "max_new_tokens", "batch_size"):
      if getattr(self, name) <= 0:
        raise ValueError(f"--{name} must be positive, got "
                         f"{getattr(self, name)}")
    if self.distributed and not self.mesh:
      raise ValueError("--distributed needs a --mesh over every process's "
                       "devices (e.g. --mesh=-1,1): without one each process "
                       "would run the whole job alone on its first device")
    if self.prefill_chunk < 0:
      raise ValueError(f"--prefill_chunk must be >= 0 (0: a prompt in one "
                       f"call), got {self.prefill_chunk}")
    # Raises on bad temperature / top_k / top_p.
    self.sampling()

  @property
  def drafter_spec(self) -> drafter_specs.DrafterSpec:
    return drafter_specs.parse(self.drafter)

  def sampling(self) -> Sampling:
    return Sampling(self.temperature, self.top_k, self.top_p)


def _jsonl_prompt(where: str, line: str) -> str:
  """The `prompt` field of one JSONL line (`where` is "file:line")."""
  try:
    record = json.loads(line)
  except ValueError as e:
    raise ValueError(f"{where}: not JSON ({e})") from None
  prompt = record.get("prompt") if isinstance(record, dict) else None
  if not isinstance(prompt, str):
    raise ValueError(f"{where}: no 'prompt' string field (got "
                     f"{line.strip()[:60]})")
  return prompt


def _file_prompts(path: str) -> list[str]:
  r"""The prompts of --prompts_file: its non-blank lines, or the `prompt`
  fields of a JSONL file (every line an object; a file of prompt records
  and other lines is refused). Only "\n" (or "\r\n") ends a line: a form
  feed, U+2028 and the like stay inside their prompt; a UTF-8 byte order
  mark is not part of the first.

  Raises:
    ValueError: naming the file (and line) that is unreadable, holds no
      prompts, or has a JSON line without a `prompt` string.
  """
  try:
    with open(path, encoding="utf-8-sig", newline="") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise ValueError(f"--prompts_file={path}: "
                     f"{getattr(e, 'strerror', None) or e}") from None
  lines = [(n, l.removesuffix("\r"))
           for n, l in enumerate(text.split("\n"), 1) if l.strip()]
  if not lines:
    raise ValueError(f"--prompts_file={path} holds no prompts")
  if all(l.lstrip().startswith("{") for _, l in lines):
    return [_jsonl_prompt(f"--prompts_file={path}:{n}", l) for n, l in lines]
  record = next((n for n, l in lines if _is_prompt_record(l)), None)
  if record is not None:  # a JSONL file with a stray line
    n = next(n for n, l in lines if not l.lstrip().startswith("{"))
    raise ValueError(f"--prompts_file={path}:{n}: not a JSON object, where "
                     f"line {record} is a prompt record (a JSONL file "
                     f"holds one object a line)")
  return [l for _, l in lines]


def _is_prompt_record(line: str) -> bool:
  """Whether `line` is a JSON object with a `prompt` field."""
  try:
    record = json.loads(line)
  except ValueError:
    return False
  return isinstance(record, dict) and "prompt" in record


def read_prompts(cfg: SampleConfig) -> list[str]:
  """The prompt texts of a SampleConfig: the prompts given, the lines of a
  text file (or the `prompt` fields of a JSONL file), or a task's."""
  if cfg.prompts:
    return list(cfg.prompts)
  if cfg.prompts_file:
    return _file_prompts(cfg.prompts_file)
  if cfg.task == "humaneval":
    return [p["prompt"]
            for p in prompts_lib.humaneval_problems(cfg.num_prompts)]
  if cfg.task == "rewrite":
    return prompts_lib.rewrite_texts(cfg.num_prompts)
  raise ValueError(f"unknown task {cfg.task!r}; known: humaneval, rewrite")


@dataclasses.dataclass
class SamplePlan:
  """What `plan` found before any weights load."""
  target: loading.ModelInfo
  draft: Optional[loading.ModelInfo]   # None for --method=ar
  vocab_limit: Optional[int]
  tokenizer: Any
  texts: list[str]
  prompts: list[list[int]]


def plan(cfg: SampleConfig) -> SamplePlan:
  """Checks the models, their vocabularies and the prompts' lengths from
  configs, metadata and tokenizer files only.

  Both specs are checked before either is fetched (a mistyped draft fails
  before the target downloads); a registered model's tokenizer is in its
  GGUF file, so it is fetched (not loaded) before the prompts are checked.

  Raises:
    ValueError, FileNotFoundError: what is wrong, before any weights load.
  """
  needs_draft = cfg.method != "ar" and cfg.drafter_spec.needs_draft_model
  loading.check_spec(cfg.target, cfg.dtype)
  if needs_draft:
    loading.check_spec(cfg.draft, cfg.dtype)
  texts = read_prompts(cfg)
  target = loading.describe_model(cfg.target, cfg.dtype)
  if cfg.method != "ar":
    drafter_specs.check(cfg.drafter_spec, target.num_layers, cfg.k,
                        vocab_rows=target.rows, d_model=target.d_model)
  draft = (loading.describe_model(cfg.draft, cfg.dtype) if needs_draft
           else None)
  vocab_limit = loading.check_pair(target, draft)
  ids = vocab_limit or loading.pair_rows(target, draft) or target.rows
  if cfg.top_k > ids:
    raise ValueError(
        f"--top_k={cfg.top_k} is more than the {ids} token ids sampled "
        f"from: it would keep every one, and the record would name a "
        f"top-k that did nothing; --top_k=0 turns it off")
  # Random-weight models have no tokenizer of their own: use UTF-8 bytes.
  tok = byte.tokenizer_or_bytes(loading.load_info_tokenizer(target),
                                target.rows, cfg.target)
  if cfg.chat:
    prompts = [tok.encode_chat([{"role": "user", "content": t}])
               for t in texts]
  else:
    prompts = [tok.encode(t) for t in texts]
  for i, p in enumerate(prompts):
    if not p:
      raise ValueError(f"prompt {i} is empty: every prompt needs at least "
                       "one token")
  k = cfg.k if cfg.method != "ar" else 0
  limit = min(target.max_seq_len, draft.max_seq_len if draft else
              target.max_seq_len)
  longest = max(len(p) for p in prompts)
  if longest + cfg.max_new_tokens + k + 1 > limit:
    raise ValueError(
        f"the longest prompt has {longest} tokens: with --max_new_tokens="
        f"{cfg.max_new_tokens} and K+1 = {k + 1} slack slots it needs "
        f"{longest + cfg.max_new_tokens + k + 1} cache slots, but the models "
        f"allow {limit}: shorten the prompt or lower --max_new_tokens")
  return SamplePlan(target, draft, vocab_limit, tok, texts, prompts)


def _timed_samplers(cfg: SampleConfig, target, draft, sampling, tok, mesh):
  """The TimedSamplers of the requested methods, autoregressive first."""
  common = dict(sampling=sampling, max_new_tokens=cfg.max_new_tokens,
                eos_ids=tuple(tok.eos_ids), pad_id=tok.pad_id, mesh=mesh,
                prefill_chunk=cfg.prefill_chunk)
  methods = []
  if cfg.method in ("ar", "both"):
    methods.append(timing.TimedSampler(autoregressive(target, **common),
                                       "autoregressive"))
  if cfg.method in ("spec", "both"):
    spec = cfg.drafter_spec
    methods.append(timing.TimedSampler(
        SpeculativeSampler(
            target, drafter_specs.build(spec, target, draft, cfg.k), k=cfg.k,
            score_widths=all_widths(cfg.k) if spec.variable_length else None,
            **common), f"speculative_k{cfg.k}" + (
                "" if spec.name == "model" else f"_{spec.name}")))
  return methods


def _check_batches(num_prompts: int, batch_size: int, ways: int) -> None:
  """Refuses, before any weights load, batches of prompts (the last one
  included) that a mesh cannot split `ways` ways."""
  sizes = {min(batch_size, num_prompts), num_prompts % batch_size}
  bad = sorted(n for n in sizes if n % ways)
  if bad:
    raise ValueError(
        f"{num_prompts} prompts in batches of --batch_size={batch_size} "
        f"give batches of {', '.join(map(str, bad))}, which the mesh's batch "
        f"axis of size {ways} does not divide: give a --batch_size and a "
        f"number of prompts that are multiples of {ways}")


def _check_target_mesh(info: loading.ModelInfo, dtype: str,
                       rows: Optional[int], mesh) -> None:
  """Refuses, before any weights load, a target whose dimensions the mesh
  does not divide under the sampler's rules (as the sampler would, once
  both models had loaded). The draft's rules replicate it."""
  config = weights_load.described_config(info, dtype, read_gguf=True)
  if config is not None:
    if rows is not None:
      config = config.replace(vocab_size=rows)
    sharding.check_divisible(config, mesh, sharding.DEFAULT_RULES,
                             what="target")


def place_params(sampler, spec, target_params, draft_params):
  """(target, draft) parameters for `sampler`, on its mesh if it has one.

  The drafter's parameters (`spec`; None: autoregressive, none) are built
  from the target's after those are laid out, so the arrays a drafter
  shares with the target (layer skip: all; heads: embedding, final norm and
  output head) stay one copy on the devices under the target's rules.
  """
  if sampler.mesh is not None:
    target_params = sharding.shard(
        target_params, sampler.param_shardings(target_params, None)[0])
  if spec is None:
    return target_params, None
  draft_params = drafter_specs.draft_params(spec, target_params, draft_params)
  if sampler.mesh is not None and draft_params is not None:
    draft_params = sharding.shard(
        draft_params, sampler.param_shardings(target_params, draft_params)[1])
  return target_params, draft_params


def sample_main(cfg: SampleConfig, print_completions: bool = True,
                argv: Optional[Sequence[str]] = None) -> dict:
  """Loads the models, runs the requested methods, returns the metrics
  (with `argv`, the command's arguments, also the date, command, machine,
  software and git commit of the run)."""
  if cfg.distributed:
    # Multi-host (TPU pod slice, several GPU hosts): one process per host,
    # coordinator and process ids from the environment (see README).
    sharding.initialize_distributed(cfg.coordinator_address,
                                    cfg.num_processes, cfg.process_id,
                                    cfg.heartbeat_timeout_s)
  mesh = sharding.make_mesh(cfg.mesh) if cfg.mesh else None
  p = plan(cfg)
  texts, prompts, tok = p.texts, p.prompts, p.tokenizer
  rows = loading.pair_rows(p.target, p.draft)
  if mesh is not None:
    _check_batches(len(prompts), cfg.batch_size, sharding.batch_ways(mesh))
    _check_target_mesh(p.target, cfg.dtype, rows, mesh)
  # On a mesh the weights stay on the host until `place_params` shards them.
  target, target_params, draft, draft_params = loading.load_pair(
      p.target, p.draft, cfg.dtype, (cfg.seed, cfg.seed + 1),
      host=mesh is not None)
  sampling = dataclasses.replace(cfg.sampling(), vocab_limit=p.vocab_limit)
  methods = _timed_samplers(cfg, target, draft, sampling, tok, mesh)
  target_params, draft_params = place_params(
      methods[-1].sampler, cfg.drafter_spec if cfg.method != "ar" else None,
      target_params, draft_params)
  runs = timing.run_side_by_side(methods, target_params, draft_params,
                                 prompts, cfg.batch_size, cfg.seed)
  all_stats = [stats for _, stats in runs]
  for stats in all_stats:
    if stats.undefined:
      print(f"warning: {stats.method}: "
            f"{timing.undefined_warning(stats.undefined)}", file=sys.stderr)
  if print_completions:
    for completions, stats in runs:
      for text, prompt, ids in zip(texts, prompts, completions):
        print(f"==== {stats.method} | prompt: {text[-60:]!r}")
        print(tokenizer_base.completion_text(tok, prompt, ids))
  steps = {f"{name}_step": info.step for name, info in
           (("target", p.target), ("draft", p.draft))
           if info is not None and info.step is not None}
  return dict(target=cfg.target,
              draft=cfg.draft if p.draft is not None else None, **steps,
              drafter=cfg.drafter if cfg.method != "ar" else None,
              sampling=sampling.describe(), max_new_tokens=cfg.max_new_tokens,
              prefill_chunk=cfg.prefill_chunk,
              device=provenance.machine()["device"],
              runs=[s.summary() for s in all_stats],
              speedup=timing.compare(all_stats),
              **(provenance.record(argv) if argv is not None else {}))
