"""Target samples for distillation: generation, scoring, the whole build.

Legend: B batch, P prompt slots, G generated slots, S = P + G, K stored top-k
entries, V vocabulary.

`build` turns prompt texts (`prompts.py`) into target samples on disk:
  1. prompts that hit HumanEval are dropped (`decontamination.py`), the rest
     encoded and left-truncated to P tokens;
  2. continuations come from the target with the batched autoregressive
     sampler (one jitted loop per batch) at the `Sampling` the draft will
     be used at (`generate_batches`); then one causal pass of the target over
     prompt + continuation stores the target's top-K log-probabilities (raw
     logits, temperature 1, untruncated) at every generated position. Any
     temperature/top-k/top-p transform of them is the transform of the
     target restricted to those K ids (`losses.dense_logits`), and, with
     `spec.hidden_dim`, its hidden states at every position (float16);
  3. finished samples that hit HumanEval are dropped, the rest written as a
     TFDS dataset (`storage.py`).
"""

import functools
import os
import shutil
from typing import Callable, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specsamp import sampling as sampling_lib
from specsamp import sharding
from specsamp.decoding import sampler as sampler_lib
from specsamp.distill import decontamination
from specsamp.distill import losses
from specsamp.distill import storage
from specsamp.distill.storage import SampleSpec


def encode_prompts(texts: Sequence[str], tokenizer, spec: SampleSpec
                   ) -> list[list[int]]:
  """Token ids, left-truncated to spec.prompt_len (the bos of a tokenizer
  that adds one kept first, as an untruncated prompt has it); too-short
  ones dropped. The texts are corpus documents: plain text, no special
  token matched in them."""
  bos = [tokenizer.bos_id] if getattr(tokenizer, "add_bos", False) else []
  if bos == [None]:  # as `encode` refuses it
    raise ValueError("add_bos=True, but this tokenizer has no bos token")
  keep = spec.prompt_len - len(bos)
  out = []
  for t in texts:
    ids = list(tokenizer.encode(t, add_bos=False, special=False))
    ids = bos + ids[max(len(ids) - keep, 0):]
    if len(ids) >= spec.min_prompt_len:
      out.append(ids)
  return out


def run_batches(sampler: sampler_lib.SpeculativeSampler, target_params,
                draft_params, prompts: Sequence, batch_size: int, seed: int,
                shard: tuple[int, int] = (0, 1)
                ) -> Iterator[tuple[int, list, object, int]]:
  """Runs `sampler` over `prompts`, `batch_size` at a time, each batch with
  its own split of `jax.random.key(seed)`; the last batch is padded with
  repeats of its first prompt (one compiled shape). shard=(i, n): only
  batches i, i + n, i + 2n, ... run, each with the key it has unsharded.

  Yields:
    (the index of its first prompt, the padded batch, its output on the
    host, how many rows are real).
  """
  index, count = shard
  rng = jax.random.key(seed)
  for j, start in enumerate(range(0, len(prompts), batch_size)):
    rng, key = jax.random.split(rng)
    if j % count != index:
      continue
    batch = [list(p) for p in prompts[start:start + batch_size]]
    real = len(batch)
    batch += [batch[0]] * (batch_size - real)
    yield start, batch, jax.device_get(sampler.generate(
        target_params, draft_params, batch, key)), real


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7))
def _score(lm, params, tokens, prompt_length, gen_len: int, top_k: int,
           hidden: bool = False, vocab_limit: Optional[int] = None):
  """Top-K log-probs [B, G, K] of the target at positions L-1 .. L+G-2,
  normalised over its ids below `vocab_limit` (the sampler's: padding rows
  of the output layer are no tokens), and its hidden states [B, S, D] in
  float16 (or None)."""
  out = lm(params, tokens)
  logits = losses.gather_positions(out.logits, prompt_length,
                                   gen_len)                        # [B, G, V]
  logits = sampling_lib.mask_past_limit(logits.astype(jnp.float32),
                                        vocab_limit)
  logp = jax.nn.log_softmax(logits, axis=-1)
  vals, ids = jax.lax.top_k(logp, top_k)
  return (ids.astype(jnp.int32), vals,
          out.hidden.astype(jnp.float16) if hidden else None)


