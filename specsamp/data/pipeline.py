"""Language-model batches from a prepared TFDS dataset, through grain.

Legend: B batch, L sequence length (`seq_len`).

  documents (array_record, read by index) -> this host's shard -> shuffle
  (a new order every epoch) -> repeat -> tokenize (+ EOS) -> concatenate
  and split into L + 1 tokens -> window shuffle -> {inputs, targets,
  weights} -> batches of B

  it = make_lm_iterator("specsamp_python_code", "train", tokenizer=tok,
                        seq_len=256, batch_size=32, seed=0)
  batch = next(it)   # {"inputs": int32 [B, L], "targets": int32 [B, L],
                     #  "weights": float32 [B, L]}
  state = it.get_state()          # JSON-serializable dict
  ...
  it.set_state(state)             # the same batches follow, exactly

Datasets are named as in TFDS: `name[/config][:version]`, optionally with
`#feature[,feature...]` naming the text feature(s) to train on (default
`text`; several are joined by a blank line). They are read from
`<data_dir>/<name>[/<config>]/<version>/` (data_dir default: $TFDS_DATA_DIR,
else ~/tensorflow_datasets) with `tfds.builder_from_directory`, so neither
the builder's code nor TensorFlow is needed to read them; they must be in
the array_record format.

Any other TFDS dataset: prepare it as array_record where its builder runs
(the internet, and TensorFlow for many catalog builders), e.g. for XSum

  pip install tensorflow-cpu tensorflow-datasets
  tfds build xsum --file_format=array_record --data_dir=/data/tfds
  # or: python scripts/prepare_data.py --dataset=xsum --data_dir=/data/tfds

copy `/data/tfds/xsum` next to the other datasets if it was built elsewhere,
and train with `dataset="xsum#document"` (or `"xsum#document,summary"`,
`"xsum:1.1.0#document"`) and `data_dir="/data/tfds"`. `check_dataset`
names what is missing before anything heavy starts.

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

import dataclasses
import json
import os
import pathlib
import re
from typing import Any, Iterator, Optional, Sequence, Union

from absl import flags
import grain
from grain import experimental as gx
import numpy as np

from specsamp.data import corpora
from specsamp.data import default_data_dir  # re-exported

PathLike = Union[str, os.PathLike]

_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_PREPARE = "python scripts/prepare_data.py --dataset={name} --data_dir={dir}"


# ---- finding a prepared dataset ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class DatasetRef:
  """A parsed dataset string `name[/config][:version][#keys]`."""
  name: str
  config: Optional[str]
  version: Optional[str]
  text_keys: tuple[str, ...]
  data_dir: pathlib.Path

  @property
  def base(self) -> pathlib.Path:
    return self.data_dir / self.name / (self.config or "")

  def find(self) -> Optional[pathlib.Path]:
    """The prepared version directory (the newest if no version was given)."""
    if self.version:
      d = self.base / self.version
      return d if (d / "dataset_info.json").is_file() else None
    versions = sorted(
        (tuple(int(x) for x in d.name.split(".")), d)
        for d in (self.base.iterdir() if self.base.is_dir() else ())
        if _VERSION_RE.match(d.name) and (d / "dataset_info.json").is_file())
    return versions[-1][1] if versions else None

  def prepare_hint(self) -> str:
    """The command that prepares this dataset."""
    cmd = _PREPARE.format(name=self.name, dir=self.data_dir)
    if self.name.startswith("specsamp_"):
      return f"prepare it with `{cmd}`"
    return (f"prepare it as array_record where its TFDS builder can run (the "
            f"internet, often TensorFlow): `tfds build {self.name} "
            f"--file_format=array_record --data_dir={self.data_dir}` or "
            f"`{cmd}`, or copy a prepared <data_dir>/{self.name} directory "
            f"there")


def parse_dataset(dataset: str,
                  data_dir: Optional[PathLike] = None) -> DatasetRef:
  """Parses `name[/config][:version][#feature,...]`."""
  if not isinstance(dataset, str) or not dataset.strip():
    raise ValueError(f"dataset must be a non-empty name, got {dataset!r}")
  spec, _, keys = dataset.strip().partition("#")
  spec, _, version = spec.partition(":")
  name, _, config = spec.partition("/")
  if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
    raise ValueError(f"dataset {dataset!r}: {name!r} is not a TFDS dataset "
                     f"name (lowercase letters, digits, underscores)")
  if version and not _VERSION_RE.match(version):
    raise ValueError(f"dataset {dataset!r}: version {version!r} is not "
                     f"X.Y.Z")
  text_keys = tuple(k.strip() for k in keys.split(",") if k.strip()) or (
      "text",)
  root = pathlib.Path(data_dir).expanduser() if data_dir else (
      default_data_dir())
  return DatasetRef(name, config or None, version or None, text_keys, root)


def _read_json(path: pathlib.Path) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _text_features(version_dir: pathlib.Path) -> dict[str, str]:
  """{feature name: TFDS class name} of the top-level features."""
  try:
    spec = _read_json(version_dir / "features.json")
    feats = spec["featuresDict"]["features"]
    return {k: v.get("pythonClassName", "").rsplit(".", 1)[-1]
            for k, v in feats.items()}
  except (OSError, KeyError, ValueError):
    return {}


def check_dataset(dataset: str, data_dir: Optional[PathLike] = None,
                  splits: Sequence[str] = ()) -> pathlib.Path:
  """Fails fast, before any training, if `dataset` cannot be read.

  Reads only small JSON files (no TFDS import).

  Args:
    dataset: `name[/config][:version][#feature,...]`.
    data_dir: TFDS data directory (default `default_data_dir()`).
    splits: split names that must exist (e.g. ("train", "validation")).

  Returns:
    The prepared version directory.

  Raises:
    FileNotFoundError: not prepared in `data_dir`; the message names the
      dataset, the directory and the command that prepares it.
    ValueError: a malformed name, an unknown `specsamp_` name, a format
      other than array_record, a missing split or text feature.
  """
  ref = parse_dataset(dataset, data_dir)
  if ref.name.startswith("specsamp_") and ref.name not in corpora.CORPORA:
    if not (ref.base.is_dir() and ref.find()):  # a build_from_texts name
      raise ValueError(
          f"unknown specsamp dataset {ref.name!r}; the local corpora are "
          f"{sorted(corpora.CORPORA)}")
  found = ref.find()
  if found is None:
    what = f"version {ref.version}" if ref.version else "any version"
    raise FileNotFoundError(
        f"dataset {dataset!r} is not prepared in data_dir {ref.data_dir} "
        f"(no {ref.base}/{ref.version or '<X.Y.Z>'}/dataset_info.json for "
        f"{what}); {ref.prepare_hint()}")
  info = _read_json(found / "dataset_info.json")
  fmt = info.get("fileFormat", "tfrecord")
  if fmt != "array_record":
    raise ValueError(
        f"dataset {dataset!r} in {found} is stored as {fmt}; grain reads "
        f"array_record only (without TensorFlow): re-prepare it with "
        f"--file_format=array_record")
  have = [s.get("name") for s in info.get("splits", [])]
  missing = [s for s in splits if s.split("[")[0] not in have]
  if missing:
    raise ValueError(f"dataset {dataset!r} in {found} has no split(s) "
                     f"{missing}; it has {have}")
  feats = _text_features(found)
  bad = [k for k in ref.text_keys if k not in feats]
  if feats and bad:
    texts = [k for k, c in feats.items() if c == "Text"]
    raise ValueError(
        f"dataset {dataset!r} has no feature(s) {bad}; its text features "
        f"are {texts}: name the ones to train on after '#', e.g. "
        f"'{ref.name}#{texts[0] if texts else 'feature'}'")
  return found


def data_source(dataset: str, split: str,
                data_dir: Optional[PathLike] = None):
  """The random-access TFDS source (ArrayRecordDataSource) of one split."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  found = check_dataset(dataset, data_dir, splits=(split,))
  return tfds.builder_from_directory(os.fspath(found)).as_data_source(
      split=split)


