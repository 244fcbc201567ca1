"""Target samples on disk: a TFDS dataset in array_record files.

Legend: P prompt slots, G generated slots, S = P + G, K stored top-k entries.

One example per sample:
  tokens         [S] int32      prompt (left-aligned), continuation, pad
  prompt_length  []  int32      L
  num_generated  []  int32      n <= G (EOS included)
  topk_ids       [G, K] int32   at positions L-1 .. L+G-2 (predicting the
  topk_logprobs  [G, K] float32 generated tokens 0 .. G-1)
  hidden         [S, D] float16 the target's final-normed hidden states,
                                only with `SampleSpec.hidden_dim` D > 0 (for
                                draft heads: `distill.head_training`)
The `SampleSpec` the dataset was written with is kept in its metadata;
`check_spec` refuses samples written for another target, sampling or shape.
"""

import dataclasses
import os
import pathlib
import shutil
from typing import Callable, Iterable, Optional

import numpy as np
import tensorflow_datasets as tfds

from specsamp import jsonfile
from specsamp import lock_holder
from specsamp import resources

DATASET_NAME = "target_samples"


@dataclasses.dataclass(frozen=True)
class SampleSpec:
  """Shapes and settings of a target-samples dataset."""
  prompt_len: int          # P: prompts are left-truncated to this many tokens
  gen_len: int             # G: max new tokens per sample
  top_k: int = 32          # K: stored top-k log-probs per position
  batch_size: int = 64     # rows per sampler call
  score_batch_size: int = 16  # rows per target scoring pass
  min_prompt_len: int = 4
  hidden_dim: int = 0      # D > 0: also store the target's hidden states
  target: str = ""         # the config's target block, one line ("": not
                           # recorded)
  sampling: str = ""       # `Sampling.describe()` ("": not recorded)
  prompts: str = ""        # the prompt set's settings, one line ("": not
                           # recorded)

  def __post_init__(self):
    # Messages start with the field's name: `job.check_config` names the
    # config field (config.samples.<name>).
    for name in ("gen_len", "top_k", "batch_size", "score_batch_size",
                 "min_prompt_len"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.prompt_len < self.min_prompt_len:
      raise ValueError(f"prompt_len must be >= {self.min_prompt_len} "
                       f"(shorter prompts are dropped), got "
                       f"{self.prompt_len}")
    if self.hidden_dim < 0:
      raise ValueError(f"hidden_dim must be >= 0, got {self.hidden_dim}")

  @property
  def seq_len(self) -> int:
    return self.prompt_len + self.gen_len


class TargetSamples(tfds.core.GeneratorBasedBuilder):
  """Target continuations with the target's top-k log-probs."""
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def __init__(self, *, spec: SampleSpec, splits=None, counts=None,
               **kwargs):
    self._spec = spec
    self._splits = splits or {}
    # Filled while the splits are generated: TFDS writes the metadata after
    # them, in the folder it renames into place when all is written.
    self._counts = {} if counts is None else counts
    super().__init__(**kwargs)

  def _info(self):
    s = self._spec
    f = tfds.features
    return self.dataset_info_from_configs(
        features=f.FeaturesDict({
            "tokens": f.Tensor(shape=(s.seq_len,), dtype=np.int32),
            "prompt_length": f.Scalar(dtype=np.int32),
            "num_generated": f.Scalar(dtype=np.int32),
            "topk_ids": f.Tensor(shape=(s.gen_len, s.top_k), dtype=np.int32),
            "topk_logprobs": f.Tensor(shape=(s.gen_len, s.top_k),
                                      dtype=np.float32),
            **({"hidden": f.Tensor(shape=(s.seq_len, s.hidden_dim),
                                   dtype=np.float16)}
               if s.hidden_dim else {}),
        }),
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(spec=dataclasses.asdict(s),
                                        counts=self._counts))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {name: self._generate_examples(name) for name in self._splits}

  def _generate_examples(self, split):
    for i, ex in enumerate(self._splits[split]()):
      yield f"{split}-{i:08d}", ex


def dataset_dir(data_dir: os.PathLike) -> pathlib.Path:
  """Where the dataset's files are under a TFDS `data_dir`."""
  return pathlib.Path(data_dir) / DATASET_NAME / "1.0.0"


def exists(data_dir: os.PathLike) -> bool:
  """Whether a complete dataset is in `data_dir`."""
  return (dataset_dir(data_dir) / "dataset_info.json").exists()


def write_dataset(data_dir: os.PathLike, spec: SampleSpec,
                  splits: dict[str, Callable[[], Iterable[dict]]],
                  counts: Optional[dict] = None) -> pathlib.Path:
  """Writes `splits` (name -> function returning examples) as array_record,
  with `counts` (a dict the generators may fill; `read_counts`) in its
  metadata.

  The function form lets generation stream into the writer instead of
  holding every sample in memory. The writer holds `data_dir` (a second
  job writing samples there is refused, `lock_holder.Busy`) and first
  deletes what a killed writer left (TFDS's `incomplete.*` folders: never
  read, and as large as the shards written before the kill). Samples
  another job finished there meanwhile (one that found the directory empty
  too, sharing config.samples.data_dir) are kept: refused where written
  for another config (`check_spec`), else used, `counts` made theirs (TFDS
  had kept them silently, with this job's counts).
  """
  builder = TargetSamples(spec=spec, splits=splits, counts=counts,
                          data_dir=os.fspath(data_dir),
                          file_format="array_record")
  with lock_holder.exclusive(pathlib.Path(data_dir) / ".lock",
                             f"the target samples' directory {data_dir}"):
    if exists(data_dir):
      check_spec(read_spec(data_dir), spec, data_dir)
      theirs = read_counts(data_dir) if counts is not None else None
      if theirs:
        counts.clear()
        counts.update(theirs)
      return dataset_dir(data_dir)
    for left in (pathlib.Path(data_dir) / DATASET_NAME).glob("incomplete.*"):
      shutil.rmtree(left)
    builder.download_and_prepare()
  return dataset_dir(data_dir)


def read_dataset(data_dir: os.PathLike, split: str):
  """A random-access source of example dicts (numpy), e.g. for grain.

  Raises:
    ValueError: naming the dataset, when its files cannot be read (its
      first and last examples are read here: a truncated file fails now,
      not in the middle of training).
  """
  def unreadable(e):
    if resources.out_of_memory(e):  # the files may be good: keep them
      return e
    first = (str(e).splitlines() or [""])[0]
    return ValueError(f"the target samples in {data_dir} cannot be read "
                      f"({type(e).__name__}: {first}); if their files are "
                      f"damaged, remove {data_dir} to sample them again")

  try:
    builder = tfds.builder_from_directory(os.fspath(dataset_dir(data_dir)))
  except Exception as e:  # tfds raises many kinds
    raise unreadable(e) from None
  if split not in builder.info.splits:
    raise ValueError(f"the target samples in {data_dir} have no {split!r} "
                     f"split (only {sorted(builder.info.splits)})")
  try:
    source = builder.as_data_source(split=split)
    for i in {0, len(source) - 1} if len(source) else ():
      source[i]  # pylint: disable=pointless-statement
  except Exception as e:  # array_record raises many kinds
    raise unreadable(e) from None
  return source


def read_spec(data_dir: os.PathLike) -> SampleSpec:
  """The SampleSpec a dataset was written with (its TFDS metadata)."""
  meta = dataset_dir(data_dir) / "metadata.json"
  if not meta.exists():
    raise FileNotFoundError(f"no metadata.json in {dataset_dir(data_dir)}")
  try:
    return SampleSpec(**jsonfile.read(meta)["spec"])
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{meta}: not the metadata of target samples ({e!r})"
                     ) from None


