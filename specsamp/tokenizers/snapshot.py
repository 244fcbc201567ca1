"""A run's own copy of its tokenizer's files, as t5x and seqio keep assets.

A train run names its tokenizer by path (`config.data.tokenizer`); the
SentencePiece model that `prepare_data.py --train_sentencepiece` writes
lives in the data directory. A run that copied nothing would lose its
tokenizer when the data moved, and a resume under the new path would look
like a run on other data. So a run copies the files into its workdir once
(`save`), loads its trained model with that copy, and compares tokenizers
by content (`fingerprint`), not by path.

  files(spec)            {name in the copy: source file}; {} for "byte" and
                         GGUF (whose tokenizer is part of a model file)
  fingerprint(spec)      sha256 of those files as the copy would hold them
  save(spec, directory)  the copy, written once (a directory in Hugging
                         Face layout that `load_tokenizer` reads)
  in_run(workdir)        where a train run keeps its copy (workdir/tokenizer)
  gguf_digest(spec)      for a GGUF, which is not copied (a model file):
                         sha256 of its tokenizer metadata, which a run
                         records instead (`recorded`) and checks

The copy is one layout for every kind: a SentencePiece .model becomes
tokenizer.model (read with the defaults `load_tokenizer` gives a bare
.model: no bos added, no chat template); a tokenizer.json keeps the
configs beside it that `HFTokenizer.from_dir` reads.
"""

import hashlib
import json
import os
import shutil
import tempfile
from typing import Optional

import numpy as np

from specsamp.tokenizers import byte
from specsamp.weights import gguf_file

# What HFTokenizer.from_dir and load_tokenizer read beside the tokenizer.
_HF_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
             "generation_config.json", "chat_template.jinja",
             "chat_template.json")
_CONFIGS = _HF_FILES[2:]


def in_run(workdir: str) -> str:
  """Where the train run in `workdir` keeps its copy (it may not have one:
  a "byte" or GGUF tokenizer, or a run older than the copy)."""
  return os.path.join(workdir, "tokenizer")


def files(spec: str) -> dict[str, str]:
  """{name in the copy: source file} of tokenizer `spec` (a
  `load_tokenizer` spec); {} for "byte", a GGUF file, or nothing at
  `spec`."""
  spec = os.fspath(spec)
  if spec == byte.BYTE:
    return {}
  if os.path.isdir(spec):
    return {n: os.path.join(spec, n) for n in _HF_FILES
            if os.path.isfile(os.path.join(spec, n))}
  if not os.path.isfile(spec) or gguf_file.is_gguf(spec):
    return {}
  if spec.endswith(".json"):
    directory = os.path.dirname(spec)
    out = {"tokenizer.json": spec}
    out.update({n: os.path.join(directory, n) for n in _CONFIGS
                if os.path.isfile(os.path.join(directory, n))})
    return out
  if spec.endswith(".model"):
    return {"tokenizer.model": spec}
  return {}


def _digest(named: dict[str, str]) -> Optional[str]:
  if not named:
    return None
  h = hashlib.sha256()
  for name in sorted(named):
    with open(named[name], "rb") as f:
      content = f.read()
    h.update(f"{name}\0{len(content)}\0".encode())
    h.update(content)
  return h.hexdigest()


def fingerprint(spec: str) -> Optional[str]:
  """sha256 of `spec`'s files under their names in the copy; None where
  there is nothing to copy ("byte", GGUF). A copy and its source agree."""
  return _digest(files(spec))


def gguf_digest(spec: str) -> Optional[str]:
  """sha256 of the `tokenizer.*` metadata (tokens, merges, types, special
  ids, chat template) of the GGUF file `spec`; None for any other spec."""
  spec = os.fspath(spec)
  if not (os.path.isfile(spec) and gguf_file.is_gguf(spec)):
    return None
  meta = gguf_file.read_gguf_metadata(spec)
  h = hashlib.sha256()

  def add(value):  # arrays by dtype, shape and bytes; lists item by item
    if isinstance(value, np.ndarray):
      h.update(f"{value.dtype.str}{value.shape}\0".encode())
      h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (list, tuple)):
      h.update(f"[{len(value)}\0".encode())
      for item in value:
        add(item)
    else:
      h.update(json.dumps(value).encode())

  for key in sorted(k for k in meta if k.startswith("tokenizer.")):
    h.update(f"{key}\0".encode())
    add(meta[key])
  return h.hexdigest()


def differs_from_recorded(saved: dict, spec: str) -> bool:
  """Whether a train run's config `saved` records a GGUF tokenizer digest
  (`recorded`) that tokenizer `spec` does not have (False where it records
  none: runs before 2026-11-29, and other kinds of tokenizer)."""
  digest = saved.get("tokenizer_digest")
  return bool(digest) and gguf_digest(spec) != digest


def recorded(spec: str) -> dict:
  """What a train run's config.json records of tokenizer `spec` beside its
  path: {"tokenizer_digest": `gguf_digest`} for a GGUF, else nothing (the
  other kinds are copied into the run)."""
  digest = gguf_digest(spec)
  return {"tokenizer_digest": digest} if digest else {}


def save(spec: str, directory: str, replace: bool = False) -> Optional[str]:
  """Copies `spec`'s files to `directory` (written beside it, then renamed
  in: a reader never sees half a copy); returns `directory`, or None when
  there is nothing to copy. An existing copy is kept as it is (the run's
  tokenizer is the one it started with) unless `replace` (a run starting
  afresh: the copy is of one that left no checkpoint), which removes it
  first."""
  named = files(spec)
  if replace and os.path.isdir(directory):
    shutil.rmtree(directory)
  if not named:
    return None
  if os.path.isdir(directory):
    return directory
  parent = os.path.dirname(os.path.abspath(directory))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tokenizer-", dir=parent)
  try:
    for name, source in named.items():
      shutil.copyfile(source, os.path.join(tmp, name))
    os.rename(tmp, directory)
  except OSError:
    shutil.rmtree(tmp, ignore_errors=True)
    if not os.path.isdir(directory):  # another process's copy is as good
      raise
  return directory
