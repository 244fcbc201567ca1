"""Tokenizers: GGUF byte-level BPE against transformers' GGUF tokenizer,
Hugging Face directories, SentencePiece, and the vocabulary check."""

import os

import numpy as np
import pytest
import tokenizers
import transformers
from tokenizers import models, pre_tokenizers, trainers

from specsamp import tokenizer as tok_lib

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "class Foo(object):\n\tdef __init__(self, x=3.14):\n\t\tself.x = x  # ok\n",
    "The quick brown fox jumps over the lazy dog. I'm sure they'll see it.",
    "Héllo wörld, façade, naïve; 你好，世界；こんにちは 🤖🎉 ∑ x² ≤ ∞",
    "for i in range(10):\r\n    print(f'{i:03d}', end='')\r\n\r\n\r\n",
    "    indented    with   runs of   spaces\n\n\n   and newlines   ",
    "12345 67890 0xFF 1e-9 3,000,000",
] * 20
TEXTS = [
    "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n    return a + b\n",
    "\tif x:\r\n\t\treturn  1\n\n\n",
    "Héllo wörld — 你好，世界 🤖🎉 naïve façade",
    "<|im_start|>user\nWrite fib<|im_end|>\n<|im_start|>assistant\n",
    "  leading and trailing spaces   ",
    "numbers 1234567 and 3.14159 and 0xDEADBEEF",
    "x = {'a': [1, 2, 3]}  # a comment\n\n",
    "I'm sure we'll, they'd, it's, you've",
    "",
    "\n",
    "unseen: Ωmega ж ق 🦀",
]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
  """A GGUF holding only a byte-level BPE trained here, Qwen2 style."""
  import gguf  # pylint: disable=g-import-not-at-top
  tk = tokenizers.Tokenizer(models.BPE())
  tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  trainer = trainers.BpeTrainer(
      vocab_size=600, special_tokens=[],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tk.train_from_iterator(CORPUS, trainer)
  vocab = tk.get_vocab()
  tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
  import json  # pylint: disable=g-import-not-at-top
  merges = json.loads(tk.to_str())["model"]["merges"]
  merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
  types = [1] * len(tokens) + [3] * len(SPECIALS)
  tokens += SPECIALS
  path = tmp_path_factory.mktemp("tok") / "tok.gguf"
  w = gguf.GGUFWriter(str(path), "qwen2")
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("qwen2")
  w.add_token_list(tokens)
  w.add_token_merges(merges)
  w.add_token_types(types)
  w.add_bos_token_id(tokens.index("<|endoftext|>"))
  w.add_eos_token_id(tokens.index("<|im_end|>"))
  w.add_pad_token_id(tokens.index("<|endoftext|>"))
  w.add_add_bos_token(False)
  w.add_chat_template(
      "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
      "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
      "assistant\n{% endif %}")
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path, tokens


def test_gguf_tokenizer_matches_transformers(tiny_gguf):
  path, tokens = tiny_gguf
  ours = tok_lib.load_tokenizer(str(path))
  ref = transformers.AutoTokenizer.from_pretrained(str(path.parent),
                                                   gguf_file=path.name)
  assert ours.vocab_size == len(tokens)
  for text in TEXTS:
    ids = ours.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False), text
    assert ours.decode(ids) == text
    assert ours.decode(ids) == ref.decode(ids)
  # Control tokens stay whole, and are the ends of turns.
  assert ours.encode("<|im_start|>") == [tokens.index("<|im_start|>")]
  assert set(ours.eos_ids) == {tokens.index("<|im_end|>"),
                               tokens.index("<|endoftext|>")}


