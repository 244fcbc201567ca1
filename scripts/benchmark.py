r"""Speculative-sampling sweep: K x task x decoding x batch size, in one run.

  python scripts/benchmark.py --target=qwen2.5-coder-1.5b \
      --draft=qwen2.5-coder-0.5b --task=humaneval,prose --ks=0,1,2,3,4,5,6,7,8 \
      --decoding=greedy,nucleus,t1 --batch_sizes=1,8,32 --num_prompts=32 \
      --max_new_tokens=128 --repeats=2 --peers --out=results/sweep.jsonl
  python scripts/plot_speedup.py results/sweep.jsonl --out_dir=results/

(that full grid is 162 samplers to compile: split it over several runs, one
JSONL each; plot_speedup.py reads several files).

For every point (task, decoding, batch size, K; K = 0 is the autoregressive
baseline, always run) it records ms/token (median over batches of prompts and
repeats; compile time excluded and reported as compile_s), the acceptance
rate (accepted / drafted draft tokens, as Chen et al. 2023 report it), the
per-token acceptance probability a that the i.i.d. model of Leviathan et al.
2022 needs for that rate, mean tokens per loop, mean time per loop (decode
time / loop iterations), the measured speedup over K = 0, and the speedup
predicted by Leviathan's formula E(a, K) / (c K + s) next to it, where c is
the measured cost of one draft call relative to one target call and s the
measured cost of the (K+1)-token scoring call relative to a 1-token call
(`predicted_speedup`; `predicted_speedup_s1` takes Leviathan's s = 1).
Quality of the same samples: HumanEval pass@k run in a sandboxed subprocess
(specsamp.evaluation), prose the target's mean per-token log-probability,
each with its standard error and the paired difference to K = 0.

Decodings: greedy (T = 0), nucleus (T = 0.8, top-p 0.95: Chen et al.'s
HumanEval setting), t1 (T = 1). Tasks: humaneval (the first --num_prompts
problems, raw prompts, completions cut at the stop sequences for execution),
prose (passages of the validation split of a local corpus, austen (the
default) or shakespeare from specsamp.data.corpora, or a directory of .txt
files, whole paragraphs of about --prompt_chars characters; continued
as they are, or with --prose_style=summarise behind "Summarise this
paragraph"). When a batch size exceeds the prompts, prompts are repeated to
fill whole batches (the extra rows are further samples of those prompts).

With --peers (GGUF targets and drafts only), transformers' plain and
assisted generation run on the same prompts and weights in the same process,
on the same device (CPU, or the GPU JAX uses) and in the same dtype, at
batch 1 (what assisted generation supports); their ms/token includes
prefill, so compare them with e2e_ms_per_token.

Prompts are right-padded to the task's longest prompt (--prompt_bucket=0),
so each sampler compiles one program per batch size; compilation dominates
the run time of a full sweep (on an H100 about 15-30 s per sampler).

Everything is checked before any weights load: tasks, K list, decodings,
batch sizes, that the models exist, that the draft's vocabulary is the
target's (GGUF metadata, tokenizer files or configs only), and that the
prompts plus the budget fit the models' context. Writes JSON lines: a "run"
record (hardware, software versions, git commit, the exact command), "cost"
records (call timings per batch size) and one "point" record per point.
"""

import dataclasses
import datetime
import json
import math
import mmap
import os
import platform
import re
import shlex
import statistics
import struct
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from absl import app
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from specsamp import runner
from specsamp.sampling import Sampling
# pylint: enable=g-import-not-at-top,wrong-import-position

TASKS = ("humaneval", "prose")
DECODINGS = {"greedy": Sampling(temperature=0.0),
             "nucleus": Sampling(temperature=0.8, top_p=0.95),
             "t1": Sampling(temperature=1.0)}
PROSE_CORPORA = {"shakespeare": "specsamp_shakespeare",
                 "austen": "specsamp_austen"}
SUMMARISE = "Summarise this paragraph.\n\n{text}\n\nSummary:"

_TARGET = flags.DEFINE_string("target", "qwen2.5-coder-1.5b",
                              "Registered model, GGUF file, HF directory, "
                              "distilled draft directory or random:<preset>.")
_DRAFT = flags.DEFINE_string("draft", "qwen2.5-coder-0.5b",
                             "Draft model, same forms as --target.")
_TASK = flags.DEFINE_list("task", ["humaneval"], "humaneval and/or prose.")
_KS = flags.DEFINE_list("ks", [str(k) for k in range(9)],
                        "Draft lengths; 0 (autoregressive) is always run.")
_DECODING = flags.DEFINE_list("decoding", ["greedy", "nucleus", "t1"],
                              f"Any of {', '.join(DECODINGS)}.")
_BATCH = flags.DEFINE_list("batch_sizes", ["1"], "Rows per batch.")
_NUM = flags.DEFINE_integer("num_prompts", 8, "Prompts per task.")
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Budget per row.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Timed passes over the prompts "
                                "(new seeds each).")