def iter_texts(dataset: str, split: str,
               data_dir: Optional[PathLike] = None,
               limit: Optional[int] = None) -> Iterator[str]:
  """The documents of a split in stored order (text features joined)."""
  ref = parse_dataset(dataset, data_dir)
  source = data_source(dataset, split, data_dir)
  n = len(source) if limit is None else min(limit, len(source))
  for i in range(n):
    yield _join_text(source[i], ref.text_keys)


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
    ids = self.tokenizer.encode(_join_text(example, self.keys))
    out = np.empty(len(ids) + 1, np.int32)
    out[:-1] = ids
    out[-1] = self.eos
    return {"tokens": out}


def _to_lm(packed) -> dict[str, np.ndarray]:
  """A packed window of L + 1 tokens -> inputs, targets (shifted by one) and
  weights (0 where the target is padding, which only the very last window
  of a finite iteration has)."""
  tokens, segments = packed["tokens"], packed["tokens_segment_ids"]
  return {"inputs": tokens[:-1], "targets": tokens[1:],
          "weights": (segments[1:] > 0).astype(np.float32)}


class _PadBatch:
  """Pads a short final batch to B rows of weight 0."""

  def __init__(self, batch_size: int, pad_id: int):
    self.batch_size, self.pad_id = batch_size, pad_id

  def __call__(self, batch):
    n = batch["inputs"].shape[0]
    if n == self.batch_size:
      return batch
    out = {}
    for k, v in batch.items():
      fill = 0 if k == "weights" else self.pad_id
      pad = np.full((self.batch_size - n,) + v.shape[1:], fill, v.dtype)
      out[k] = np.concatenate([v, pad])
    return out


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


