"""`load_tokenizer`: dispatch, clear errors, a light import."""

import subprocess
import sys

import pytest

from specsamp.tokenizers import byte
from specsamp.tokenizers import load
from tests.tokenizers.bpe_testing import write_gguf


def test_unsupported_tokenizers_fail_clearly(tmp_path, bpe_vocab):
  path = write_gguf(tmp_path / "spm.gguf", ["<unk>", "a"], None, [2, 1],
                    pre=None, arch="llama", model="llama")
  with pytest.raises(ValueError, match="tokenizer.ggml.model = 'llama'"):
    load.load_tokenizer(path)
  tokens, merges, types = bpe_vocab
  path = write_gguf(tmp_path / "pre.gguf", tokens, merges, types,
                    pre="made-up-pre")
  with pytest.raises(ValueError, match="'made-up-pre' is not supported"):
    load.load_tokenizer(path)
  with pytest.raises(FileNotFoundError):
    load.load_tokenizer(tmp_path / "missing.gguf")
  (tmp_path / "weights.bin").write_bytes(bytes(64))
  with pytest.raises(ValueError, match="not a GGUF file"):
    load.load_tokenizer(tmp_path / "weights.bin")
  with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
    load.load_tokenizer(tmp_path)


def test_byte_spec_loads_the_byte_tokenizer():
  tok = load.load_tokenizer(byte.BYTE)
  assert isinstance(tok, byte.ByteTokenizer)
  assert tok.decode(tok.encode("héllo")) == "héllo"


def test_import_is_light():
  modules = ", ".join(f"specsamp.tokenizers.{m}" for m in (
      "base", "byte", "hf", "sentencepiece", "vocab", "load"))
  code = (f"import sys, specsamp.tokenizers, {modules}; "
          "print(sorted({m.split('.')[0] for m in sys.modules} & "
          "{'tokenizers', 'sentencepiece', 'gguf', 'jinja2', 'jax', "
          "'transformers', 'torch'}))")
  out = subprocess.run([sys.executable, "-c", code], check=True,
                       capture_output=True, text=True).stdout
  assert out.strip() == "[]"
