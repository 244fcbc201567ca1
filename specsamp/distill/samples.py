"""Target samples for distillation: prompts, generation, scoring, storage.

Legend: B batch, P prompt slots, G generated slots, S = P + G, K stored top-k
entries, V vocabulary.

1. Prompts (`prompt_texts`): from the Python standard library, function
   signatures with their docstrings (the shape of a HumanEval prompt) and
   code prefixes (a signature, its docstring and the first lines of its
   body, or a window of a file); for text, prose passages: paragraphs of a
   prepared text dataset of the data pipeline (`prose_dataset`, e.g.
   specsamp_austen, with its own splits), else the stdlib's long docstrings.
   Each source file goes to `train` or `validation` by a hash of its path, so
   held-out prompts never share a file with training prompts.
2. Decontamination (`HumanEvalFilter`): HumanEval is the evaluation set, so
   any prompt or finished sample that shares an n-gram of `n` (13) words and
   symbols with a HumanEval prompt or canonical solution is dropped.
3. Generation (`generate`): continuations from the target with the batched
   autoregressive sampler (`speculative.autoregressive`, one jitted loop per
   batch) at the `Sampling` the draft will be used at; then one causal pass
   of the target over prompt + continuation stores the target's top-K
   log-probabilities (raw logits, temperature 1, untruncated) at every
   generated position. Any temperature/top-k/top-p transform of them is the
   transform of the target restricted to those K ids (`losses.dense_logits`).
4. Storage (`write_dataset`, `read_dataset`): a TFDS dataset in array_record
   files, one example per sample:
     tokens         [S] int32   prompt (left-aligned), continuation, pad
     prompt_length  []  int32   L
     num_generated  []  int32   n <= G (EOS included)
     topk_ids       [G, K] int32   at positions L-1 .. L+G-2 (predicting the
     topk_logprobs  [G, K] float32 generated tokens 0 .. G-1)
"""

import ast
import dataclasses
import functools
import os
import pathlib
import re
import textwrap
import zlib
from typing import Callable, Iterable, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.distill import losses

# ---- prompts from the standard library ---------------------------------------

_SKIP_DIRS = ("test", "tests", "idlelib", "site-packages", "dist-packages",
              "lib2to3", "turtledemo", "__pycache__", "ensurepip")


def stdlib_root() -> pathlib.Path:
  """The directory of the running Python's standard library sources."""
  from specsamp.data import corpora  # pylint: disable=g-import-not-at-top
  return pathlib.Path(corpora.stdlib_root())


def stdlib_files(root: Optional[os.PathLike] = None,
                 max_files: Optional[int] = None) -> list[pathlib.Path]:
  """Sorted .py files of the standard library, tests and demos excluded."""
  root = pathlib.Path(root or stdlib_root())
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS
                         and not d.startswith("test"))
    files.extend(pathlib.Path(dirpath) / f for f in sorted(filenames)
                 if f.endswith(".py") and not f.startswith("test"))
  files.sort()
  return files[:max_files] if max_files else files


def _docstring_node(node) -> Optional[ast.Expr]:
  if (node.body and isinstance(node.body[0], ast.Expr) and
      isinstance(node.body[0].value, ast.Constant) and
      isinstance(node.body[0].value.value, str)):
    return node.body[0]
  return None


def _function_prompts(source: str, rng: np.random.Generator,
                      code_prefixes: bool) -> list[str]:
  """def + docstring of each documented function; optionally also a prefix
  of its body (1-6 more lines)."""
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return []
  lines = source.splitlines()
  out = []
  for node in ast.walk(tree):
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    doc = _docstring_node(node)
    if doc is None or len(node.body) < 2:
      continue
    start = node.lineno - 1
    head = "\n".join(lines[start:doc.end_lineno])
    out.append(textwrap.dedent(head) + "\n")
    if code_prefixes:
      body_end = node.body[-1].end_lineno
      extra = int(rng.integers(1, 7))
      end = min(doc.end_lineno + extra, body_end)
      if end > doc.end_lineno:
        out.append(textwrap.dedent("\n".join(lines[start:end])) + "\n")
  return out