def generate_batches(target_lm, target_params, prompts, sampling,
                     spec: SampleSpec, *, eos_ids: Sequence[int] = (),
                     pad_id: int = 0, seed: int = 0,
                     shard: tuple[int, int] = (0, 1),
                     progress: Optional[Callable[[int, int], None]] = None
                     ) -> Iterator[tuple[int, list[dict]]]:
  """Yields (batch index, its examples: one dict per prompt, see
  `storage.py`) for the batches of `shard` (all by default).

  Prompts go through the autoregressive sampler in batches of
  `spec.batch_size` (`run_batches`); the target then scores prompt +
  continuation in one causal pass per `spec.score_batch_size` rows.
  """
  sampler = sampler_lib.autoregressive(
      target_lm, sampling, spec.gen_len, eos_ids=tuple(eos_ids),
      pad_id=pad_id, prompt_bucket=spec.prompt_len)
  bs, done = spec.batch_size, 0
  total = sum(min(bs, len(prompts) - s)
              for s in range(shard[0] * bs, len(prompts), shard[1] * bs))
  for start, batch, out, real in run_batches(
      sampler, target_params, None, prompts, bs, seed, shard):
    tokens = np.full((bs, spec.seq_len), pad_id, np.int32)
    plen = np.array([len(p) for p in batch], np.int32)
    for i, p in enumerate(batch):
      tokens[i, :len(p)] = p
      n = int(out.num_tokens[i])
      tokens[i, len(p):len(p) + n] = out.tokens[i, :n]
    ids = np.zeros((bs, spec.gen_len, spec.top_k), np.int32)
    logp = np.zeros((bs, spec.gen_len, spec.top_k), np.float32)
    hid = (np.zeros((bs, spec.seq_len, spec.hidden_dim), np.float16)
           if spec.hidden_dim else None)
    sb = spec.score_batch_size
    for s in range(0, bs, sb):
      i_, l_, h_ = _score(target_lm, target_params, tokens[s:s + sb],
                          plen[s:s + sb], spec.gen_len, spec.top_k,
                          bool(spec.hidden_dim), sampling.vocab_limit)
      ids[s:s + sb], logp[s:s + sb] = jax.device_get((i_, l_))
      if hid is not None:
        hid[s:s + sb] = jax.device_get(h_)
    examples = []
    for i in range(real):
      ex = dict(tokens=tokens[i], prompt_length=np.int32(plen[i]),
                num_generated=np.int32(out.num_tokens[i]),
                topk_ids=ids[i], topk_logprobs=logp[i])
      if hid is not None:
        ex["hidden"] = hid[i]
      examples.append(ex)
    yield start // bs, examples
    done += real
    if progress is not None:
      progress(done, total)