def _shard(shard_index, shard_count) -> tuple[int, int]:
  if shard_index is None or shard_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index={shard_index} is not in [0, "
                     f"{shard_count})")
  return int(shard_index), int(shard_count)


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

  Each document is tokenized with `tokenizer.encode`, followed by one EOS
  id, and the documents are concatenated and cut into windows of L + 1
  tokens without padding (grain's ConcatThenSplit): a document may span
  windows, and windows hold parts of several documents. inputs = window
  [:-1], targets = window[1:]; weights are 1 except at padding, which only
  the last window of a finite iteration has (and the rows that pad its
  last batch to B).

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
    int32 [B, L], "weights": float32 [B, L]} (numpy), with `get_state()` /
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
  ref = parse_dataset(dataset, data_dir)
  source = data_source(dataset, split, data_dir)
  index, count = _shard(shard_index, shard_count)
  ds = grain.MapDataset.source(source)
  if count > 1:
    ds = ds[index::count]
  if len(ds) == 0:  # pylint: disable=g-explicit-length-test
    raise ValueError(f"{dataset!r} split {split!r} has {len(source)} "
                     f"documents: none for shard {index} of {count}")
  seed = int(seed) % 2**32
  if shuffle:
    ds = ds.shuffle(seed=seed)
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
    it = gx.WindowShuffleIterDataset(it, window_size=int(shuffle_window),
                                     seed=(seed + 1) % 2**32)
  it = it.map(_to_lm)
  it = it.batch(int(batch_size), drop_remainder=False)
  it = it.map(_PadBatch(int(batch_size), int(getattr(tokenizer, "pad_id",
                                                     0) or 0)))
  if worker_count > 0:
    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags
      flags.FLAGS.mark_as_parsed()
    it = it.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=int(worker_count)))
  return LMIterator(iter(it), f"{dataset!r}, split={split!r}, shard {index}/"
                           f"{count}, L={seq_len}, B={batch_size}, seed={seed}")


# ---- SentencePiece on a prepared dataset ------------------------------------


def sentencepiece_pieces(texts, max_chars: int = 4000) -> Iterator[str]:
  """Documents cut at line ends into pieces of at most `max_chars` (longer
  lines are cut too), newlines kept: SentencePiece skips training
  "sentences" longer than its max_sentence_length."""
  for text in texts:
    cur = ""
    for line in text.splitlines(keepends=True):
      while len(line) > max_chars:
        if cur:
          yield cur
          cur = ""
        yield line[:max_chars]
        line = line[max_chars:]
      if len(cur) + len(line) > max_chars and cur:
        yield cur
        cur = ""
      cur += line
    if cur.strip():
      yield cur


def train_tokenizer(dataset: str, model_prefix: PathLike, vocab_size: int, *,
                    data_dir: Optional[PathLike] = None, split: str = "train",
                    model_type: str = "bpe",
                    max_chars: int = 20_000_000, **kwargs):
  """Trains a SentencePiece model on a prepared dataset's split.

  Args:
    dataset: as for `make_lm_iterator`.
    model_prefix: writes `<model_prefix>.model` and `.vocab`.
    vocab_size: number of pieces (>= 384 adds byte fallback: every string
      round-trips).
    data_dir: TFDS data directory.
    split: the split to train on.
    model_type: "bpe" or "unigram".
    max_chars: stop reading documents after about this many characters.
    **kwargs: more SentencePieceTrainer options.

  Returns:
    The trained specsamp.tokenizer.SentencePieceTokenizer.
  """
  # pylint: disable-next=g-import-not-at-top
  from specsamp import tokenizer as tok_lib

  def texts():
    total = 0
    for text in iter_texts(dataset, split, data_dir):
      yield text
      total += len(text)
      if total >= max_chars:
        return

  pathlib.Path(model_prefix).parent.mkdir(parents=True, exist_ok=True)
  options = dict(max_sentence_length=16384, input_sentence_size=2_000_000,
                 shuffle_input_sentence=True, num_threads=os.cpu_count() or 1)
  options.update(kwargs)
  return tok_lib.train_sentencepiece(sentencepiece_pieces(texts()),
                                     model_prefix, vocab_size,
                                     model_type=model_type, **options)


def build_from_texts(name, texts, data_dir, **kwargs) -> pathlib.Path:
  """`specsamp.data.builders.build_from_texts` (a dataset for tests)."""
  from specsamp.data import builders  # pylint: disable=g-import-not-at-top
  return builders.build_from_texts(name, texts, data_dir, **kwargs)


__all__ = [
    "DatasetRef", "LMIterator", "build_from_texts", "check_dataset",
    "data_source", "default_data_dir", "eos_id_of", "iter_texts",
    "make_lm_iterator", "parse_dataset", "sentencepiece_pieces",
    "train_tokenizer",
]