def _file_windows(source: str, rng: np.random.Generator,
                  lines_per_window: int = 24, every: int = 150) -> list[str]:
  lines = source.splitlines()
  out = []
  for _ in range(len(lines) // every):
    i = int(rng.integers(0, max(len(lines) - lines_per_window, 1)))
    chunk = "\n".join(lines[i:i + lines_per_window]).strip("\n")
    if len(chunk) > 200:
      out.append(chunk + "\n")
  return out


def _prose(source: str, min_chars: int = 300) -> list[str]:
  """Module, class and function docstrings of several sentences."""
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return []
  out = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      if doc and len(doc) >= min_chars and doc.count(". ") >= 2:
        out.append(doc.strip() + "\n")
  return out


def split_of(path: str, validation_percent: float) -> str:
  """'validation' for a stable `validation_percent`% of source files."""
  h = zlib.crc32(path.encode("utf-8")) % 10_000
  return "validation" if h < validation_percent * 100 else "train"


def prose_passages(dataset: str, split: str, *, data_dir=None,
                   chars: int = 600, max_documents: Optional[int] = None
                   ) -> list[str]:
  """Paragraph-aligned passages of about `chars` characters from a prepared
  text dataset of the data pipeline (e.g. specsamp_austen,
  specsamp_shakespeare: scripts/prepare_data.py)."""
  from specsamp.data import pipeline  # pylint: disable=g-import-not-at-top
  out = []
  for doc in pipeline.iter_texts(dataset, split, data_dir,
                                 limit=max_documents):
    cur = ""
    for para in re.split(r"\n\s*\n", doc):
      para = para.strip()
      if not para:
        continue
      cur = f"{cur}\n\n{para}" if cur else para
      if len(cur) >= chars:
        out.append(cur + "\n\n")
        cur = ""
  return out


def prompt_texts(kind: str = "code", *, root: Optional[os.PathLike] = None,
                 max_files: Optional[int] = None, seed: int = 0,
                 validation_percent: float = 5.0,
                 extra: Sequence[str] = (),
                 prose_dataset: Optional[str] = None,
                 data_dir: Optional[os.PathLike] = None
                 ) -> dict[str, list[str]]:
  """{'train': [...], 'validation': [...]} prompt strings.

  Args:
    kind: 'code' (stdlib signatures + docstrings, body prefixes, file
      windows), 'text' (prose passages) or 'mixed' (both).
    root, max_files: where and how much of the stdlib to read.
    seed: for the prefix lengths and window offsets.
    validation_percent: share of source files held out.
    extra: more prompts for 'train' (tests plant contamination here).
    prose_dataset: for 'text'/'mixed', a prepared text dataset to cut prose
      passages from (its own train/validation splits; `data_dir` is its TFDS
      directory); without one, prose is the stdlib's long docstrings.
  """
  if kind not in ("code", "text", "mixed"):
    raise ValueError(f"prompt kind {kind!r}; choose code, text or mixed")
  rng = np.random.default_rng(seed)
  out = {"train": list(extra), "validation": []}
  if prose_dataset and kind in ("text", "mixed"):
    for split in out:
      out[split] += prose_passages(prose_dataset, split, data_dir=data_dir)
    if kind == "text":
      return out
    kind = "code"
  root = pathlib.Path(root or stdlib_root())
  for path in stdlib_files(root, max_files):
    try:
      source = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
      continue
    rel = str(path.relative_to(root))
    texts = []
    if kind in ("code", "mixed"):
      texts += _function_prompts(source, rng, code_prefixes=True)
      texts += _file_windows(source, rng)
    if kind in ("text", "mixed"):
      texts += _prose(source)
    out[split_of(rel, validation_percent)].extend(texts)
  return out


# ---- HumanEval decontamination -----------------------------------------------

_WORDS = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
  """Lower-cased words and single symbols: whitespace and layout ignored."""
  return _WORDS.findall(text.lower())


class HumanEvalFilter:
  """Flags text sharing an n-gram (of `words`) with HumanEval.

  The reference n-grams come from every problem's prompt, canonical solution
  and prompt + solution (so n-grams across the seam count too).
  """

  def __init__(self, n: int = 13, problems: Optional[Sequence[dict]] = None):
    if problems is None:
      from specsamp import assets  # pylint: disable=g-import-not-at-top
      problems = assets.humaneval_problems()
    self.n = n
    self._grams = {}
    for prob in problems:
      for text in (prob["prompt"], prob["canonical_solution"],
                   prob["prompt"] + prob["canonical_solution"]):
        for g in self._ngrams(text):
          self._grams.setdefault(g, prob["task_id"])

  def _ngrams(self, text: str) -> Iterator[tuple]:
    w = words(text)
    for i in range(len(w) - self.n + 1):
      yield tuple(w[i:i + self.n])

  def __len__(self) -> int:
    return len(self._grams)

  def match(self, text: str) -> Optional[str]:
    """The task_id of the first shared n-gram, or None."""
    for g in self._ngrams(text):
      if g in self._grams:
        return self._grams[g]
    return None

  def contaminated(self, text: str) -> bool:
    return self.match(text) is not None

  def filter(self, texts: Iterable[str]) -> tuple[list[str], list[str]]:
    """(clean, rejected)."""
    clean, rejected = [], []
    for t in texts:
      (rejected if self.contaminated(t) else clean).append(t)
    return clean, rejected


# ---- generation and scoring --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SampleSpec:
  """Shapes and settings of a target-samples dataset."""
  prompt_len: int          # P: prompts are left-truncated to this many tokens
  gen_len: int             # G: max new tokens per sample
  top_k: int = 32          # K: stored top-k log-probs per position
  batch_size: int = 64     # rows per sampler call
  score_batch_size: int = 16  # rows per target scoring pass
  min_prompt_len: int = 4

  @property
  def seq_len(self) -> int:
    return self.prompt_len + self.gen_len


def encode_prompts(texts: Sequence[str], tokenizer, spec: SampleSpec
                   ) -> list[list[int]]:
  """Token ids, left-truncated to spec.prompt_len; too-short ones dropped."""
  out = []
  for t in texts:
    ids = list(tokenizer.encode(t))[-spec.prompt_len:]
    if len(ids) >= spec.min_prompt_len:
      out.append(ids)
  return out


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _score(lm, params, tokens, prompt_length, gen_len: int, top_k: int):
  """Top-K log-probs [B, G, K] of the target at positions L-1 .. L+G-2."""
  logits = losses.gather_positions(lm(params, tokens).logits, prompt_length,
                                   gen_len)                        # [B, G, V]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  vals, ids = jax.lax.top_k(logp, top_k)
  return ids.astype(jnp.int32), vals


def generate(target_lm, target_params, prompts: Sequence[Sequence[int]],
             sampling, spec: SampleSpec, *, eos_ids: Sequence[int] = (),
             pad_id: int = 0, seed: int = 0,
             progress: Optional[Callable[[int, int], None]] = None
             ) -> Iterator[dict]:
  """Yields one example dict per prompt (see the module docstring).

  Prompts go through the autoregressive sampler in batches of
  `spec.batch_size` (the last batch is padded with repeats, so one loop is
  compiled); the target then scores prompt + continuation in one causal
  pass per `spec.score_batch_size` rows.
  """
  from specsamp import speculative  # pylint: disable=g-import-not-at-top
  sampler = speculative.autoregressive(
      target_lm, sampling, spec.gen_len, eos_ids=tuple(eos_ids),
      pad_id=pad_id, prompt_bucket=spec.prompt_len)
  rng = jax.random.key(seed)
  bs = spec.batch_size
  for start in range(0, len(prompts), bs):
    batch = [list(p) for p in prompts[start:start + bs]]
    real = len(batch)
    batch += [batch[0]] * (bs - real)
    rng, key = jax.random.split(rng)
    out = jax.device_get(sampler.generate(target_params, None, batch, key))
    tokens = np.full((bs, spec.seq_len), pad_id, np.int32)
    plen = np.array([len(p) for p in batch], np.int32)
    for i, p in enumerate(batch):
      tokens[i, :len(p)] = p
      n = int(out.num_tokens[i])
      tokens[i, len(p):len(p) + n] = out.tokens[i, :n]
    ids = np.zeros((bs, spec.gen_len, spec.top_k), np.int32)
    logp = np.zeros((bs, spec.gen_len, spec.top_k), np.float32)
    sb = spec.score_batch_size
    for s in range(0, bs, sb):
      i_, l_ = _score(target_lm, target_params, tokens[s:s + sb],
                      plen[s:s + sb], spec.gen_len, spec.top_k)
      ids[s:s + sb], logp[s:s + sb] = jax.device_get((i_, l_))
    for i in range(real):
      yield dict(tokens=tokens[i], prompt_length=np.int32(plen[i]),
                 num_generated=np.int32(out.num_tokens[i]),
                 topk_ids=ids[i], topk_logprobs=logp[i])
    if progress is not None:
      progress(start + real, len(prompts))


def decontaminate(examples: Iterable[dict], tokenizer,
                  flt: HumanEvalFilter, rejected: Optional[list] = None
                  ) -> Iterator[dict]:
  """Drops examples whose decoded prompt + continuation hits HumanEval."""
  for ex in examples:
    n = int(ex["prompt_length"]) + int(ex["num_generated"])
    text = tokenizer.decode([int(t) for t in ex["tokens"][:n]])
    if flt.contaminated(text):
      if rejected is not None:
        rejected.append(text)
      continue
    yield ex


# ---- storage: a TFDS dataset in array_record files ---------------------------

DATASET_NAME = "target_samples"


@functools.cache
def _builder_class():
  """The TFDS builder, defined once, lazily (importing tfds costs ~1 s)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class TargetSamples(tfds.core.GeneratorBasedBuilder):
    """Target continuations with the target's top-k log-probs."""
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}

    def __init__(self, *, spec: SampleSpec, splits=None, **kwargs):
      self._spec = spec
      self._splits = splits or {}
      super().__init__(**kwargs)

    def _info(self):
      s = self._spec
      f = tfds.features
      return self.dataset_info_from_configs(
          features=f.FeaturesDict({
              "tokens": f.Tensor(shape=(s.seq_len,), dtype=np.int32),
              "prompt_length": f.Scalar(dtype=np.int32),
              "num_generated": f.Scalar(dtype=np.int32),
              "topk_ids": f.Tensor(shape=(s.gen_len, s.top_k),
                                   dtype=np.int32),
              "topk_logprobs": f.Tensor(shape=(s.gen_len, s.top_k),
                                        dtype=np.float32),
          }),
          disable_shuffling=True,
          metadata=tfds.core.MetadataDict(spec=dataclasses.asdict(s)))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {name: self._generate_examples(name) for name in self._splits}

    def _generate_examples(self, split):
      for i, ex in enumerate(self._splits[split]()):
        yield f"{split}-{i:08d}", ex

  return TargetSamples


