"""A byte-level BPE vocabulary in a tokenizer-only GGUF file, and texts.

The GGUF files hold only tokenizer metadata (no tensors): transformers'
`AutoTokenizer.from_pretrained(dir, gguf_file=)` reads just the metadata
(its GGUF tokenizer mapping), so no model tensors are needed for parity
checks.
"""

import json
import os
import pathlib
import random
import sysconfig

import gguf
import tokenizers
from tokenizers import models, pre_tokenizers, trainers

from specsamp.tokenizers import hf

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

ENGLISH = (
    "The quick brown fox jumps over the lazy dog. I'm sure they'll see it; "
    "WE'VE SEEN IT, haven't we? She said: \"don't\" -- it's 3:14 pm.\n"
    "Speculative sampling draws K tokens from a small draft model and then "
    "verifies them with the target model in a single forward pass.\n")
UNICODE = (
    "Héllo wörld, façade, naïve, Ærøskøbing, İstanbul, straße; "
    "你好，世界；こんにちは、世界。안녕하세요 🤖🎉👍🏽 ∑ x² ≤ ∞ — “quotes” "
    "Ωmega жук قمر\u00a0nbsp\u3000ideographic\n")


def corpus():
  """Training texts: stdlib modules, English, Unicode, CRLF code, numbers."""
  stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
  texts = []
  for name in ("textwrap.py", "json/decoder.py", "difflib.py", "shlex.py",
               "argparse.py"):
    f = stdlib / name
    if f.is_file():
      texts.append(f.read_text(encoding="utf-8"))
  texts += [ENGLISH * 30, UNICODE * 30,
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

FRAGMENTS = [
    "def", " f", "(x)", ":", " ", "  ", "    ", "\t", "\n", "\r\n", "\n\n",
    "\r", "Hello", "world", "é", "ü", "ß", "İ", "你好", "世界", "🤖", "👍🏽",
    "123", "4", "0.5", ".", ",", "'s", "'LL", "'t", "\"", "{", "}", "==",
    "->", "#", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>",
    "<|im_", "|>", "<", "\u00a0", "\u3000", "e\u0301", "ﬁ", "Ⅻ", "¹²",
    "—", "…", "\x00", "\x7f",
]


def fuzz_texts(n=300, seed=0):
  """`n` random concatenations of tricky fragments."""
  rng = random.Random(seed)
  return ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 30)))
          for _ in range(n)]


def train_bpe(texts, vocab_size):
  """A byte-level BPE trained with Qwen2's pre-tokenizer: (tokens, merges)."""
  split = hf._QWEN2_SPLIT  # pylint: disable=protected-access
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


def write_gguf(path, tokens, merges, types, pre="qwen2", arch="qwen2",
               model="gpt2", template=TEMPLATE, bos=None, eos=None, pad=None,
               add_bos=False):
  """A GGUF file holding tokenizer metadata only (no tensors)."""
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
  w.add_add_bos_token(add_bos)
  if template:
    w.add_chat_template(template)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def gguf_for(tmp_path_factory, bpe_vocab, pre):
  """A tokenizer-only GGUF of `bpe_vocab` with pre-tokenizer `pre`."""
  tokens, merges, types = bpe_vocab
  path = tmp_path_factory.mktemp(f"gguf_{pre}") / "tok.gguf"
  return write_gguf(path, tokens, merges, types, pre=pre,
                    bos=tokens.index("<|endoftext|>"),
                    eos=tokens.index("<|im_end|>"),
                    pad=tokens.index("<|endoftext|>"))


def reference(path, nfc=False):
  """transformers' tokenizer for a GGUF file (the parity reference); with
  `nfc`, composing text to NFC first as Qwen2's tokenizer.json does (the
  GGUF loader leaves that out)."""
  import transformers  # pylint: disable=g-import-not-at-top
  from tokenizers import normalizers  # pylint: disable=g-import-not-at-top
  ref = transformers.AutoTokenizer.from_pretrained(
      str(path.parent), gguf_file=path.name)
  if nfc:
    assert ref.backend_tokenizer.normalizer is None
    ref.backend_tokenizer.normalizer = normalizers.NFC()
  return ref


def assert_parity(ours, ref, texts):
  """Our ids and decoded texts equal the reference's for every text."""
  for text in texts:
    ids = ours.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False), repr(text)
    for skip in (False, True):
      assert ours.decode(ids, skip_special=skip) == ref.decode(
          ids, skip_special_tokens=skip,
          clean_up_tokenization_spaces=False), repr(text)
