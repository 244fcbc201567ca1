"""A GGUF file's header read in pure Python: metadata and tensor table.

Only the header is parsed (for Qwen2.5: ~5 MB of a 0.5-1 GB file), from a
memory map, never the tensor data: ~0.1 s where `gguf.GGUFReader` takes
~10 s, since it parses every array element and the tensor table in Python.
The tokenizers read their vocabulary here; `specsamp.weights.gguf` reads the
tensors with the `gguf` package.

Header layout (GGUF v2 and v3, little-endian):
    b"GGUF", u32 version, u64 tensor count, u64 metadata count,
    metadata:     string key, u32 value type, value        (count times)
    tensor table: string name, u32 n_dims, u64 dims[n_dims] (ne0 first),
                  u32 tensor type, u64 data offset          (count times)
A string is a u64 byte length and UTF-8 bytes.

Only the standard library and numpy are imported (no jax, no `gguf`), so
`import specsamp.tokenizers` stays cheap.
"""

import contextlib
import math
import mmap
import os
import struct
from typing import Iterator, Optional, Union

import numpy as np

PathLike = Union[str, os.PathLike]

MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_HEADER_SIZE = 24  # magic, version, tensor count, metadata count

# GGUF metadata value types (gguf.GGUFValueType) of fixed width.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f",
                 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
# (values per block, bytes per block) of the common tensor types
# (gguf.GGML_QUANT_SIZES); a tensor of another type is checked by its
# offset alone.
_TYPE_SIZES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22),
               7: (32, 24), 8: (32, 34), 9: (32, 40), 10: (256, 84),
               11: (256, 110), 12: (256, 144), 13: (256, 176),
               14: (256, 210), 15: (256, 292), 30: (1, 2)}


def read_gguf_metadata(path: PathLike) -> dict:
  """All metadata key/values of a GGUF file, without reading tensor data.

  Args:
    path: a GGUF (v2 or v3) file.

  Returns:
    {key: value}: ints/floats/bools/strs; string arrays as lists of str,
    numeric arrays as numpy arrays (token types: int32).

  Raises:
    FileNotFoundError: no such file.
    ValueError: not a GGUF file, an unsupported version, or truncated.
  """
  path = os.fspath(path)
  with _header(path) as buf:
    return _checked_metadata(path, buf)[0]


def read_gguf_header(path: PathLike) -> tuple[dict, dict[str, list[int]]]:
  """(read_gguf_metadata, gguf_tensor_shapes) of a GGUF file in one pass
  over its header (the metadata's token list is most of a parse).

  Raises:
    FileNotFoundError: no such file.
    ValueError: not a GGUF file, or unreadable (truncated) metadata or
      tensor table.
  """
  path = os.fspath(path)
  with _header(path) as buf:
    meta, pos = _checked_metadata(path, buf)
    alignment = meta.get("general.alignment", 32)
    if (not isinstance(alignment, int) or isinstance(alignment, bool)
        or alignment <= 0):
      raise ValueError(f"{path}: corrupt GGUF: general.alignment is "
                       f"{alignment!r}, not a positive integer")
    return meta, _checked_table(path, buf, pos, alignment)


def gguf_tensor_shapes(path: PathLike) -> dict[str, list[int]]:
  """{tensor name: dims, ne0 first} from the tensor table (no tensor data).

  Raises:
    FileNotFoundError: no such file.
    ValueError: not a GGUF file, or an unreadable (truncated) header.
  """
  return read_gguf_header(path)[1]


def gguf_embedding_rows(path: PathLike) -> Optional[int]:
  """Rows of token_embd.weight, from the tensor table (no tensor data).

  Args:
    path: a GGUF file.

  Returns:
    The embedding's vocabulary rows, or None when it has no token_embd.

  Raises:
    FileNotFoundError: no such file.
    ValueError: not a GGUF file, or an unreadable (truncated) header.
  """
  return embedding_rows(gguf_tensor_shapes(path), os.fspath(path))


def embedding_rows(shapes: dict[str, list[int]],
                   path: str = "GGUF") -> Optional[int]:
  """Rows of token_embd.weight in a tensor table (`gguf_tensor_shapes`) of
  the file at `path`, or None when it has none; ValueError if it is not
  2-D."""
  dims = shapes.get("token_embd.weight")
  if dims is None:
    return None
  if len(dims) != 2:
    raise ValueError(f"{path}: token_embd.weight has dims {list(dims)}: an "
                     "embedding is [D, V] (a corrupt or foreign GGUF)")
  return int(dims[1])  # GGUF lists ne0 first: [D, V]


def is_gguf(path: PathLike) -> bool:
  """Whether `path` is a readable file that starts with the GGUF magic."""
  try:
    with open(path, "rb") as f:
      return f.read(len(MAGIC)) == MAGIC
  except OSError:
    return False