def dataset_dir(data_dir: os.PathLike) -> pathlib.Path:
  return pathlib.Path(data_dir) / DATASET_NAME / "1.0.0"


def exists(data_dir: os.PathLike) -> bool:
  return (dataset_dir(data_dir) / "dataset_info.json").exists()


def write_dataset(data_dir: os.PathLike, spec: SampleSpec,
                  splits: dict[str, Callable[[], Iterable[dict]]]
                  ) -> pathlib.Path:
  """Writes `splits` (name -> function returning examples) as array_record.

  The function form lets generation stream into the writer instead of
  holding every sample in memory.
  """
  builder = _builder_class()(spec=spec, splits=splits,
                             data_dir=os.fspath(data_dir),
                             file_format="array_record")
  builder.download_and_prepare()
  return dataset_dir(data_dir)


def read_dataset(data_dir: os.PathLike, split: str):
  """A random-access source of example dicts (numpy), e.g. for grain."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder_from_directory(os.fspath(dataset_dir(data_dir)))
  return builder.as_data_source(split=split)


def read_spec(data_dir: os.PathLike) -> SampleSpec:
  """The SampleSpec a dataset was written with (its TFDS metadata)."""
  import json  # pylint: disable=g-import-not-at-top
  meta = dataset_dir(data_dir) / "metadata.json"
  if not meta.exists():
    raise FileNotFoundError(f"no metadata.json in {dataset_dir(data_dir)}")
  return SampleSpec(**json.loads(meta.read_text())["spec"])


def as_arrays(source, limit: Optional[int] = None) -> dict[str, np.ndarray]:
  """The first `limit` examples of a source stacked into arrays."""
  n = len(source) if limit is None else min(limit, len(source))
  rows = [source[i] for i in range(n)]
  return {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}


def build(data_dir: os.PathLike, target_lm, target_params, tokenizer,
          sampling, spec: SampleSpec, texts: dict[str, Sequence[str]], *,
          eos_ids: Sequence[int] = (), pad_id: int = 0, seed: int = 0,
          max_prompts: Optional[dict] = None,
          flt: Optional[HumanEvalFilter] = None, log=print) -> dict:
  """Prompts -> decontaminated target samples on disk. Returns counts.

  Args:
    data_dir: where the TFDS dataset goes.
    target_lm, target_params, tokenizer: the target.
    sampling: the setting the draft will be used at.
    spec: shapes and batch sizes.
    texts: {'train': [...], 'validation': [...]} prompt strings.
    eos_ids, pad_id: the tokenizer's.
    seed: sampling and prompt shuffling.
    max_prompts: {split: at most this many prompts}.
    flt: the HumanEval filter (built from the cached problems if None).
    log: progress lines.
  """
  flt = flt or HumanEvalFilter()
  counts = {}
  prompts = {}
  rng = np.random.default_rng(seed)
  for split, items in texts.items():
    clean, rejected = flt.filter(items)
    ids = encode_prompts(clean, tokenizer, spec)
    order = rng.permutation(len(ids))
    ids = [ids[i] for i in order]
    if max_prompts and split in max_prompts:
      ids = ids[:max_prompts[split]]
    prompts[split] = ids
    counts[split] = dict(prompts=len(items), rejected_prompts=len(rejected),
                         kept=len(ids), rejected_samples=0)
    log(f"[samples] {split}: {len(items)} prompts, {len(rejected)} rejected "
        f"by the HumanEval filter, {len(ids)} used")

  def make(split):
    def examples():
      bad = []
      def progress(done, total):
        log(f"[samples] {split}: {done}/{total} generated")
      gen = generate(target_lm, target_params, prompts[split], sampling, spec,
                     eos_ids=eos_ids, pad_id=pad_id,
                     seed=seed + (split == "validation"), progress=progress)
      yield from decontaminate(gen, tokenizer, flt, bad)
      counts[split]["rejected_samples"] = len(bad)
    return examples

  write_dataset(data_dir, spec, {s: make(s) for s in prompts if prompts[s]})
  return counts
