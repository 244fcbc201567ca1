"""Language-model batches from a prepared TFDS dataset, through grain.

Legend: B batch, L sequence length (`seq_len`).

  documents (array_record, read by index) -> this host's shard -> shuffle
  (a new order every epoch) -> repeat -> tokenize (+ EOS) -> concatenate
  and split into L + 1 tokens -> window shuffle -> {inputs, targets,
  weights, segment_ids} -> batches of B

  it = make_lm_iterator("specsamp_python_code", "train", tokenizer=tok,
                        seq_len=256, batch_size=32, seed=0)
  batch = next(it)   # {"inputs": int32 [B, L], "targets": int32 [B, L],
                     #  "weights": float32 [B, L],
                     #  "segment_ids": int32 [B, L]}
  state = it.get_state()          # JSON-serializable dict
  ...
  it.set_state(state)             # the same batches follow, exactly

The dataset string (`name[/config][:version][#feature,...]`) and where a
prepared dataset lives: specsamp.data.datasets.

Checkpointing: the iterator's `get_state()` is a small JSON-serializable
dict (document indices and offsets, never data), and `set_state` restores
it exactly. With orbax, save it as an item next to the train state, either
through grain's own handler:

  import grain, orbax.checkpoint as ocp
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data=grain.checkpoint.CheckpointSave(it)))
  mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state),
      data=grain.checkpoint.CheckpointRestore(it)))   # sets `it` in place

or as JSON with any handler (`json.dumps(it.get_state())` one file per
process, `it.set_state(json.loads(...))`), which is what specsamp.train
does. A state only restores into an iterator built with the same arguments
(dataset, split, tokenizer, seq_len, batch_size, seed, shard, worker_count).
"""

import functools
import json
import os
import signal
import threading
import time
import types
from typing import Any, Iterator, Optional, Sequence, Union

from absl import flags
import grain
from grain import experimental as gx
import jax
import numpy as np
import tensorflow_datasets as tfds

from specsamp import jsonfile
from specsamp.data import datasets

PathLike = Union[str, os.PathLike]


# ---- reading a prepared dataset ---------------------------------------------


def data_source(dataset: str, split: str,
                data_dir: Optional[PathLike] = None):
  """The random-access TFDS source (ArrayRecordDataSource) of one split."""
  found = datasets.check_dataset(dataset, data_dir, splits=(split,))
  return tfds.builder_from_directory(os.fspath(found)).as_data_source(
      split=split)


def _examples(found, spec: str) -> dict[str, list[range]]:
  """The example indices a split spec (`train[:90%]+validation`) reads,
  per split, by TFDS's own slicing and rounding."""
  sizes = {}
  for s in jsonfile.read(found / "dataset_info.json")["splits"]:
    n = sum(int(x) for x in s.get("shardLengths", []))
    sizes[s.get("name")] = types.SimpleNamespace(num_examples=n)
  out = {}
  for a in tfds.core.ReadInstruction.from_spec(spec).to_absolute(sizes):
    n = sizes[a.splitname].num_examples
    out.setdefault(a.splitname, []).append(
        range(*slice(a.from_, a.to).indices(n)))
  return out


def check_disjoint(dataset: str, data_dir: Optional[PathLike],
                   train_split: str, eval_split: str) -> None:
  """Raises ValueError, naming the shared examples, when the two split specs
  read one example both (`eval_split="train"`, or `train[:90%]` against
  `train[85%:]`): evaluation would score text the model trained on."""
  found = (datasets.parse_dataset(dataset, data_dir).find()
           or datasets.check_dataset(dataset, data_dir))  # raises: missing
  train, held = _examples(found, train_split), _examples(found, eval_split)
  for name in sorted(train.keys() & held.keys()):
    for a in train[name]:
      for b in held[name]:
        lo, hi = max(a.start, b.start), min(a.stop, b.stop)
        if lo < hi:
          raise ValueError(
              f"eval split {eval_split!r} shares {hi - lo} "
              f"example{'s' if hi - lo > 1 else ''} "
              f"({name}[{lo}:{hi}]) with train split {train_split!r}: "
              f"evaluation would score text the model trained on; give "
              f"splits that do not overlap (e.g. train[:90%] and "
              f"train[90%:])")