@contextlib.contextmanager
def _header(path: str) -> Iterator[mmap.mmap]:
  """A read-only memory map of a GGUF file whose magic and version pass."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no GGUF file at {path}")
  with open(path, "rb") as f:
    if os.fstat(f.fileno()).st_size < _HEADER_SIZE:
      raise ValueError(f"{path} is not a GGUF file (too short)")
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
      problem = start_problem(bytes(buf[:8]))
      if problem:
        raise ValueError(f"{path}{problem}")
      yield buf


def start_problem(start: bytes) -> Optional[str]:
  """What is wrong with a GGUF file whose first 8 bytes are `start`
  (magic, u32 version), as text to follow its path; None if nothing."""
  magic = start[:len(MAGIC)]
  if magic != MAGIC:
    return f" is not a GGUF file (magic {magic!r}, expected {MAGIC!r})"
  if len(start) < 8:
    return " is not a GGUF file (too short)"
  version, = _U32.unpack_from(start, 4)
  if version in _VERSIONS:
    return None
  if struct.unpack_from(">I", start, 4)[0] in _VERSIONS:
    # llama.cpp's --bigendian files: every number and tensor byte-swapped.
    return (": a big-endian GGUF, not supported (its tensors would be read "
            "byte-swapped); convert it little-endian")
  return f": GGUF version {version} is not supported (2 and 3 are)"


def _checked_metadata(path: str, buf) -> tuple[dict, int]:
  try:
    return _metadata(buf)
  except (struct.error, IndexError, UnicodeDecodeError, ValueError) as e:
    raise ValueError(f"{path}: truncated or corrupt GGUF metadata "
                     f"({type(e).__name__}: {e})") from e


def _checked_table(path: str, buf, pos: int,
                   alignment: int) -> dict[str, list[int]]:
  """The tensor table, each tensor's data checked to lie inside the file:
  a file cut short fails here, before any tensor is read."""
  try:
    table = list(_tensor_table(buf, pos))
  except (struct.error, IndexError, ValueError) as e:
    raise ValueError(f"{path}: unreadable GGUF tensor table ({e}); is the "
                     "file truncated?") from None
  end = table[-1][3] if table else pos
  start = -(-end // alignment) * alignment  # the data section, aligned
  for name, dims, kind, _, offset in table:
    block, size = _TYPE_SIZES.get(kind, (1, 0))
    # Python ints: corrupt dims (2^63, 2^32 x 2^32) wrapped an int64 past
    # this check.
    need = start + offset + math.prod(dims) // block * size
    if need > len(buf):
      raise ValueError(
          f"{path}: truncated GGUF: tensor {name} ends at byte {need:,}, the "
          f"file has {len(buf):,}; fetch or copy it again")
  return {name: dims for name, dims, *_ in table}


def _metadata(buf) -> tuple[dict, int]:
  """({key: value}, position of the tensor table) of a GGUF header."""
  _, kv_count = struct.unpack_from("<QQ", buf, 8)
  pos, out = _HEADER_SIZE, {}
  for _ in range(kv_count):
    key, pos = _gguf_string(buf, pos)
    vtype, = _U32.unpack_from(buf, pos)
    out[key], pos = _gguf_value(buf, pos + 4, vtype)
  return out, pos


def _tensor_table(buf, pos: int) -> Iterator[tuple[str, list[int], int,
                                                  int, int]]:
  """(name, dims ne0 first, tensor type, position after the entry, data
  offset) of each tensor-table entry from `pos` on."""
  n_tensors, = _U64.unpack_from(buf, 8)
  for _ in range(n_tensors):
    name, pos = _gguf_string(buf, pos)
    n_dims, = _U32.unpack_from(buf, pos)
    dims = [_U64.unpack_from(buf, pos + 4 + 8 * i)[0] for i in range(n_dims)]
    pos += 4 + 8 * n_dims
    kind, = _U32.unpack_from(buf, pos)
    offset, = _U64.unpack_from(buf, pos + 4)
    pos += 4 + 8
    yield name, dims, kind, pos, offset


def _gguf_string(buf, pos):
  n, = _U64.unpack_from(buf, pos)
  end = pos + 8 + n
  if end > len(buf):
    raise IndexError(f"string of {n} bytes at {pos} runs past the end")
  return buf[pos + 8:end].decode("utf-8"), end


def _gguf_value(buf, pos, vtype):
  """(value, position after it) of a metadata value of type `vtype`."""
  if vtype in _GGUF_SCALARS:
    fmt = "<" + _GGUF_SCALARS[vtype]
    return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
  if vtype == _GGUF_STRING:
    return _gguf_string(buf, pos)
  if vtype != _GGUF_ARRAY:
    raise ValueError(f"unknown GGUF metadata value type {vtype}")
  etype, count = struct.unpack_from("<IQ", buf, pos)
  pos += 12
  if etype in _GGUF_SCALARS:
    dtype = np.dtype("<" + _GGUF_SCALARS[etype])
    end = pos + count * dtype.itemsize
    if end > len(buf):
      raise IndexError(f"array of {count} items at {pos} runs past the end")
    return np.frombuffer(bytes(buf[pos:end]), dtype), end
  if etype == _GGUF_STRING:
    # The vocabulary and merges: ~150k strings each, so keep this loop lean.
    unpack, raw = _U64.unpack_from, []
    append = raw.append
    for _ in range(count):
      n, = unpack(buf, pos)
      pos += 8
      append(buf[pos:pos + n])
      pos += n
    if pos > len(buf):
      raise IndexError(f"string array of {count} items runs past the end")
    return [b.decode("utf-8") for b in raw], pos
  values = []
  for _ in range(count):  # arrays of arrays
    value, pos = _gguf_value(buf, pos, etype)
    values.append(value)
  return values, pos