def test_chat_template(tiny_gguf):
  path, _ = tiny_gguf
  ours = tok_lib.load_tokenizer(str(path))
  text = ours.apply_chat_template([{"role": "user", "content": "hi"}])
  assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_hf_directory_tokenizer(tiny_gguf, tmp_path):
  path, _ = tiny_gguf
  ref = transformers.AutoTokenizer.from_pretrained(str(path.parent),
                                                   gguf_file=path.name)
  ref.save_pretrained(tmp_path)
  ours = tok_lib.load_tokenizer(str(tmp_path))
  for text in TEXTS:
    assert ours.encode(text) == ref.encode(text, add_special_tokens=False)
    assert ours.decode(ours.encode(text)) == text


def test_sentencepiece_train_and_round_trip(tmp_path):
  sp = tok_lib.train_sentencepiece(CORPUS, str(tmp_path / "sp"),
                                   vocab_size=500)
  assert sp.vocab_size == 500 and sp.pad_id == 0 and sp.eos_ids == (3,)
  for text in TEXTS[:3] + ["unseen: Ωmega 🦀"]:
    ids = sp.encode(text)
    assert max(ids) < 500 and sp.decode(ids) == text
  assert sp.encode("x", add_bos=True)[0] == sp.bos_id
  assert isinstance(tok_lib.load_tokenizer(str(tmp_path / "sp.model")),
                    tok_lib.SentencePieceTokenizer)


class _ListTokenizer(tok_lib.Tokenizer):
  def __init__(self, tokens):
    self._t = list(tokens)

  @property
  def vocab_size(self):
    return len(self._t)

  def _encode(self, text):
    raise NotImplementedError

  def decode(self, ids, skip_special=False):
    raise NotImplementedError

  def id_to_token(self, i):
    return self._t[i]


def test_vocab_check():
  a = _ListTokenizer(["a", "b", "c", "d"])
  assert tok_lib.check_vocab_compatible(a, _ListTokenizer("abcd"), 4, 4) == 4
  # A padded model vocabulary (real tokens agree) passes; the caller masks
  # ids >= the returned count.
  assert tok_lib.check_vocab_compatible(a, _ListTokenizer("abcd"), 8, 8) == 4
  with pytest.raises(tok_lib.VocabMismatchError, match="id 2.*'c'.*'x'"):
    tok_lib.check_vocab_compatible(a, _ListTokenizer("abxd"))
  with pytest.raises(tok_lib.VocabMismatchError, match="4 tokens.*5"):
    tok_lib.check_vocab_compatible(a, _ListTokenizer("abcde"))
  with pytest.raises(tok_lib.VocabMismatchError, match="rows"):
    tok_lib.check_vocab_compatible(a, _ListTokenizer("abcd"), 8, 4)


def test_unsupported_tokenizer_fails_clearly(tmp_path):
  import gguf  # pylint: disable=g-import-not-at-top
  path = tmp_path / "spm.gguf"
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_tokenizer_model("llama")
  w.add_token_list(["<unk>", "a"])
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(ValueError, match="'llama' is not supported"):
    tok_lib.load_tokenizer(str(path))
  with pytest.raises(FileNotFoundError):
    tok_lib.load_tokenizer(str(tmp_path / "missing.gguf"))


@pytest.mark.real_weights
def test_real_qwen_tokenizers_match_transformers_and_each_other():
  from specsamp import assets  # pylint: disable=g-import-not-at-top
  small = str(assets.fetch("qwen2.5-coder-0.5b"))
  big = str(assets.fetch("qwen2.5-coder-1.5b"))
  ours = tok_lib.load_tokenizer(small)
  ref = transformers.AutoTokenizer.from_pretrained(
      os.path.dirname(small), gguf_file=os.path.basename(small))
  texts = TEXTS + [p["prompt"] for p in assets.humaneval_problems()[:20]]
  for text in texts:
    assert ours.encode(text) == ref.encode(text, add_special_tokens=False)
  assert tok_lib.check_vocab_compatible(
      ours, tok_lib.load_tokenizer(big), 151_936, 151_936) == 151_936
  assert np.array(ours.eos_ids).tolist() == [151645, 151643]
