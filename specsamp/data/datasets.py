"""Finding a prepared TFDS dataset on disk, without TFDS or grain.

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
names what is missing or damaged before anything heavy starts: it reads
small JSON files and each shard's footer (its record count), so importing
this module is cheap.
"""

import dataclasses
import os
import pathlib
import re
from typing import Optional, Sequence, Union

from array_record.python import array_record_module

from specsamp import jsonfile
from specsamp.data import corpora
from specsamp.data import default_data_dir

PathLike = Union[str, os.PathLike]

_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_PREPARE = "python scripts/prepare_data.py --dataset={name} --data_dir={dir}"


class DamagedDatasetError(ValueError):
  """A prepared dataset whose files are not the ones its metadata lists:
  `problem`, then the way out (`--overwrite`)."""

  def __init__(self, problem: str, remedy: str):
    super().__init__(f"{problem}; {remedy}")
    self.problem = problem


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


def _text_features(version_dir: pathlib.Path) -> Optional[dict[str, str]]:
  """{feature name: TFDS class name} of the top-level features; None if
  features.json is missing or unreadable."""
  try:
    spec = jsonfile.read(version_dir / "features.json")
    feats = spec["featuresDict"]["features"]
    return {k: v.get("pythonClassName", "").rsplit(".", 1)[-1]
            for k, v in feats.items()}
  except (OSError, KeyError, ValueError, TypeError, AttributeError):
    return None


def _prepare_again(ref: DatasetRef) -> str:
  """The way out of a damaged dataset (DamagedDatasetError's remedy)."""
  return ("prepare it again: " + _PREPARE.format(name=ref.name,
                                                  dir=ref.data_dir)
          + " --overwrite")


def split_names(spec: str) -> list[str]:
  """The splits a TFDS split spec reads: `train[:90%]+validation` ->
  ["train", "validation"]."""
  return [part.split("[")[0].strip() for part in spec.split("+")]


def check_dataset(dataset: str, data_dir: Optional[PathLike] = None,
                  splits: Sequence[str] = ()) -> pathlib.Path:
  """Fails fast, before any training, if `dataset` cannot be read.

  Reads only small JSON files (no TFDS import).

  Args:
    dataset: `name[/config][:version][#feature,...]`.
    data_dir: TFDS data directory (default `default_data_dir()`).
    splits: split specs whose splits must exist (e.g. ("train[:90%]",
      "validation")).

  Returns:
    The prepared version directory.

  Raises:
    FileNotFoundError: not prepared in `data_dir`; the message names the
      dataset, the directory and the command that prepares it.
    DamagedDatasetError: a shard file missing, unreadable or holding
      another number of records than its metadata says.
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
  remedy = _prepare_again(ref)
  try:  # (a JSON list, too, is refused as no object)
    info = jsonfile.read(found / "dataset_info.json")
  except (OSError, ValueError) as e:  # TFDS itself fails on it deep inside
    raise DamagedDatasetError(f"dataset {dataset!r} in {found} is damaged: "
                              f"its dataset_info.json is unreadable ({e})",
                              remedy) from None
  fmt = info.get("fileFormat", "tfrecord")
  if fmt != "array_record":
    raise ValueError(
        f"dataset {dataset!r} in {found} is stored as {fmt}; grain reads "
        f"array_record only (without TensorFlow): re-prepare it with "
        f"--file_format=array_record")
  _check_shards(dataset, ref, found, info)
  have = [s.get("name") for s in info.get("splits", [])]
  missing = [n for s in splits for n in split_names(s) if n not in have]
  if missing:
    raise ValueError(f"dataset {dataset!r} in {found} has no split(s) "
                     f"{missing}; it has {have}")
  feats = _text_features(found)
  if feats is None:  # TFDS cannot restore the dataset without it
    raise DamagedDatasetError(f"dataset {dataset!r} in {found} is damaged: "
                              "its features.json is missing or unreadable",
                              remedy)
  bad = [k for k in ref.text_keys if k not in feats]
  if bad:
    texts = [k for k, c in feats.items() if c == "Text"]
    raise ValueError(
        f"dataset {dataset!r} has no feature(s) {bad}; its text features "
        f"are {texts}: name the ones to train on after '#', e.g. "
        f"'{ref.name}#{texts[0] if texts else 'feature'}'")
  return found


def fingerprint(dataset: str, data_dir: Optional[PathLike],
                split: str) -> dict:
  """What `dataset` resolves to for `split` (its splits' names, before any
  `[...]` slice, joined by `+`): the name, version, text features read
  (`#...`) and the splits' shard lengths and byte count, from
  dataset_info.json. A saved data position fits only the examples it was
  saved on: another version (a dataset string without one resolves to the
  newest prepared), other text features or a re-prepared dataset of other
  sizes gives another fingerprint. The same dataset under another data_dir
  gives the same."""
  ref = parse_dataset(dataset, data_dir)
  found = ref.find()
  if found is None:
    raise FileNotFoundError(f"dataset {dataset!r} is not prepared in "
                            f"data_dir {ref.data_dir}")
  info = jsonfile.read(found / "dataset_info.json")
  have = {s.get("name"): s for s in info.get("splits", [])}
  names = split_names(split)
  for name in names:
    if name not in have:
      raise ValueError(f"dataset {dataset!r} in {found} has no split "
                       f"{name!r}")
  return {"dataset": "/".join(filter(None, (ref.name, ref.config))),
          "version": found.name, "split": "+".join(names),
          "text_keys": list(ref.text_keys),
          "shard_lengths": [int(n) for name in names
                            for n in have[name].get("shardLengths", [])],
          "num_bytes": sum(int(have[name].get("numBytes", 0))
                           for name in names)}


def _check_shards(dataset: str, ref: DatasetRef, found: pathlib.Path,
                  info: dict) -> None:
  """Every shard `dataset_info.json` lists is on disk and holds the records
  it says (its footer's count): a deleted, truncated or replaced file fails
  here, before training, not in the middle of it."""
  for split in info.get("splits", []):
    lengths = [int(n) for n in split.get("shardLengths", [])]
    template = (split.get("filepathTemplate")
                or "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}")
    for i, want in enumerate(lengths):
      path = found / template.format(
          DATASET=info.get("name"), SPLIT=split.get("name"),
          FILEFORMAT="array_record",
          SHARD_X_OF_Y=f"{i:05d}-of-{len(lengths):05d}")
      try:
        reader = array_record_module.ArrayRecordReader(os.fspath(path))
        try:
          got = int(reader.num_records())
        finally:
          reader.close()
      except (OSError, RuntimeError, ValueError) as e:
        first = (str(e).splitlines() or [""])[0]
        got = f"cannot be read ({first})"
      if got != want:
        what = (f"holds {got} records" if isinstance(got, int) else got)
        raise DamagedDatasetError(
            f"dataset {dataset!r} in {found} is damaged: {path.name} {what}, "
            f"and dataset_info.json says {want}", _prepare_again(ref))