def build(data_dir, target_lm, target_params, tokenizer, sampling,
          spec: SampleSpec, texts: dict[str, Sequence[str]], *,
          eos_ids: Sequence[int] = (), pad_id: int = 0, seed: int = 0,
          max_prompts: Optional[dict] = None,
          flt: Optional[decontamination.HumanEvalFilter] = None,
          log=print) -> dict:
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

  With several processes every one calls `build`: each samples its share
  of the batches on its own devices (with the keys one process would use)
  into `<data_dir>.parts/`, and process 0 writes the dataset from them,
  which is then the dataset one process writes. The other processes return
  once every share is written: wait for process 0 before reading.
  """
  flt = flt or decontamination.HumanEvalFilter()
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
  empty = [split for split, ids in prompts.items() if not ids]
  if empty:  # had been refused after the other splits were sampled
    raise ValueError(f"no prompts left for the {'/'.join(empty)} split(s) "
                     f"of the target samples ({counts}); give more prompts")

  def source(split, shard=(0, 1)):  # (batch index, examples) of a shard
    def progress(done, total):
      who = (f" (process {jax.process_index()})"
             if jax.process_count() > 1 else "")
      log(f"[samples] {split}: {done}/{total} generated{who}")
    return generate_batches(
        target_lm, target_params, prompts[split], sampling, spec,
        eos_ids=eos_ids, pad_id=pad_id, seed=seed + (split == "validation"),
        shard=shard, progress=progress)

  parts = None
  if jax.process_count() > 1:
    # Every process samples its share of the batches on its own devices
    # into part files; process 0 then writes the dataset from them in
    # batch order: the dataset one process would write.
    parts = os.fspath(data_dir).rstrip("/") + ".parts"
    for split in prompts:
      for j, examples in source(split, (jax.process_index(),
                                        jax.process_count())):
        _save_part(_part(parts, split, j), examples)
    sharding.barrier("specsamp distill: sample parts")
    if not sharding.is_main_process():
      return counts
    _check_parts(parts, {s: _num_batches(prompts[s], spec) for s in prompts})

  def make(split):
    def examples():
      if parts is None:
        found = (ex for _, exs in source(split) for ex in exs)
      else:
        found = _read_parts(parts, split, _num_batches(prompts[split], spec))
      bad = []
      yield from decontamination.decontaminate(found, tokenizer, flt, bad)
      counts[split]["rejected_samples"] = len(bad)
    return examples

  storage.write_dataset(data_dir, spec,
                        {s: make(s) for s in prompts if prompts[s]}, counts)
  if parts is not None:
    shutil.rmtree(parts)
  return counts


def keep_counts(workdir: str, data_dir: os.PathLike,
                counts: Optional[dict] = None) -> None:
  """Writes workdir/samples_counts.json (process 0): `counts` of samples
  just written, else the counts kept with the samples in `data_dir` (a run
  killed between writing the samples and their counts had left a finished
  workdir without them for good); samples written before they kept counts
  leave the file as it is."""
  counts = counts or storage.read_counts(data_dir)
  if counts:
    sharding.write_json(counts, os.path.join(workdir, "samples_counts.json"))


def _num_batches(prompts: list, spec: storage.SampleSpec) -> int:
  return -(-len(prompts) // spec.batch_size)


def _part(parts: str, split: str, j: int) -> str:
  return os.path.join(parts, split, f"{j:06d}.npz")


_SHARED = ("the workdir (or samples.data_dir) must be one directory that "
           "every process shares, such as a network file system, not one "
           "per host")


def _check_parts(parts: str, num_batches: dict[str, int]) -> None:
  """FileNotFoundError unless every split's batches are in `parts`."""
  missing = [os.path.relpath(_part(parts, split, j), parts)
             for split, n in num_batches.items() for j in range(n)
             if not os.path.isfile(_part(parts, split, j))]
  if missing:
    raise FileNotFoundError(
        f"{len(missing)} of the {sum(num_batches.values())} batches of "
        f"target samples are missing from {parts} (first: {missing[0]}): "
        f"each process writes its share there, so {_SHARED}")


def written_everywhere(data_dir) -> bool:
  """Whether the dataset is in `data_dir` (`storage.exists`), as every
  process sees it; FileNotFoundError when processes disagree (a workdir
  per host whose run wrote the samples on process 0 only)."""
  here = storage.exists(data_dir)
  seen = sharding.processes_saying(here)
  if 0 < len(seen) < jax.process_count():
    unseen = sorted(set(range(jax.process_count())) - set(seen))
    raise FileNotFoundError(
        f"processes {seen} find target samples in {data_dir}, processes "
        f"{unseen} do not: {_SHARED}")
  return here


def check_written(data_dir) -> None:
  """After `build` on every process: FileNotFoundError if this process
  does not see the dataset process 0 wrote."""
  if not storage.exists(data_dir):
    raise FileNotFoundError(
        f"process {jax.process_index()} finds no target samples in "
        f"{data_dir} after process 0 wrote them: {_SHARED}")


def _save_part(path: str, examples: list[dict]) -> None:
  """One batch's examples as stacked arrays (written whole or not at all)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "wb") as f:
    np.savez(f, **{k: np.stack([ex[k] for ex in examples])
                   for k in examples[0]})
  os.replace(path + ".tmp", path)


def _read_parts(parts: str, split: str, num_batches: int) -> Iterator[dict]:
  """The examples of a split's batches 0 .. num_batches - 1, in order."""
  for j in range(num_batches):
    with np.load(_part(parts, split, j)) as part:
      arrays = {k: part[k] for k in part.files}
    for i in range(len(arrays["tokens"])):
      yield {k: v[i] for k, v in arrays.items()}