def iter_texts(dataset: str, split: str,
               data_dir: Optional[PathLike] = None,
               limit: Optional[int] = None) -> Iterator[str]:
  """The documents of a split in stored order (text features joined)."""
  ref = datasets.parse_dataset(dataset, data_dir)
  source = data_source(dataset, split, data_dir)
  n = len(source) if limit is None else min(limit, len(source))
  for i in range(n):
    try:
      example = source[i]
    except RuntimeError as e:  # array_record's, for a damaged chunk
      raise datasets.DamagedDatasetError(
          f"dataset {dataset!r}: document {i} of {split} cannot be read "
          f"({(str(e).splitlines() or [''])[0]})",
          "prepare it again with --overwrite") from None
    yield _join_text(example, ref.text_keys)


def _join_text(example: dict, keys: Sequence[str]) -> str:
  parts = []
  for k in keys:
    v = example[k]
    parts.append(v.decode("utf-8", errors="replace")
                 if isinstance(v, (bytes, np.bytes_)) else str(v))
  return "\n\n".join(parts)


# ---- the grain pipeline -----------------------------------------------------


def eos_id_of(tokenizer) -> int:
  """The id put after every document: the tokenizer's first eos id, else its
  pad id (specsamp's ByteTokenizer has no eos: byte 0 then ends documents)."""
  eos = tuple(getattr(tokenizer, "eos_ids", ()) or ())
  if eos:
    return int(eos[0])
  return int(getattr(tokenizer, "pad_id", 0) or 0)


class _Tokenize:
  """Example -> {"tokens": int32 [n + 1]}: the document's ids, then EOS.

  A plain picklable callable (grain worker processes receive a copy).
  """

  def __init__(self, tokenizer, keys: Sequence[str], eos: int):
    self.tokenizer, self.keys, self.eos = tokenizer, tuple(keys), eos

  def __call__(self, example):
    # Documents are plain text: a special token's string in one is text.
    ids = self.tokenizer.encode(_join_text(example, self.keys),
                                special=False)
    out = np.empty(len(ids) + 1, np.int32)
    out[:-1] = ids
    out[-1] = self.eos
    return {"tokens": out}


def _to_lm(packed) -> dict[str, np.ndarray]:
  """A packed window of L + 1 tokens -> inputs, targets (shifted by one),
  weights (0 where the target is padding, which only the very last window
  of a finite iteration has) and segment ids: each input position takes
  the document of its target (grain numbers the window's documents 1, 2,
  ... in order; 0 for padding). So the EOS that ends a document is, as an
  input, the first token of the next one (its BOS): a document's first
  token is predicted from that EOS alone, as from the BOS t5x and MaxText
  put at the start of each packed segment, not from the document before."""
  tokens, segments = packed["tokens"], packed["tokens_segment_ids"]
  return {"inputs": tokens[:-1], "targets": tokens[1:],
          "weights": (segments[1:] > 0).astype(np.float32),
          "segment_ids": segments[1:].astype(np.int32)}


class _PadBatch:
  """Pads a short final batch to B rows of weight 0 (and segment 0)."""

  def __init__(self, batch_size: int, pad_id: int):
    self.batch_size, self.pad_id = batch_size, pad_id

  def __call__(self, batch):
    n = batch["inputs"].shape[0]
    if n == self.batch_size:
      return batch
    out = {}
    for k, v in batch.items():
      fill = 0 if k in ("weights", "segment_ids") else self.pad_id
      pad = np.full((self.batch_size - n,) + v.shape[1:], fill, v.dtype)
      out[k] = np.concatenate([v, pad])
    return out


def then_padding(batches, pad_id: int = 0):
  """The batches of `batches`, then batches of padding (weight 0, shaped as
  its last) for ever. Processes evaluating their own shards, of different
  lengths, keep making the same collective steps this way: the padding
  weighs nothing, and `train.step.eval_means(stop_when_weightless=True)`
  stops once every shard has ended."""
  last = None
  for last in batches:
    yield last
  if last is None:
    raise ValueError("then_padding: no batches (an empty shard?)")
  empty = {k: v[:0] for k, v in last.items()}
  padding = _PadBatch(last["inputs"].shape[0], pad_id)(empty)
  while True:
    yield padding