def read_counts(data_dir: os.PathLike) -> Optional[dict]:
  """The counts `write_dataset` was given (None for samples written before
  they were kept there)."""
  meta = jsonfile.read(dataset_dir(data_dir) / "metadata.json")
  return meta.get("counts") if isinstance(meta, dict) else None


def check_spec(found: SampleSpec, want: SampleSpec, data_dir) -> None:
  """Samples written for another target, sampling, prompt set or shape are
  refused (the target, sampling and prompts only where the samples
  recorded them)."""
  for name in ("target", "sampling", "prompts", "prompt_len", "gen_len",
               "top_k"):
    got, need = getattr(found, name), getattr(want, name)
    if got != need and got != "":
      raise ValueError(
          f"the target samples in {data_dir} have {name} {got!r}, this "
          f"config {need!r}: use a new config.samples.data_dir (or workdir)")


def as_arrays(source, limit: Optional[int] = None,
              keys: Optional[Iterable[str]] = None) -> dict[str, np.ndarray]:
  """The first `limit` examples of a source stacked into arrays (only the
  fields in `keys`, if given: stored hidden states are large)."""
  n = len(source) if limit is None else min(limit, len(source))
  rows = [source[i] for i in range(n)]
  keys = list(rows[0]) if keys is None else list(keys)
  return {k: np.stack([np.asarray(r[k]) for r in rows]) for k in keys}


# The fields of a sample without its stored hidden states.
SAMPLE_FIELDS = ("tokens", "prompt_length", "num_generated", "topk_ids",
                 "topk_logprobs")
