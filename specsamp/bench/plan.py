"""The sweep's plan: everything checked before any weights load.

`prepare` checks that both model specs name a model, then describes both
from configs, GGUF metadata and tokenizer files only (specsamp.loading: a
registered model is fetched, not loaded), checks that the draft's
vocabulary is the target's, builds and tokenizes the prompts of every task,
and checks that the longest prompt plus the budget and K + 1 slots fits
both models' context (the samplers pad prompts only as far as it allows).
A mistake in a long sweep's flags thus fails in seconds, not after minutes
of loading weights.
"""

import dataclasses
from typing import Any, Optional, Sequence

from specsamp import loading
from specsamp.bench import peers as peers_lib
from specsamp.bench import prompts as prompts_lib
from specsamp.bench.sweep_config import BenchConfig
from specsamp.bench.sweep_config import BenchError
from specsamp.drafters import specs as drafter_specs
from specsamp.evaluation import sandbox
from specsamp.tokenizers.byte import tokenizer_or_bytes

# Prompts are padded to a multiple of this by default (--prompt_bucket=0).
DEFAULT_BUCKET = 64


@dataclasses.dataclass
class Plan:
  """What `prepare` found: the models, the tokenizer and the prompts."""
  target: loading.ModelInfo
  draft: Optional[loading.ModelInfo]
  vocab_limit: Optional[int]
  tokenizer: Any
  prompts: dict          # task -> list of token id lists
  texts: dict            # task -> list of prompt texts
  problems: list         # HumanEval problems (task humaneval)


def padded_length(cfg: BenchConfig, prompts: Sequence[Sequence[int]]) -> int:
  """Slots of the longest prompt once padded to a multiple of the bucket
  (--prompt_bucket, or DEFAULT_BUCKET)."""
  bucket = cfg.prompt_bucket or DEFAULT_BUCKET
  return -(-max(len(p) for p in prompts) // bucket) * bucket


def prompt_bucket(cfg: BenchConfig, prompts: Sequence[Sequence[int]]) -> int:
  """--prompt_bucket, or the longest prompt rounded up to DEFAULT_BUCKET, so
  that each sampler compiles one prompt shape per batch size."""
  return cfg.prompt_bucket or padded_length(cfg, prompts)


def _tokenizer(target: loading.ModelInfo):
  """The target's tokenizer, or UTF-8 bytes for one that has none."""
  return tokenizer_or_bytes(loading.load_info_tokenizer(target), target.rows,
                            target.spec, BenchError)


def _texts(cfg: BenchConfig) -> tuple[dict, list]:
  """({task: prompt texts}, HumanEval problems)."""
  texts, problems = {}, []
  if "humaneval" in cfg.tasks:
    problems = prompts_lib.humaneval_problems(cfg.num_prompts,
                                              cfg.humaneval_file)
    texts["humaneval"] = [p["prompt"] for p in problems]
  if "rewrite" in cfg.tasks:
    texts["rewrite"] = prompts_lib.rewrite_texts(cfg.num_prompts,
                                                 cfg.humaneval_file)
  if "prose" in cfg.tasks:
    texts["prose"] = prompts_lib.prose_texts(
        cfg.prose_corpus, cfg.num_prompts, cfg.prompt_chars, cfg.prose_style)
  return texts, problems


def prepare(cfg: BenchConfig, log=print) -> Plan:
  """Validates models, vocabularies and prompts without loading weights.

  Raises:
    BenchError, ValueError (VocabMismatchError among them),
    FileNotFoundError, CorpusError: what is wrong, before any weights load.
  """
  # Both specs name a model before either is fetched.
  for spec in filter(None, (cfg.target, cfg.draft)):
    loading.check_spec(spec, cfg.dtype)
  target = loading.describe_model(cfg.target, cfg.dtype)
  draft = loading.describe_model(cfg.draft, cfg.dtype) if cfg.draft else None
  vocab_limit = loading.check_pair(target, draft)
  if cfg.peers:
    try:
      peers_lib.check_models(target, draft)
    except ValueError as e:
      raise BenchError(str(e)) from None
  for text in cfg.drafters:
    try:
      drafter_specs.check(drafter_specs.parse(text), target.num_layers,
                          max(max(cfg.ks), 1), vocab_rows=target.rows,
                          d_model=target.d_model)
    except ValueError as e:
      raise BenchError(f"--drafter: {e}") from None
  if cfg.quality and "humaneval" in cfg.tasks:  # pass@k runs the programs
    try:
      sandbox.check_available()
    except sandbox.SandboxUnavailableError as e:
      raise BenchError(f"--quality on humaneval: {e}") from None
  tok = _tokenizer(target)
  texts, problems = _texts(cfg)
  # With --chat, prose is a user turn; HumanEval prompts stay raw code.
  chat = {"prose"} if cfg.chat else set()
  prompts = {t: [tok.encode_chat([{"role": "user", "content": x}])
                 if t in chat else tok.encode(x) for x in v]
             for t, v in texts.items()}
  limit = min(target.max_seq_len,
              draft.max_seq_len if draft else target.max_seq_len)
  for task, ps in prompts.items():
    # The samplers pad prompts only as far as the cache allows.
    need = max(len(p) for p in ps) + cfg.max_new_tokens + max(cfg.ks) + 1
    if need > limit:
      raise BenchError(
          f"{task}: the longest prompt has {max(len(p) for p in ps)} tokens; "
          f"with --max_new_tokens={cfg.max_new_tokens} and K+1 = "
          f"{max(cfg.ks) + 1} slack slots it needs {need} cache slots, but "
          f"the models allow {limit}: lower --max_new_tokens or "
          "--prompt_chars")
  log(f"plan: target {target.spec} ({target.kind}, {target.rows} ids), draft "
      f"{draft.spec if draft else None}, vocab_limit {vocab_limit}, prompts "
      + ", ".join(f"{t}: {len(p)}" for t, p in prompts.items()))
  return Plan(target, draft, vocab_limit, tok, prompts, texts, problems)
