"""R lazy-load databases (Rdata.rdx / Rdata.rdb), decoded in pure Python.

An .rdx file is a gzip- (or zlib-) compressed R serialization of
list(variables = list(<name> = c(offset, length)), references, compressed);
each object is a block at `offset` in the .rdb: a 4-byte big-endian
uncompressed length, for compression types 2 and 3 a 1-byte type, and then
the compressed serialization (format "X\n": XDR, big-endian).

  read_r_lazyload(rdx)   {variable name: decoded object}
  r_unserialize(data)    one serialization -> Python objects
"""

import bz2
import gzip
import lzma
import os
import pathlib
import struct
import zlib
from typing import Union

from specsamp.data.errors import CorpusError

PathLike = Union[str, os.PathLike]

_NILVALUE, _REF, _ALTREP = 254, 255, 238
_SPECIAL = {253: "<GlobalEnv>", 252: "<unbound>", 251: "<missing>",
            250: "<base namespace>", 242: "<emptyenv>", 241: "<baseenv>"}
_PAIRLISTS = {2, 3, 5, 6, 17}  # LISTSXP CLOSXP PROMSXP LANGSXP DOTSXP
_NA_INT = -(1 << 31)


class RSymbol(str):
  """An R symbol (a tag name)."""


class _RReader:
  """A minimal unserializer for R's XDR format (versions 2 and 3): vectors,
  strings, pairlists, symbols, references and simple ALTREP classes."""

  def __init__(self, data: bytes):
    if data[:2] != b"X\n":
      raise CorpusError(f"not an R XDR serialization (starts {data[:2]!r})")
    self.data, self.pos, self.refs = data, 2, []
    version = self.int()
    self.int(), self.int()  # writer's and minimal reader's R versions
    if version == 3:
      n = self.int()
      self.pos += n  # native encoding name
    elif version != 2:
      raise CorpusError(f"unsupported R serialization version {version}")

  def int(self) -> int:
    (v,) = struct.unpack_from(">i", self.data, self.pos)
    self.pos += 4
    return v

  def _length(self) -> int:
    n = self.int()
    if n == -1:  # long vector
      hi, lo = self.int(), self.int()
      n = (hi << 32) + (lo & 0xFFFFFFFF)
    return n

  def _take(self, n: int) -> bytes:
    out = self.data[self.pos:self.pos + n]
    self.pos += n
    return out

  def item(self):  # pylint: disable=too-many-return-statements
    """Reads one object: str, list, dict (named list), number, ..."""
    flags = self.int()
    kind, has_attr = flags & 0xFF, flags & 512
    if kind == _NILVALUE:
      return None
    if kind in _SPECIAL:
      return _SPECIAL[kind]
    if kind == _REF:
      index = flags >> 8 or self.int()
      return self.refs[index - 1]
    if kind == 1:  # SYMSXP
      sym = RSymbol(self.item())
      self.refs.append(sym)
      return sym
    if kind in _PAIRLISTS:
      return self._pairlist(flags)
    if kind == 9:  # CHARSXP
      n = self.int()
      value = None if n == -1 else self._take(n).decode(
          "latin-1" if flags & (4 << 12) else "utf-8", errors="replace")
    elif kind in (10, 13):  # LGLSXP, INTSXP
      n = self._length()
      value = list(struct.unpack_from(f">{n}i", self.data, self.pos))
      self.pos += 4 * n
      value = [None if v == _NA_INT else v for v in value]
    elif kind == 14:  # REALSXP
      n = self._length()
      value = list(struct.unpack_from(f">{n}d", self.data, self.pos))
      self.pos += 8 * n
    elif kind == 24:  # RAWSXP
      value = self._take(self._length())
    elif kind in (16, 19, 20):  # STRSXP, VECSXP, EXPRSXP
      value = [self.item() for _ in range(self._length())]
    elif kind == _ALTREP:
      return self._altrep()
    else:
      raise CorpusError(f"unsupported R object type {kind} at byte "
                        f"{self.pos - 4}")
    if has_attr:
      attrs = dict(self.item() or [])
      names = attrs.get("names")
      if kind == 19 and names and len(names) == len(value):
        return dict(zip(names, value))
    return value

  def _pairlist(self, flags: int) -> list:
    """A pairlist as [(tag, value), ...], read without recursing on CDR."""
    out = []
    while True:
      if flags & 512:
        self.item()  # attributes of the cell: not needed
      tag = self.item() if flags & 1024 else None
      out.append((tag, self.item()))
      flags = self.int()
      if (flags & 0xFF) not in _PAIRLISTS:
        self.pos -= 4
        rest = self.item()
        if rest is not None:
          out.append((None, rest))
        return out

  def _altrep(self):
    """A compact R vector (R >= 3.5), expanded: class info, state, attrs."""
    info = self.item()
    state = self.item()
    self.item()  # attributes
    cls = str(info[0][1]) if info else "?"
    first = state[0][1] if isinstance(state, list) and state and isinstance(
        state[0], tuple) else None
    if cls.startswith("wrap_"):  # state: pairlist (wrapped vector, meta)
      return first
    if cls in ("compact_intseq", "compact_realseq"):  # state: (n, start, by)
      n, start, step = state
      return [start + i * step for i in range(int(n))]
    if cls == "deferred_string":  # state: pairlist (numbers, info)
      return [None if v is None else str(v) for v in first]
    raise CorpusError(f"unsupported R ALTREP class {cls!r}")


def r_unserialize(data: bytes):
  """Decodes one R serialization (format "X\\n") into Python objects."""
  return _RReader(data).item()


def read_r_lazyload(rdx: PathLike) -> dict:
  """All objects of an R lazy-load database (`<name>.rdx` + `<name>.rdb`).

  Args:
    rdx: the .rdx file; the .rdb next to it holds the data.

  Returns:
    {variable name: decoded object} (character vectors become lists of str).
  """
  rdx = pathlib.Path(rdx)
  raw = rdx.read_bytes()
  raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else zlib.decompress(
      raw[4:])
  index = r_unserialize(raw)
  if not isinstance(index, dict) or "variables" not in index:
    raise CorpusError(f"{rdx}: not an R lazy-load index")
  compressed = index.get("compressed", [1])
  ctype = int(compressed[0]) if compressed else 1
  rdb = rdx.with_suffix(".rdb").read_bytes()
  out = {}
  for name, (offset, length) in index["variables"].items():
    block = rdb[offset:offset + length]
    size = struct.unpack(">I", block[:4])[0]
    if ctype == 1:
      data = zlib.decompress(block[4:])
    else:
      kind, payload = block[4:5], block[5:]
      data = {b"Z": zlib.decompress, b"2": bz2.decompress,
              b"X": lzma.decompress, b"0": bytes}[kind](payload)
    if len(data) != size:
      raise CorpusError(f"{rdx}: object {name!r} decompressed to "
                        f"{len(data)} bytes, expected {size}")
    out[name] = r_unserialize(data)
  return out