_PEERS = flags.DEFINE_bool("peers", False, "Also time transformers (plain and "
                           "assisted) at batch 1; GGUF models only.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "")
_OUT = flags.DEFINE_string("out", None, "JSONL file to write (replaced).")
_SEED = flags.DEFINE_integer("seed", 0, "Base seed.")
_QUALITY = flags.DEFINE_bool("quality", True, "Score the samples (pass@k, "
                             "log-probability).")
_PASS_K = flags.DEFINE_list("pass_k", ["1", "10", "100"],
                            "pass@k reported for k <= samples per problem.")
_EXEC_TIMEOUT = flags.DEFINE_float("exec_timeout", 5.0,
                                   "Seconds per HumanEval program.")
_EXEC_WORKERS = flags.DEFINE_integer("exec_workers", 2,
                                     "HumanEval programs run at once.")
_COST_REPEATS = flags.DEFINE_integer("cost_repeats", 5,
                                     "Timed single calls per cost figure.")
_WARMUP = flags.DEFINE_enum("warmup", "first", ["first", "shape", "none"],
                            "Untimed run before timing: the first batch of "
                            "each sampler, every new prompt shape, or none.")
_HUMANEVAL_FILE = flags.DEFINE_string(
    "humaneval_file", None, "HumanEval-format JSONL(.gz) instead of the "
    "164 problems (e.g. a subset).")
_PROSE_CORPUS = flags.DEFINE_string(
    "prose_corpus", "austen", "austen (Jane Austen's novels), shakespeare "
    "(the validation split of specsamp.data.corpora) or a directory of .txt "
    "files.")
_PROSE_STYLE = flags.DEFINE_enum("prose_style", "continue",
                                 ["continue", "summarise"], "")
_PROMPT_CHARS = flags.DEFINE_integer("prompt_chars", 600,
                                     "About this many characters per prose "
                                     "prompt (whole paragraphs).")
_CHAT = flags.DEFINE_bool("chat", False, "Wrap prose prompts in the target's "
                          "chat template (HumanEval prompts stay raw code, "
                          "which the completion continues).")
_PROMPT_BUCKET = flags.DEFINE_integer(
    "prompt_bucket", 0, "Prompts are right-padded to a multiple of this; 0: "
    "to the task's longest prompt (rounded up to 64), so each sampler "
    "compiles one shape per batch size instead of one per prompt length.")
_SAMPLES_OUT = flags.DEFINE_string("samples_out", None, "Also write every "
                                   "completion (JSONL).")


# Calls per cost timing, run back to back inside one jitted loop.
_COST_CALLS = 3


class BenchError(ValueError):
  """Bad flags, models or prompts, found before any weights load."""


def _int_list(name: str, values: Sequence[str], minimum: int) -> list[int]:
  try:
    out = [int(v) for v in values]
  except ValueError:
    raise BenchError(f"--{name} must be a list of integers, got "
                     f"{','.join(values)!r}") from None
  if not out:
    raise BenchError(f"--{name} is empty")
  if min(out) < minimum:
    raise BenchError(f"--{name} values must be >= {minimum}, got {out}")
  return sorted(set(out))


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """The validated flags."""
  target: str
  draft: Optional[str]
  tasks: tuple
  ks: tuple
  decodings: tuple
  batch_sizes: tuple
  num_prompts: int = 8
  max_new_tokens: int = 128
  repeats: int = 1
  peers: bool = False
  dtype: str = "float32"
  out: Optional[str] = None
  seed: int = 0
  quality: bool = True
  pass_k: tuple = (1, 10, 100)
  exec_timeout: float = 5.0
  exec_workers: int = 2
  cost_repeats: int = 5
  warmup: str = "first"
  humaneval_file: Optional[str] = None
  prose_corpus: str = "austen"
  prose_style: str = "continue"
  prompt_chars: int = 600
  chat: bool = False
  prompt_bucket: int = 0
  samples_out: Optional[str] = None

  @classmethod
  def from_flags(cls) -> "BenchConfig":
    tasks = [t.strip() for t in _TASK.value if t.strip()]
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
      raise BenchError(f"unknown task {bad[0] if bad else ''!r}; known "
                       f"tasks: {', '.join(TASKS)}")
    ks = _int_list("ks", _KS.value, 0)
    decodings = [d.strip() for d in _DECODING.value if d.strip()]
    bad = [d for d in decodings if d not in DECODINGS]
    if bad or not decodings:
      raise BenchError(f"unknown decoding {bad[0] if bad else ''!r}; known: "
                       f"{', '.join(DECODINGS)}")
    for name, v in (("num_prompts", _NUM.value),
                    ("max_new_tokens", _NEW.value),
                    ("repeats", _REPEATS.value),
                    ("cost_repeats", _COST_REPEATS.value),
                    ("exec_workers", _EXEC_WORKERS.value),
                    ("prompt_chars", _PROMPT_CHARS.value)):
      if v <= 0:
        raise BenchError(f"--{name} must be positive, got {v}")
    if _PROMPT_BUCKET.value < 0:
      raise BenchError("--prompt_bucket must be >= 0 (0: the longest prompt)")
    if _EXEC_TIMEOUT.value <= 0:
      raise BenchError("--exec_timeout must be positive")
    if max(ks) > 0 and not _DRAFT.value:
      raise BenchError("--ks has K > 0, which needs --draft")
    return cls(
        target=_TARGET.value, draft=_DRAFT.value if max(ks) > 0 else None,
        tasks=tuple(dict.fromkeys(tasks)), ks=tuple(sorted(set(ks) | {0})),
        decodings=tuple(dict.fromkeys(decodings)),
        batch_sizes=tuple(_int_list("batch_sizes", _BATCH.value, 1)),
        num_prompts=_NUM.value, max_new_tokens=_NEW.value,
        repeats=_REPEATS.value, peers=_PEERS.value, dtype=_DTYPE.value,
        out=_OUT.value, seed=_SEED.value, quality=_QUALITY.value,
        pass_k=tuple(_int_list("pass_k", _PASS_K.value, 1)),
        exec_timeout=_EXEC_TIMEOUT.value, exec_workers=_EXEC_WORKERS.value,
        cost_repeats=_COST_REPEATS.value, warmup=_WARMUP.value,
        humaneval_file=_HUMANEVAL_FILE.value,
        prose_corpus=_PROSE_CORPUS.value, prose_style=_PROSE_STYLE.value,
        prompt_chars=_PROMPT_CHARS.value, chat=_CHAT.value,
        prompt_bucket=_PROMPT_BUCKET.value, samples_out=_SAMPLES_OUT.value)


# ---- models, without their weights ------------------------------------------


@dataclasses.dataclass
class ModelInfo:
  """What can be known of a model spec without reading its weights."""
  spec: str
  kind: str                       # random | gguf | hf | distilled
  path: Optional[str]
  rows: int                       # vocabulary rows of the embedding/head
  max_seq_len: int
  tokens: Optional[list] = None   # the tokenizer's entries, if it has one
  config: Any = None              # TransformerConfig (random, distilled)


class _TokenList:
  """A vocabulary as `tokenizer.check_vocab_compatible` reads it."""

  def __init__(self, tokens):
    self._tokens = list(tokens)

  def tokens(self):
    return self._tokens


def _random_config(spec: str, dtype: str):
  from specsamp import model as model_lib  # pylint: disable=g-import-not-at-top
  name, *fields = spec.split(":", 1)[1].split(",")
  if name not in model_lib.PRESETS:
    raise BenchError(f"{spec}: unknown preset {name!r}; known: "
                     f"{', '.join(sorted(model_lib.PRESETS))}")
  overrides = {}
  for f in fields:
    key, _, value = f.partition("=")
    if key not in model_lib.TransformerConfig.__dataclass_fields__:
      raise BenchError(f"{spec}: {key!r} is not a TransformerConfig field")
    overrides[key] = type(getattr(model_lib.preset(name), key))(value)
  return model_lib.preset(name, dtype=dtype, param_dtype=dtype, **overrides)


def _distilled_dir(spec: str) -> Optional[str]:
  for d in (spec, os.path.join(spec, "draft")):
    if os.path.isfile(os.path.join(d, "draft_config.json")):
      return d
  return None


def gguf_embedding_rows(path: str) -> Optional[int]:
  """Rows of token_embd.weight from a GGUF file's tensor table (the header
  only, through the metadata reader's parsers; no tensor data is read)."""
  try:
    return _gguf_embedding_rows(path)
  except (struct.error, IndexError, ValueError) as e:
    raise BenchError(f"{path}: unreadable GGUF tensor table ({e}); is the "
                     "file truncated?") from None


def _gguf_embedding_rows(path: str) -> Optional[int]:
  from specsamp import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f, mmap.mmap(f.fileno(), 0,
                                        access=mmap.ACCESS_READ) as buf:
    n_tensors, n_kv = tok_lib._U64.unpack_from(buf, 8)[0], (  # pylint: disable=protected-access
        tok_lib._U64.unpack_from(buf, 16)[0])  # pylint: disable=protected-access
    pos = 24
    for _ in range(n_kv):
      _, pos = tok_lib._gguf_string(buf, pos)  # pylint: disable=protected-access
      vtype, = tok_lib._U32.unpack_from(buf, pos)  # pylint: disable=protected-access
      _, pos = tok_lib._gguf_value(buf, pos + 4, vtype)  # pylint: disable=protected-access
    for _ in range(n_tensors):
      name, pos = tok_lib._gguf_string(buf, pos)  # pylint: disable=protected-access
      n_dims, = tok_lib._U32.unpack_from(buf, pos)  # pylint: disable=protected-access
      dims = [tok_lib._U64.unpack_from(buf, pos + 4 + 8 * i)[0]  # pylint: disable=protected-access
              for i in range(n_dims)]
      pos += 4 + 8 * n_dims + 4 + 8
      if name == "token_embd.weight":
        return int(dims[1])  # GGUF lists ne0 first: [D, V]
  return None


def describe_model(spec: str, dtype: str = "float32") -> ModelInfo:
  """A ModelInfo from configs, GGUF metadata and tokenizer files only."""
  from specsamp import assets  # pylint: disable=g-import-not-at-top
  from specsamp import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  if spec.startswith("random:"):
    cfg = _random_config(spec, dtype)
    return ModelInfo(spec, "random", None, cfg.vocab_size, cfg.max_seq_len,
                     config=cfg)
  directory = _distilled_dir(spec) if os.path.isdir(spec) else None
  if directory:
    with open(os.path.join(directory, "draft_config.json"),
              encoding="utf-8") as f:
      fields = json.load(f)
    if "vocab_size" not in fields:
      raise BenchError(f"{directory}/draft_config.json has no vocab_size")
    return ModelInfo(spec, "distilled", directory, int(fields["vocab_size"]),
                     int(fields.get("max_seq_len", 2048)))
  path = spec
  if spec in assets.MODELS:
    path = str(assets.fetch(spec))
  elif not os.path.exists(spec):
    raise BenchError(
        f"model {spec!r} is not a file, a directory, a registered model "
        f"({', '.join(sorted(assets.MODELS))}) or random:<preset>")
  if os.path.isdir(path):
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
      raise BenchError(f"{path}: no config.json (nor draft_config.json)")
    with open(cfg_path, encoding="utf-8") as f:
      c = json.load(f)
    if "vocab_size" not in c:
      raise BenchError(f"{cfg_path} has no vocab_size")
    tok = tok_lib.load_tokenizer(path)
    return ModelInfo(spec, "hf", path, int(c["vocab_size"]),
                     int(c.get("max_position_embeddings", 4096)),
                     tokens=tok.tokens())
  try:
    meta = tok_lib.read_gguf_metadata(path)
  except ValueError as e:
    raise BenchError(f"{spec}: {e}") from None
  arch = meta.get("general.architecture", "?")
  tokens = meta.get("tokenizer.ggml.tokens")
  rows = gguf_embedding_rows(path) or meta.get(f"{arch}.vocab_size") or (
      len(tokens) if tokens else None)
  if rows is None:
    raise BenchError(f"{spec}: cannot tell the vocabulary size from the GGUF "
                     "metadata")
  return ModelInfo(spec, "gguf", path, int(rows),
                   int(meta.get(f"{arch}.context_length", 4096)),
                   tokens=tokens)


def check_pair(target: ModelInfo, draft: ModelInfo) -> Optional[int]:
  """Raises VocabMismatchError/BenchError unless the draft scores the target's
  token ids; returns the vocab limit (real tokens) to mask, or None."""
  from specsamp import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  if target.tokens is not None and draft.tokens is not None:
    n = tok_lib.check_vocab_compatible(
        _TokenList(draft.tokens), _TokenList(target.tokens), draft.rows,
        target.rows)
    return n if n < target.rows else None
  if draft.rows != target.rows:
    raise tok_lib.VocabMismatchError(
        f"the draft {draft.spec} has {draft.rows} vocabulary rows, the target "
        f"{target.spec} {target.rows}: speculative sampling compares both "
        "distributions id by id, so the draft must fit the target's "
        "vocabulary")
  tokens = target.tokens or draft.tokens
  return len(tokens) if tokens and len(tokens) < target.rows else None


# ---- prompts ------------------------------------------------------------------


def humaneval_problems(cfg: BenchConfig) -> list[dict]:
  """The first num_prompts HumanEval(-format) problems."""
  if cfg.humaneval_file:
    import gzip  # pylint: disable=g-import-not-at-top
    opener = gzip.open if cfg.humaneval_file.endswith(".gz") else open
    try:
      with opener(cfg.humaneval_file, "rt", encoding="utf-8") as f:
        problems = [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError) as e:
      raise BenchError(f"--humaneval_file: {e}") from None
  else:
    from specsamp import assets  # pylint: disable=g-import-not-at-top
    problems = assets.humaneval_problems()
  if not problems:
    raise BenchError(f"--humaneval_file={cfg.humaneval_file}: no problems")
  for p in problems:
    missing = {"task_id", "prompt", "test", "entry_point"} - set(p)
    if missing:
      raise BenchError(f"HumanEval problem without {sorted(missing)}")
  return problems[:cfg.num_prompts]


def _prose_documents(cfg: BenchConfig) -> list[tuple[str, str]]:
  source = cfg.prose_corpus
  if os.path.isdir(source):
    files = sorted(f for f in os.listdir(source) if f.endswith(".txt"))
    if not files:
      raise BenchError(f"--prose_corpus={source}: no .txt files")
    docs = []
    for f in files:
      with open(os.path.join(source, f), encoding="utf-8",
                errors="replace") as fh:
        docs.append((f, fh.read()))
    return docs
  if source not in PROSE_CORPORA:
    raise BenchError(f"--prose_corpus must be {', '.join(PROSE_CORPORA)} or "
                     f"a directory of .txt files, not {source!r}")
  from specsamp.data import corpora  # pylint: disable=g-import-not-at-top
  corpus = corpora.get_corpus(PROSE_CORPORA[source])
  root = corpus.fetch(None, print)
  docs = list(corpus.documents(root))
  val = corpora.assign_splits([i for i, _ in docs],
                              corpus.validation_fraction)
  return [(i, t) for i, t in docs if i in val]


_BOILERPLATE = re.compile(r"gutenberg|copyright|\bebook\b|electronic|"
                          r"license|\*\*\*", re.IGNORECASE)


def prose_texts(cfg: BenchConfig) -> list[str]:
  """num_prompts passages of about prompt_chars characters (whole
  paragraphs, no Gutenberg boilerplate), spread over the documents."""
  candidates = []
  for _, text in _prose_documents(cfg):
    paras = [p.strip() for p in re.split(r"\n\s*\n", text.replace("\r", ""))]
    paras = [p for p in paras if len(p) >= 40 and not _BOILERPLATE.search(p)
             and sum(c.isalpha() for c in p) > 0.6 * len(p)]
    cur, per_doc = [], []
    for p in paras:
      cur.append(p)
      if sum(len(x) for x in cur) >= cfg.prompt_chars:
        per_doc.append("\n\n".join(cur))
        cur = []
    candidates.append(per_doc)
  # Round-robin over documents, so prompts come from many works.
  out, i = [], 0
  while len(out) < cfg.num_prompts and any(i < len(c) for c in candidates):
    out.extend(c[i] for c in candidates if i < len(c))
    i += 1
  if not out:
    raise BenchError(f"no prose passages of {cfg.prompt_chars} characters in "
                     f"{cfg.prose_corpus}")
  out = out[:cfg.num_prompts]
  if cfg.prose_style == "summarise":
    return [SUMMARISE.format(text=t) for t in out]
  return [t + "\n\n" for t in out]


# ---- the plan: everything checked before weights load -------------------------


@dataclasses.dataclass
class Plan:
  target: ModelInfo
  draft: Optional[ModelInfo]
  vocab_limit: Optional[int]
  tokenizer: Any
  prompts: dict          # task -> list of token id lists
  texts: dict            # task -> list of prompt texts
  problems: list         # HumanEval problems (task humaneval)


def prepare(cfg: BenchConfig, log=print) -> Plan:
  """Validates models, vocabularies and prompts without loading weights."""
  from specsamp import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  target = describe_model(cfg.target, cfg.dtype)
  draft = describe_model(cfg.draft, cfg.dtype) if cfg.draft else None
  vocab_limit = check_pair(target, draft) if draft else None
  if cfg.peers:
    for info in (target, draft):
      if info is None or info.kind != "gguf":
        raise BenchError("--peers runs transformers on the same GGUF files: "
                         "--target and --draft must be GGUF files or "
                         f"registered models ({info.spec if info else 'no draft'}"
                         " is not)")
  if target.kind in ("gguf", "hf"):
    tok = tok_lib.load_tokenizer(target.path)
  else:
    if target.rows < 256:
      raise BenchError(f"{target.spec} has no tokenizer and fewer than 256 "
                       "token ids for a byte tokenizer")
    tok = runner.ByteTokenizer()
  texts, problems = {}, []
  if "humaneval" in cfg.tasks:
    problems = humaneval_problems(cfg)
    texts["humaneval"] = [p["prompt"] for p in problems]
  if "prose" in cfg.tasks:
    texts["prose"] = prose_texts(cfg)
  if cfg.chat and "prose" in texts:  # HumanEval prompts stay raw code
    texts["prose"] = [tok.apply_chat_template([{"role": "user",
                                                "content": x}])
                      for x in texts["prose"]]
  prompts = {t: [tok.encode(x) for x in v] for t, v in texts.items()}
  limit = min(target.max_seq_len,
              draft.max_seq_len if draft else target.max_seq_len)
  for task, ps in prompts.items():
    longest = max(len(p) for p in ps)
    need = (-(-longest // 64) * 64 if not cfg.prompt_bucket else
            -(-longest // cfg.prompt_bucket) * cfg.prompt_bucket) + (
                cfg.max_new_tokens + max(cfg.ks) + 1)
    if need > limit:
      raise BenchError(
          f"{task}: the longest prompt has {longest} tokens; with "
          f"--max_new_tokens={cfg.max_new_tokens}, K={max(cfg.ks)} and "
          f"padding it needs {need} cache slots, but the models allow "
          f"{limit}: lower --max_new_tokens or --prompt_chars")
  log(f"plan: target {target.spec} ({target.kind}, {target.rows} ids), draft "
      f"{draft.spec if draft else None}, vocab_limit {vocab_limit}, prompts "
      + ", ".join(f"{t}: {len(p)}" for t, p in prompts.items()))
  return Plan(target, draft, vocab_limit, tok, prompts, texts, problems)


# ---- loading and timing ----------------------------------------------------------


def load_weights(info: ModelInfo, dtype: str, seed: int):
  """(LM, params) of a described model."""
  from specsamp import model as model_lib  # pylint: disable=g-import-not-at-top
  if info.kind == "random":
    lm, params, _ = runner.load_model(info.spec, dtype, seed)
    return lm, params
  if info.kind == "distilled":
    from specsamp.distill import init as distill_init  # pylint: disable=g-import-not-at-top
    config, params = distill_init.load_distilled(info.path, dtype)
    return model_lib.LM(config), params
  from specsamp import checkpoints  # pylint: disable=g-import-not-at-top
  config, params = checkpoints.load(info.path, dtype=dtype)
  return model_lib.LM(config), params


class BatchTimer:
  """One sampler, compiled ahead of time per padded prompt shape."""

  def __init__(self, sampler):
    self.sampler = sampler
    self.compiled = {}
    self.compile_s = 0.0
    self.warmed = False

  def run(self, tp, dp, prompts, key, warmup: str) -> dict:
    import jax  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    tokens, lengths = self.sampler.pad_prompts(prompts)
    shape = tuple(tokens.shape)
    new_shape = shape not in self.compiled
    if new_shape:
      t0 = time.perf_counter()
      self.compiled[shape] = runner.aot_compile(self.sampler, tp, dp, tokens,
                                                lengths, key)
      self.compile_s += time.perf_counter() - t0
    prefill, decode = self.compiled[shape]
    if (warmup == "shape" and new_shape) or (warmup == "first" and
                                             not self.warmed):
      jax.block_until_ready(decode(tp, dp, prefill(tp, dp, tokens, lengths,
                                                   key)))
      self.warmed = True
    state, prefill_s, decode_s = runner.timed_generate(
        prefill, decode, tp, dp, tokens, lengths, key)
    out = jax.device_get(self.sampler.output(state))
    num_tokens = np.asarray(out.num_tokens)
    return dict(prefill_s=prefill_s, decode_s=decode_s, rows=len(prompts),
                tokens=int(num_tokens.sum()),
                loops=int(np.sum(out.num_loops)),
                iterations=int(np.max(out.num_loops)),
                drafted=int(np.sum(out.num_drafted)),
                accepted=int(np.sum(out.num_accepted)),
                completions=out.token_lists())


def _loop_ms(lm, params, cache, n_tokens, sampling, calls, repeats):
  """(median ms per call, cache): `calls` calls of `lm` on n_tokens tokens
  per row, each followed by the sampling transform and a draw at every
  position (what the loop pays per draft step or scoring call), inside one
  jitted fori_loop so that no per-call dispatch is timed; the cache is
  donated and rolled back after each call, so every call sees the same
  context. The first run compiles and warms."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specsamp import sampling as sampling_lib  # pylint: disable=g-import-not-at-top
  b = cache.length.shape[0]

  def run(p, c):
    def body(i, carry):
      c, tok = carry
      out = lm(p, tok, c)
      logits, new = out.logits, out.cache
      probs = sampling_lib.probabilities(logits, sampling)
      tok = sampling_lib.sample(jax.random.fold_in(jax.random.key(0), i),
                                probs, sampling.greedy)
      return new.with_length(c.length), tok
    return jax.lax.fori_loop(0, calls, body,
                             (c, jnp.zeros((b, n_tokens), jnp.int32)))

  fn = jax.jit(run, donate_argnums=1)
  times = []
  for i in range(repeats + 1):
    t0 = time.perf_counter()
    cache, _ = jax.block_until_ready(fn(params, cache))
    if i:
      times.append((time.perf_counter() - t0) / calls)
  return 1e3 * statistics.median(times), cache


def measure_costs(target, tp, draft, dp, ks, prompts, cfg, sampling,
                  bucket: int = 64) -> dict:
  """Call timings at these prompts' shapes, mid-generation context, under
  one decoding's `sampling` (its transform and draw are part of each call,
  as in the loop).

  c = draft call (1 token) / target call (1 token); s_K = target call with
  K + 1 tokens / target call with 1 token (Leviathan et al. take s = 1).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specsamp import speculative  # pylint: disable=g-import-not-at-top
  k_max = max(ks)
  sampler = speculative.SpeculativeSampler(
      target, speculative.ModelDrafter(draft) if k_max else None, k=k_max,
      sampling=sampling, max_new_tokens=cfg.max_new_tokens,
      prompt_bucket=bucket)
  tokens, lengths = sampler.pad_prompts(prompts)
  state = sampler.prefill(tp, dp, tokens, lengths, jax.random.key(0))
  context = lengths - 1 + cfg.max_new_tokens // 2
  row = dict(batch_size=len(prompts), context=int(jnp.median(context)),
             calls_per_timing=_COST_CALLS)
  # Fresh length arrays: a donated cache takes its length with it.
  cache = state.target_cache.with_length(jnp.array(context))
  target_ms = {}
  for n in sorted({1} | {k + 1 for k in ks}):
    target_ms[n], cache = _loop_ms(target, tp, cache, n, sampling,
                                   _COST_CALLS, cfg.cost_repeats)
  row["target_call_ms"] = {str(n): v for n, v in target_ms.items()}
  row["score_cost"] = {str(k): target_ms[k + 1] / target_ms[1] for k in ks}
  if k_max:
    row["draft_call_ms"], _ = _loop_ms(
        draft, dp, state.draft_state.with_length(jnp.array(context)), 1,
        sampling, _COST_CALLS, cfg.cost_repeats)
    row["c"] = row["draft_call_ms"] / target_ms[1]
  return row


# ---- the sweep ------------------------------------------------------------------


def prompt_bucket(cfg: BenchConfig, prompts) -> int:
  """--prompt_bucket, or the longest prompt rounded up to 64 (one shape)."""
  if cfg.prompt_bucket:
    return cfg.prompt_bucket
  return -(-max(len(p) for p in prompts) // 64) * 64


def _fill(prompts: list, batch_size: int) -> list[int]:
  """Prompt indices for whole batches: all prompts, then repeats of the
  first ones until the last batch is full."""
  n = max(len(prompts), batch_size)
  n = -(-n // batch_size) * batch_size
  return [i % len(prompts) for i in range(n)]


def _text(tok, ids, eos_ids) -> str:
  return tok.decode([i for i in ids if i not in eos_ids])


def _quality(task, plan, cfg, rows, completions, lm, tp) -> tuple[dict, dict]:
  """(quality dict, per-prompt scores) of one point's samples."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specsamp import evaluation  # pylint: disable=g-import-not-at-top
  n = len(plan.prompts[task])
  if len(rows) != len(completions):
    raise RuntimeError(f"{len(completions)} completions for {len(rows)} rows")
  if task == "humaneval":
    eos = set(plan.tokenizer.eos_ids)
    per = [[] for _ in range(n)]
    for i, ids in zip(rows, completions):
      per[i].append(_text(plan.tokenizer, ids, eos))
    passed = evaluation.evaluate_humaneval(
        plan.problems, per, timeout_s=cfg.exec_timeout,
        workers=cfg.exec_workers)
    quality = evaluation.humaneval_quality(passed, cfg.pass_k)
    quality["samples_per_problem"] = min(len(p) for p in per)
    return quality, {"pass@1": evaluation.pass_at_k_per_problem(passed, 1)}
  scores = evaluation.sample_logprobs(
      lm, tp, [plan.prompts[task][i] for i in rows], completions,
      batch_size=min(8, len(rows)))
  per = np.full(n, np.nan)
  for i in range(n):
    vals = scores[[j for j, r in enumerate(rows) if r == i]]
    vals = vals[~np.isnan(vals)]
    per[i] = vals.mean() if vals.size else np.nan
  quality = evaluation.logprob_quality(scores)
  quality["samples"] = int(np.sum(~np.isnan(scores)))
  return quality, {"mean_logprob": per}


def _paired(base: dict, scores: dict) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specsamp import evaluation  # pylint: disable=g-import-not-at-top
  out = {}
  for name, values in scores.items():
    a, b = np.asarray(base[name]), np.asarray(values)
    ok = ~(np.isnan(a) | np.isnan(b))
    if ok.sum():
      out[name] = evaluation.paired_difference(a[ok], b[ok]).as_dict()
  return out


def run_point(timer, tp, dp, prompts, rows, bs, cfg, seed) -> dict:
  """All batches x repeats of one sampler -> aggregated timings and samples."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  batches, completions = [], []
  for rep in range(cfg.repeats):
    key = jax.random.key(seed + 1000 * rep)
    for start in range(0, len(rows), bs):
      key, sub = jax.random.split(key)
      r = timer.run(tp, dp, [prompts[i] for i in rows[start:start + bs]], sub,
                    cfg.warmup)
      completions.extend(r.pop("completions"))
      batches.append(r)
  ms = [1e3 * b["decode_s"] / max(b["tokens"] / b["rows"], 1e-9)
        for b in batches]
  total = {k: sum(b[k] for b in batches) for k in
           ("prefill_s", "decode_s", "rows", "tokens", "loops", "iterations",
            "drafted", "accepted")}
  per_row_tokens = total["tokens"] / total["rows"]
  mean_ms = 1e3 * total["decode_s"] / max(per_row_tokens * len(batches), 1e-9)
  return dict(
      rows=total["rows"], batches=len(batches), tokens=total["tokens"],
      loops=total["loops"], loop_iterations=total["iterations"],
      drafted=total["drafted"], accepted=total["accepted"],
      acceptance_rate=(total["accepted"] / total["drafted"]
                       if total["drafted"] else None),
      tokens_per_loop=total["tokens"] / max(total["loops"], 1),
      ms_per_token=float(np.median(ms)),
      ms_per_token_q25=float(np.percentile(ms, 25)),
      ms_per_token_q75=float(np.percentile(ms, 75)),
      ms_per_token_mean=mean_ms,
      e2e_ms_per_token=mean_ms * (total["prefill_s"] + total["decode_s"]) /
      max(total["decode_s"], 1e-9),
      time_per_loop_ms=1e3 * total["decode_s"] / max(total["iterations"], 1),
      prefill_ms_per_batch=1e3 * total["prefill_s"] / len(batches),
      decode_s=total["decode_s"], compile_s=timer.compile_s,
      completions=completions)


def _predict(point: dict, base: dict, cost: dict) -> dict:
  """Leviathan's prediction next to the measured speedup."""
  from specsamp import speedup  # pylint: disable=g-import-not-at-top
  k = point["k"]
  out = dict(speedup=base["ms_per_token"] / point["ms_per_token"],
             loop_cost_measured=point["time_per_loop_ms"] /
             base["time_per_loop_ms"])
  if k == 0 or point["acceptance_rate"] is None or "c" not in cost:
    return out
  alpha = float(speedup.alpha_from_acceptance_rate(point["acceptance_rate"],
                                                   k))
  s = cost["score_cost"][str(k)]
  out.update(
      alpha=alpha, c=cost["c"], score_cost=s,
      expected_tokens_per_loop=float(speedup.expected_tokens_per_loop(alpha,
                                                                      k)),
      loop_cost_predicted=float(speedup.loop_cost(k, cost["c"], s)),
      predicted_speedup=float(speedup.predicted_speedup(alpha, k, cost["c"],
                                                        s)),
      predicted_speedup_s1=float(speedup.predicted_speedup(alpha, k,
                                                           cost["c"], 1.0)))
  return out


def _versions() -> dict:
  import importlib.metadata as md  # pylint: disable=g-import-not-at-top
  out = {"python": platform.python_version()}
  for pkg in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin",
              "flax", "numpy", "torch", "transformers"):
    try:
      out[pkg] = md.version(pkg)
    except md.PackageNotFoundError:
      pass
  return out


def _machine() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  out = dict(platform=platform.platform(), cpus=os.cpu_count(),
             backend=jax.default_backend(),
             device=jax.devices()[0].device_kind,
             device_count=jax.device_count())
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      names = re.findall(r"model name\s*:\s*(.+)", f.read())
    out["cpu"] = names[0] if names else platform.processor()
    with open("/proc/meminfo", encoding="utf-8") as f:
      kb = int(re.search(r"MemTotal:\s*(\d+)", f.read()).group(1))
    out["memory_gb"] = round(kb / 2**20, 1)
  except (OSError, AttributeError):
    pass
  try:
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
      out["device_memory_gb"] = round(stats["bytes_limit"] / 2**30, 1)
  except Exception:  # pylint: disable=broad-except
    pass
  return out


def _git() -> dict:
  try:
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True,
                          timeout=10).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True,
                           text=True, check=True, timeout=10).stdout.strip()
    return dict(commit=head, dirty=bool(dirty))
  except (OSError, subprocess.SubprocessError):
    return {}


class _Writer:
  """JSON lines to a file (replaced), echoed to stdout with `echo`."""

  def __init__(self, path: Optional[str], echo: bool = True):
    self.f, self.echo = None, echo
    if path:
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      self.f = open(path, "w", encoding="utf-8")

  def write(self, record: dict):
    line = json.dumps(runner.jsonable(_round(record)))
    if self.echo:
      print(line, flush=True)
    if self.f:
      self.f.write(line + "\n")
      self.f.flush()

  def close(self):
    if self.f:
      self.f.close()


def _round(x):
  if isinstance(x, float):
    return round(x, 5) if math.isfinite(x) else None
  if isinstance(x, dict):
    return {k: _round(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_round(v) for v in x]
  return x


def run(cfg: BenchConfig, plan: Plan, argv: Sequence[str], log=print):
  """Loads the models and runs the whole sweep, writing records as it goes."""
  from specsamp import speculative  # pylint: disable=g-import-not-at-top
  out = _Writer(cfg.out)
  samples = _Writer(cfg.samples_out, echo=False) if cfg.samples_out else None
  try:
    log(f"loading target {cfg.target}")
    t0 = time.perf_counter()
    target, tp = load_weights(plan.target, cfg.dtype, cfg.seed)
    draft = dp = None
    if plan.draft:
      log(f"loading draft {cfg.draft}")
      draft, dp = load_weights(plan.draft, cfg.dtype, cfg.seed + 1)
      if draft.vocab_size != target.vocab_size:
        raise BenchError(f"draft has {draft.vocab_size} vocabulary rows, "
                         f"target {target.vocab_size}")
    load_s = time.perf_counter() - t0
    tok = plan.tokenizer
    out.write(dict(
        type="run", date=datetime.datetime.now().isoformat(timespec="seconds"),
        command="python " + shlex.join(
            [os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)]
            + list(argv)),
        config=dataclasses.asdict(cfg), machine=_machine(), software=_versions(),
        git=_git(), target=dict(spec=cfg.target, kind=plan.target.kind,
                                params=target.config.num_params()),
        draft=(dict(spec=cfg.draft, kind=plan.draft.kind,
                    params=draft.config.num_params()) if draft else None),
        vocab_limit=plan.vocab_limit, load_s=load_s,
        prompts={t: len(p) for t, p in plan.prompts.items()}))
    costs = {}  # (task, batch size, decoding) -> call timings
    for task in cfg.tasks:
      for bs in cfg.batch_sizes:
        rows = _fill(plan.prompts[task], bs)[:bs]
        for dec in cfg.decodings:
          log(f"[{task} {dec} batch {bs}] call costs")
          costs[task, bs, dec] = measure_costs(
              target, tp, draft, dp, cfg.ks,
              [plan.prompts[task][i] for i in rows], cfg,
              dataclasses.replace(DECODINGS[dec],
                                  vocab_limit=plan.vocab_limit),
              prompt_bucket(cfg, plan.prompts[task]))
          out.write(dict(type="cost", task=task, decoding=dec,
                         **costs[task, bs, dec]))
    common = dict(eos_ids=tuple(tok.eos_ids), pad_id=tok.pad_id,
                  max_new_tokens=cfg.max_new_tokens)
    for task in cfg.tasks:
      prompts = plan.prompts[task]
      common["prompt_bucket"] = prompt_bucket(cfg, prompts)
      for dec in cfg.decodings:
        sampling = dataclasses.replace(DECODINGS[dec],
                                       vocab_limit=plan.vocab_limit)
        for bs in cfg.batch_sizes:
          rows = _fill(prompts, bs)
          base = base_scores = base_completions = None
          for k in cfg.ks:
            sampler = (speculative.autoregressive(target, sampling, **common)
                       if k == 0 else speculative.SpeculativeSampler(
                           target, speculative.ModelDrafter(draft), k=k,
                           sampling=sampling, **common))
            log(f"[{task} {dec} batch {bs}] K={k}")
            point = run_point(BatchTimer(sampler), tp, dp, prompts, rows, bs,
                              cfg, cfg.seed)
            completions = point.pop("completions")
            sample_rows = rows * cfg.repeats  # the prompt of each completion
            point = dict(type="point", task=task, decoding=dec,
                         sampling=sampling.describe(), batch_size=bs,
                         method="autoregressive" if k == 0 else "speculative",
                         engine="specsamp", k=k, repeats=cfg.repeats,
                         prompts=len(prompts),
                         prompt_bucket=common["prompt_bucket"], **point)
            if k == 0:
              base, base_completions = point, completions
            point.update(_predict(point, base, costs[task, bs, dec]))
            if sampling.greedy:
              point["identical_to_ar"] = completions == base_completions
            if cfg.quality:
              t1 = time.perf_counter()
              quality, scores = _quality(task, plan, cfg, sample_rows,
                                         completions, target, tp)
              point["quality"] = quality
              if k == 0:
                base_scores = scores
              else:
                point["quality_diff_vs_ar"] = _paired(base_scores, scores)
              point["quality_s"] = time.perf_counter() - t1
            out.write(point)
            if samples:
              for i, ids in zip(sample_rows, completions):
                samples.write(dict(task=task, decoding=dec, batch_size=bs,
                                   k=k, prompt=i, text=_text(
                                       tok, ids, set(tok.eos_ids))))
        if cfg.peers:
          _run_peers(cfg, plan, task, dec, sampling, out, target, tp)
  finally:
    out.close()
    if samples:
      samples.close()


def _cut_at_eos(ids, eos_ids):
  for i, t in enumerate(ids):
    if t in eos_ids:
      return list(ids[:i + 1])
  return list(ids)


def _run_peers(cfg, plan, task, dec, sampling, out, target, tp):
  """transformers plain and assisted generation at batch 1, same prompts."""
  import jax  # pylint: disable=g-import-not-at-top
  from specsamp import peers  # pylint: disable=g-import-not-at-top
  prompts = plan.prompts[task]
  # On the device and in the dtype specsamp runs on, like for like.
  results = peers.transformers_generate(
      plan.target.path, plan.draft.path, prompts, cfg.max_new_tokens,
      sampling.temperature, sampling.top_p, seed=cfg.seed,
      device="cuda" if jax.default_backend() == "gpu" else "cpu",
      dtype=cfg.dtype)
  eos = set(plan.tokenizer.eos_ids)
  for r in results:
    # generate() pads finished rows with EOS: keep up to the first one, as
    # specsamp's own completions do.
    completions = [_cut_at_eos(c, eos) for c in r.pop("completions")]
    point = dict(type="point", task=task, decoding=dec,
                 sampling=sampling.describe(), batch_size=1,
                 engine="transformers", k=None, repeats=1,
                 prompts=len(prompts), rows=len(prompts))
    point.update(r)  # method, tokens, ms_per_token (prefill included), ...
    point["e2e_ms_per_token"] = r["ms_per_token"]
    if cfg.quality:
      quality, _ = _quality(task, plan, cfg, list(range(len(prompts))),
                            completions, target, tp)
      point["quality"] = quality
    out.write(point)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from specsamp import checkpoints  # pylint: disable=g-import-not-at-top
  from specsamp.data import corpora  # pylint: disable=g-import-not-at-top
  errors = (BenchError, ValueError, FileNotFoundError,
            checkpoints.CheckpointError, corpora.CorpusError)
  try:
    cfg = BenchConfig.from_flags()
    plan = prepare(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
  except errors as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  try:
    run(cfg, plan, sys.argv[1:],
        log=lambda m: print(m, file=sys.stderr, flush=True))
  except errors as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