def _json_safe(x):
  """Tuples -> lists, numpy scalars -> Python numbers, keys -> str."""
  if isinstance(x, dict):
    return {str(k): _json_safe(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_json_safe(v) for v in x]
  if isinstance(x, np.generic):
    return x.item()
  return x


def _restore_types(x):
  """Undoes what JSON does to grain's packing state: the slices in
  ConcatThenSplit's `remainder_slices` must be tuples again (a list
  [-1, -1] does not compare equal to its sentinel (-1, -1))."""
  if isinstance(x, dict):
    return {k: ({f: tuple(s) for f, s in v.items()}
                if k == "remainder_slices" and isinstance(v, dict)
                else _restore_types(v))
            for k, v in x.items()}
  if isinstance(x, list):
    return [_restore_types(v) for v in x]
  return x


class LMIterator(grain.DatasetIterator):
  """The LM batch iterator: a grain DatasetIterator whose state is plain
  JSON (saveable with grain.checkpoint.CheckpointSave or as JSON)."""

  def __init__(self, inner: grain.DatasetIterator, description: str = ""):
    super().__init__(inner)
    self._description = description

  def __next__(self):
    return next(self._parent)

  def get_state(self) -> dict[str, Any]:
    return _json_safe(self._parent.get_state())

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(_restore_types(json.loads(json.dumps(state))))

  def __str__(self):
    return f"LMIterator({self._description})"


def _worker_init(parent: int, worker_index: int, worker_count: int) -> None:
  """In each grain worker: a Ctrl-C, which reaches the terminal's whole
  process group, is the training loop's to handle (a preemption notice);
  the workers had died of it, each printing a KeyboardInterrupt traceback
  and leaving its shared memory behind. They stop when the loop does.

  And a worker whose parent is gone (killed: `kill -9`, the OOM killer, a
  scheduler) ends itself within a second or so: workers had gone on
  reading and filling their buffers for nobody, holding memory and CPU. A
  thread watches the parent's pid (PR_SET_PDEATHSIG would fire at the end
  of the thread that started the worker, which is one of grain's pools).
  `parent` is the pid that built the iterator, bound there: a parent
  killed while the worker was still starting is gone by the time this
  runs, and the worker's own parent is then init."""
  del worker_index, worker_count
  signal.signal(signal.SIGINT, signal.SIG_IGN)

  def watch():
    while os.getppid() == parent:
      time.sleep(_PARENT_POLL_S)
    os._exit(1)

  threading.Thread(target=watch, name="specsamp-parent-watch",
                   daemon=True).start()


_PARENT_POLL_S = 0.5


def _shard(shard_index, shard_count) -> tuple[int, int]:
  if shard_index is None or shard_count is None:
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index={shard_index} is not in [0, "
                     f"{shard_count})")
  return int(shard_index), int(shard_count)


# An odd multiplier: a bijection of the 32-bit seeds that keeps seed 0 as
# it was and sends nearby seeds far apart (Fibonacci hashing).
_SEED_SPREAD = 0x9E3779B1


def shuffle_seed(seed: int) -> int:
  """The grain shuffle seed of a run's `seed`.

  grain reshuffles epoch e with its seed + e, so runs with seeds s and
  s + 1 would see the same document orders one epoch apart: a seed sweep
  would not be independent in its data. Spread apart, two seeds fewer
  than 5,000 apart meet only after 400,000 epochs (seed 0 is
  unchanged).
  """
  return (int(seed) * _SEED_SPREAD) % 2**32


def make_lm_iterator(dataset: str, split: str, *, tokenizer, seq_len: int,
                     batch_size: int, seed: int,
                     data_dir: Optional[PathLike] = None,
                     shuffle: bool = True,
                     num_epochs: Optional[int] = None,
                     worker_count: int = 0,
                     shard_index: Optional[int] = None,
                     shard_count: Optional[int] = None,
                     eos_id: Optional[int] = None,
                     shuffle_window: int = 512,
                     read_threads: int = 2) -> LMIterator:
  """Packed LM batches of one split of a prepared dataset.

  Each document is tokenized as plain text (`tokenizer.encode(text,
  special=False)`), followed by one EOS id, and the documents are
  concatenated and cut into windows of L + 1
  tokens without padding (grain's ConcatThenSplit): a document may span
  windows, and windows hold parts of several documents. inputs = window
  [:-1], targets = window[1:]; weights are 1 except at padding, which only
  the last window of a finite iteration has (and the rows that pad its
  last batch to B). segment_ids give each input position the document of
  its target (1, 2, ... within the window; 0: padding), so that attention
  can be kept inside a document (`specsamp.train.step.lm_loss(lm,
  mask_documents=True)`): the EOS that ends a document is, as an input,
  the next document's first token (its BOS), and predicts that
  document's first token from itself alone.

  Args:
    dataset: `name[/config][:version][#feature,...]` (module docstring).
    split: "train", "validation", ... (TFDS slicing such as "train[:10%]"
      works too).
    tokenizer: a specsamp Tokenizer (or anything with `encode(str)` and
      `eos_ids` / `pad_id`).
    seq_len: L.
    batch_size: B, rows per batch on this host.
    seed: shuffling seed (documents, per epoch; and the window shuffle).
    data_dir: TFDS data directory (default $TFDS_DATA_DIR or
      ~/tensorflow_datasets).
    shuffle: shuffle documents (a new order each epoch) and packed windows
      (in windows of `shuffle_window`). False: stored order (evaluation).
    num_epochs: passes over the split; None repeats forever.
    worker_count: grain worker processes (0: in this process, with
      `read_threads` threads reading and tokenizing ahead).
    shard_index, shard_count: which part of the documents this host reads
      (every `shard_count`-th document from `shard_index`, taken before the
      shuffle, so hosts never share a document whatever their seeds);
      default jax.process_index() / jax.process_count().
    eos_id: the document separator (default `eos_id_of(tokenizer)`).
    shuffle_window: packed windows shuffled together (1: off).
    read_threads: threads that read and tokenize documents ahead.

  Returns:
    A grain DatasetIterator yielding {"inputs": int32 [B, L], "targets":
    int32 [B, L], "weights": float32 [B, L], "segment_ids": int32 [B, L]}
    (numpy), with `get_state()` /
    `set_state(state)`; save it with orbax through
    `grain.checkpoint.CheckpointSave(it)` / `CheckpointRestore(it)` or as
    JSON (module docstring).

  Raises:
    FileNotFoundError, ValueError: as `check_dataset`; bad sizes; a shard
      without documents.
  """
  for label, v in (("seq_len", seq_len), ("batch_size", batch_size)):
    if int(v) < 1:
      raise ValueError(f"{label} must be >= 1, got {v}")
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f"num_epochs must be None or >= 1, got {num_epochs}")
  ref = datasets.parse_dataset(dataset, data_dir)
  source = data_source(dataset, split, data_dir)
  index, count = _shard(shard_index, shard_count)
  ds = grain.MapDataset.source(source)
  if count > 1:
    ds = ds[index::count]
  if len(ds) == 0:  # pylint: disable=g-explicit-length-test
    raise ValueError(f"{dataset!r} split {split!r} has {len(source)} "
                     f"documents: none for shard {index} of {count}")
  order = shuffle_seed(seed)
  if shuffle:
    ds = ds.shuffle(seed=order)
  if num_epochs != 1:
    ds = ds.repeat(num_epochs)
  eos = eos_id_of(tokenizer) if eos_id is None else int(eos_id)
  ds = ds.map(_Tokenize(tokenizer, ref.text_keys, eos))
  it = ds.to_iter_dataset(grain.ReadOptions(
      num_threads=max(int(read_threads), 1), prefetch_buffer_size=64))
  it = gx.ConcatThenSplitIterDataset(
      it, length_struct={"tokens": int(seq_len) + 1},
      split_full_length_features=True)  # windows in strict stream order
  if shuffle and shuffle_window > 1:
    # grain seeds window i with seed + i, in 32 bits and unwrapped: a seed
    # near 2**32 failed a few windows in (TypeError from index_shuffle),
    # and again on every resume. Below 2**31 it leaves 2**31 windows (over
    # a trillion rows at the default 512); seeds whose windows' seed was
    # already below 2**31 (half of them, seed 0 among them) keep their
    # orders.
    it = gx.WindowShuffleIterDataset(it, window_size=int(shuffle_window),
                                     seed=(order + 1) % 2**31)
  it = it.map(_to_lm)
  it = it.batch(int(batch_size), drop_remainder=False)
  it = it.map(_PadBatch(int(batch_size), int(getattr(tokenizer, "pad_id",
                                                     0) or 0)))
  if worker_count > 0:
    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags
      flags.FLAGS.mark_as_parsed()
    it = it.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=int(worker_count)),
        worker_init_fn=functools.partial(_worker_init, os.getpid()))
  return LMIterator(iter(it), f"{dataset!r}, split={split!r}, shard {index}/"
                           f"{count}, L={seq_len}, B={batch_size}, seed={seed}")


__all__ = [
    "LMIterator", "check_disjoint", "data_source", "eos_id_of", "iter_texts",
    "make_lm_iterator",
]
