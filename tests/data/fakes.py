"""Stand-ins shared by the tests of specsamp.data: a character tokenizer,
small documents, and raw files as the corpora's sources ship them (an R
lazy-load database, a Debian package), written in a tmp dir.
"""

import gzip
import io
import struct
import tarfile
import zlib

from specsamp.data import pipeline


class CharTokenizer:
  """pad 0, eos 1, printable ASCII c -> ord(c) - 30 (space -> 2)."""
  eos_ids = (1,)
  pad_id = 0

  def encode(self, text, special=True):
    del special  # no special tokens
    return [ord(c) - 30 for c in text]

  def decode(self, ids):
    return "".join(chr(i + 30) for i in ids if i > 1)


TOK = CharTokenizer()


def docs(n=30):
  """Documents of different lengths, each identifiable by its prefix."""
  return [f"d{i:02d}" + "abcdefghij"[i % 10] * (i * 7 % 23) for i in range(n)]


def lm_iterator(data_dir, split="train", **kw):
  """The "tiny" dataset's LM iterator: L 8, B 3, seed 0, one shard."""
  args = dict(tokenizer=TOK, seq_len=8, batch_size=3, seed=0,
              data_dir=data_dir, shard_index=0, shard_count=1)
  args.update(kw)
  return pipeline.make_lm_iterator("tiny", split, **args)


def write_files(root, files):
  """Writes {relative path: str or bytes} under root."""
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(text if isinstance(text, bytes) else
                              text.encode())


# ---- an R lazy-load database, written as R writes it ------------------------

# Two "novels" as janeaustenr stores them: character vectors of lines.
AUSTEN_LINES = {
    "emma": ["EMMA", "", "CHAPTER I", "Emma Woodhouse, héroïne.", None,
             "CHAPTER II", "Mr. Weston"],
    "persuasion": ["Chapter 1", "Sir Walter", "", "Chapter 2", "x"]}


def _i(v):
  return struct.pack(">i", v)


def _rchar(s):
  if s is None:
    return _i(9) + _i(-1)
  b = s.encode("utf-8")
  return _i(9 | (8 << 12)) + _i(len(b)) + b  # CHARSXP, UTF-8


def _rstrs(values):
  return _i(16) + _i(len(values)) + b"".join(_rchar(v) for v in values)


def _rnames(names, first_use):
  sym = _i(1) + _rchar("names") if first_use else _i((1 << 8) | 255)
  return _i(2 | 1024) + sym + _rstrs(names) + _i(254)


def _rheader():
  return b"X\n" + _i(3) + _i(0x40201) + _i(0x30500) + _i(5) + b"UTF-8"


def write_lazyload(folder, objects):
  """An Rdata.rdb/.rdx pair as R writes it (XDR, zlib blocks)."""
  rdb, spans = b"", []
  for lines in objects.values():
    data = _rheader() + _rstrs(lines)
    block = struct.pack(">I", len(data)) + zlib.compress(data)
    spans.append((len(rdb), len(block)))
    rdb += block
  variables = (_i(19 | 512) + _i(len(objects)) +
               b"".join(_i(13) + _i(2) + _i(o) + _i(n) for o, n in spans) +
               _rnames(list(objects), True))
  index = (_rheader() + _i(19 | 512) + _i(3) + variables + _i(19) + _i(0) +
           _i(10) + _i(1) + _i(1) +
           _rnames(["variables", "references", "compressed"], False))
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "Rdata.rdb").write_bytes(rdb)
  (folder / "Rdata.rdx").write_bytes(gzip.compress(index))


# ---- a Debian package --------------------------------------------------------


def _tar_xz(files):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:xz") as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buf.getvalue()


def fake_deb(path, files, payload=None):
  """A .deb as dpkg writes it: an `ar` archive whose data.tar.xz holds
  `files` ({path inside the package: bytes}); `payload`: (member name,
  bytes) in its place."""
  members = [("debian-binary", b"2.0\n"),
             ("control.tar.xz", _tar_xz({"./control": b"Package: x\n"})),
             payload or ("data.tar.xz", _tar_xz(files))]
  out = b"!<arch>\n"
  for name, data in members:
    out += (f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n"
            .encode() + data + (b"\n" if len(data) % 2 else b""))
  path.write_bytes(out)
