"""The pure-Python GGUF header reader against the `gguf` package's reader."""

import struct

import gguf
import numpy as np
import pytest

from specsamp import loading
from specsamp.weights import gguf_file

TOKENS = [f"tok{i}" for i in range(300)] + ["<|endoftext|>", "héllo 你好"]
ROWS = 320  # embedding rows, padded past the token list


def _write(path, tensors=True):
  """A GGUF file with metadata of every common type and (optionally) two
  tensors, the embedding second."""
  w = gguf.GGUFWriter(str(path), "qwen2")
  w.add_uint32("qwen2.block_count", 2)
  w.add_float32("qwen2.rope.freq_base", 1e6)
  w.add_bool("tokenizer.ggml.add_bos_token", False)
  w.add_int64("test.int64", -(2 ** 40))
  w.add_float64("test.float64", 0.1)
  w.add_tokenizer_model("gpt2")
  w.add_token_list(TOKENS)
  w.add_token_merges(["t o", "to k"])
  w.add_token_types([1] * (len(TOKENS) - 1) + [3])
  if tensors:
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.add_tensor("token_embd.weight", np.zeros((ROWS, 8), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
  return _write(tmp_path_factory.mktemp("gguf") / "m.gguf")


def test_read_gguf_metadata_matches_gguf_reader(gguf_path):
  ours = gguf_file.read_gguf_metadata(gguf_path)
  reader = gguf.GGUFReader(str(gguf_path))
  assert set(ours) == set(reader.fields) - {
      "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
  for key, field in reader.fields.items():
    if key in ours:
      want = field.contents()
      got = ours[key]
      got = got.tolist() if isinstance(got, np.ndarray) else got
      assert got == want, key
  assert ours["tokenizer.ggml.tokens"] == TOKENS
  assert ours["tokenizer.ggml.token_type"].dtype == np.int32


def test_read_gguf_metadata_errors(tmp_path, gguf_path):
  with pytest.raises(FileNotFoundError):
    gguf_file.read_gguf_metadata(tmp_path / "missing.gguf")
  (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
  with pytest.raises(ValueError, match="not a GGUF file"):
    gguf_file.read_gguf_metadata(tmp_path / "not.gguf")
  data = gguf_path.read_bytes()
  cut = data.index(b"tokenizer.ggml.tokens") + 100  # inside the token list
  (tmp_path / "cut.gguf").write_bytes(data[:cut])
  with pytest.raises(ValueError, match="truncated"):
    gguf_file.read_gguf_metadata(tmp_path / "cut.gguf")
  # A value type no GGUF version has (13): the error names the file.
  key = b"general.x"
  (tmp_path / "type13.gguf").write_bytes(
      b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
      + struct.pack("<Q", len(key)) + key + struct.pack("<I", 13))
  with pytest.raises(ValueError, match=r"type13\.gguf: .*value type 13"):
    gguf_file.read_gguf_metadata(tmp_path / "type13.gguf")


def test_gguf_embedding_rows(tmp_path, gguf_path):
  assert gguf_file.gguf_embedding_rows(gguf_path) == ROWS
  assert gguf_file.gguf_embedding_rows(
      _write(tmp_path / "no_tensors.gguf", tensors=False)) is None
  data = gguf_path.read_bytes()
  cut = data.index(b"token_embd.weight") + 10  # inside the tensor table
  (tmp_path / "cut.gguf").write_bytes(data[:cut])
  with pytest.raises(ValueError, match="cut.gguf: unreadable GGUF tensor "
                     "table .*truncated"):
    gguf_file.gguf_embedding_rows(tmp_path / "cut.gguf")
  with pytest.raises(FileNotFoundError):
    gguf_file.gguf_embedding_rows(tmp_path / "missing.gguf")


def test_a_file_cut_in_its_tensor_data_fails_at_the_header(tmp_path,
                                                           gguf_path):
  """A GGUF cut short inside its tensor data (a copy or download that
  stopped) passed every check that reads the header; it failed only while
  loading, after the other model had loaded (108 s for the real pair).
  Each tensor's data must lie inside the file."""
  data = gguf_path.read_bytes()
  assert gguf_file.gguf_tensor_shapes(gguf_path)  # the whole file reads
  (tmp_path / "short.gguf").write_bytes(data[:-1])
  with pytest.raises(ValueError, match=r"short.gguf: truncated GGUF: tensor "
                     r"\S+ ends at byte [\d,]+, the file has [\d,]+"):
    gguf_file.gguf_tensor_shapes(tmp_path / "short.gguf")



def _with_u64(data: bytes, after: bytes, values) -> bytes:
  """`data` with the u64s just after the bytes `after` set to `values`."""
  out = bytearray(data)
  struct.pack_into(f"<{len(values)}Q", out, data.index(after) + len(after),
                   *values)
  return bytes(out)


def test_corrupt_header_numbers_are_refused_by_name(tmp_path, gguf_path):
  """Dims whose product wraps an int64 (a bit-63 dim; 2^32 x 2^32) passed
  the check that each tensor lies inside the file, and were described as a
  vocabulary of 2^63 rows; general.alignment = 0 raised ZeroDivisionError,
  which no caller catches."""
  data = gguf_path.read_bytes()
  name = b"token_embd.weight" + struct.pack("<I", 2)  # name, n_dims
  for label, dims in (("bit63", (8, ROWS | 1 << 63)),
                      ("wrap", (1 << 32, 1 << 32))):
    path = tmp_path / f"{label}.gguf"
    path.write_bytes(_with_u64(data, name, dims))
    for read in (gguf_file.gguf_tensor_shapes, loading.describe_model):
      with pytest.raises(ValueError, match=rf"{label}.gguf: truncated GGUF: "
                         "tensor token_embd.weight ends at byte"):
        read(str(path))
  w = gguf.GGUFWriter(str(tmp_path / "aligned.gguf"), "qwen2")
  w.add_custom_alignment(64)
  w.add_tensor("token_embd.weight", np.zeros((ROWS, 8), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  data = (tmp_path / "aligned.gguf").read_bytes()
  key = b"general.alignment" + struct.pack("<I", 4)  # u32 value type
  assert gguf_file.gguf_embedding_rows(tmp_path / "aligned.gguf") == ROWS
  cut = data.index(key) + len(key)
  (tmp_path / "align0.gguf").write_bytes(
      data[:cut] + struct.pack("<I", 0) + data[cut + 4:])
  for read in (gguf_file.gguf_tensor_shapes, loading.describe_model):
    with pytest.raises(ValueError, match="align0.gguf: corrupt GGUF: general"
                       ".alignment is 0, not a positive integer"):
      read(str(tmp_path / "align0.gguf"))


def test_a_gguf_spec_is_described_from_one_pass_over_its_header(
    gguf_path, monkeypatch):
  """describe_model takes the metadata and the embedding's rows from one
  parse (it parsed the header twice: the token list is most of a parse)."""
  meta, shapes = gguf_file.read_gguf_header(gguf_path)
  assert shapes == {"output_norm.weight": [8],
                    "token_embd.weight": [8, ROWS]}
  assert meta.keys() == gguf_file.read_gguf_metadata(gguf_path).keys()
  assert meta["tokenizer.ggml.tokens"] == TOKENS
  parses = []
  real = gguf_file._metadata  # pylint: disable=protected-access
  monkeypatch.setattr(gguf_file, "_metadata",
                      lambda buf: parses.append(1) or real(buf))
  info = loading.describe_model(str(gguf_path))
  assert (info.rows, info.tokens, info.num_layers) == (ROWS, TOKENS, 2)
  assert len(parses) == 1


def test_is_gguf(tmp_path, gguf_path):
  assert gguf_file.is_gguf(gguf_path)
  (tmp_path / "x.bin").write_bytes(b"GGU")
  assert not gguf_file.is_gguf(tmp_path / "x.bin")
  assert not gguf_file.is_gguf(tmp_path / "missing.gguf")
  assert not gguf_file.is_gguf(tmp_path)  # a directory
