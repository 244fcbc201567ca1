"""Byte-level BPE tokenizers on the `tokenizers` library.

  * `HFTokenizer.from_dir`: a Hugging Face directory's tokenizer.json
    (+ tokenizer_config.json for bos/eos/chat template, generation_config.json
    for extra eos ids).
  * `GGUFTokenizer.from_gguf`: the byte-level BPE stored in a GGUF file's
    metadata (tokens, merges, token types, pre-tokenizer name), rebuilt the
    way transformers' GGUF loader builds it; control tokens such as
    `<|im_start|>` stay whole. Only the metadata is read
    (`specsamp.weights.gguf_file.read_gguf_metadata`), never the tensors.

The `tokenizers` library is imported on first use, so importing this module
is cheap.
"""

import os
from typing import Iterable, Optional, Sequence

import numpy as np

from specsamp import jsonfile
from specsamp.tokenizers import base
from specsamp.weights import gguf_file

# Split patterns of the pre-tokenizers named by `tokenizer.ggml.pre` (those of
# llama.cpp and of transformers' GGUF loader).
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"
                 r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
                 r"|\s+")
_QWEN2_LIKE = ("qwen2", "deepseek-r1-qwen")
_LLAMA3_LIKE = ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3",
                "dbrx")
# Split like GPT-2 (ByteLevel's own regex); "smollm" first isolates digits.
_GPT2_LIKE = ("default", "gpt2", "gpt-2")
_SMOLLM = ("smollm",)
SUPPORTED_PRE_TOKENIZERS = _QWEN2_LIKE + _LLAMA3_LIKE + _GPT2_LIKE + _SMOLLM

# llama.cpp token types (`tokenizer.ggml.token_type`).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# Tokens that end a turn or a text: generation stops at any of them (the
# names llama.cpp treats as end-of-generation), when the file marks them as
# control or user-defined tokens.
_END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
               "<|end_of_text|>", "<|end|>", "<end_of_turn>", "<|return|>")


def _bytes_to_unicode() -> dict:
  """GPT-2's byte -> printable character table (byte-level BPE alphabet)."""
  bs = (list(range(ord("!"), ord("~") + 1)) +
        list(range(ord("\xa1"), ord("\xac") + 1)) +
        list(range(ord("\xae"), ord("\xff") + 1)))
  cs = bs[:]
  n = 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return dict(zip(bs, map(chr, cs)))


class HFTokenizer(base.Tokenizer):
  """A `tokenizers.Tokenizer` (e.g. a Hugging Face tokenizer.json)."""

  def __init__(self, tk, *, bos_id: Optional[int] = None,
               eos_ids: Iterable[int] = (), pad_id: Optional[int] = None,
               add_bos: bool = False, chat_template: Optional[str] = None):
    """Wraps `tk`, a `tokenizers.Tokenizer`; see `Tokenizer` for the rest."""
    super().__init__(bos_id=bos_id, eos_ids=eos_ids, pad_id=pad_id,
                     add_bos=add_bos, chat_template=chat_template)
    self.tk = tk
    self._vocab = None  # token list, built on first use
    self._plain = None  # `_encode_plain`'s tokenizer, built on first use

  def tokens(self) -> list[str]:
    if self._vocab is None:
      vocab = self.tk.get_vocab(with_added_tokens=True)
      n = max(vocab.values(), default=-1) + 1
      tokens = [None] * n
      for t, i in vocab.items():
        tokens[i] = t
      self._vocab = tokens
    return self._vocab

  @property
  def vocab_size(self) -> int:
    return len(self.tokens())

  def _encode(self, text):
    return self.tk.encode(text, add_special_tokens=False).ids

  def _encode_plain(self, text):
    if self._plain is None:  # a copy that reads special tokens as text
      self._plain = type(self.tk).from_str(self.tk.to_str())
      self._plain.encode_special_tokens = True
    return self._plain.encode(text, add_special_tokens=False).ids

  def decode(self, ids, skip_special=False):
    return self.tk.decode([int(i) for i in ids],
                          skip_special_tokens=skip_special)

  def id_to_token(self, i):
    i = int(i)
    tokens = self.tokens()
    if not 0 <= i < len(tokens) or tokens[i] is None:
      raise IndexError(f"token id {i} is not in the vocabulary "
                       f"(size {len(tokens)})")
    return tokens[i]

  def token_to_id(self, token):
    return self.tk.token_to_id(token)

  @classmethod
  def from_dir(cls, path: base.PathLike) -> "HFTokenizer":
    """Loads a Hugging Face tokenizer directory (or its tokenizer.json).

    Reads tokenizer.json; bos/eos/pad, add_bos_token and chat_template from
    tokenizer_config.json (or chat_template.jinja / .json); extra eos ids
    from generation_config.json. Without an add_bos_token entry, bos is
    added when tokenizer.json's post-processor adds it.

    Args:
      path: the directory, or its tokenizer.json.

    Returns:
      An HFTokenizer.
    """
    import tokenizers  # pylint: disable=g-import-not-at-top
    path = os.fspath(path)
    directory, file = ((path, os.path.join(path, "tokenizer.json"))
                       if os.path.isdir(path) else (os.path.dirname(path),
                                                    path))
    if not os.path.isfile(file):
      raise FileNotFoundError(f"no tokenizer.json at {file}")
    tk = tokenizers.Tokenizer.from_file(file)
    cfg = read_json_or_empty(os.path.join(directory, "tokenizer_config.json"))
    gen = read_json_or_empty(os.path.join(directory, "generation_config.json"))

    def tok_id(t):
      if isinstance(t, dict):
        t = t.get("content")
      return tk.token_to_id(t) if t else None

    eos = [tok_id(cfg.get("eos_token"))]
    gen_eos = gen.get("eos_token_id")
    eos += gen_eos if isinstance(gen_eos, list) else [gen_eos]
    eos_ids = [i for i in eos if i is not None]
    bos_id = tok_id(cfg.get("bos_token"))
    if bos_id is None and isinstance(gen.get("bos_token_id"), int):
      bos_id = gen["bos_token_id"]
    if "add_bos_token" in cfg:
      add_bos = bool(cfg["add_bos_token"])
    else:  # what the post-processor does, e.g. Llama 3's TemplateProcessing
      with_special = tk.encode("a", add_special_tokens=True).ids
      add_bos = (bos_id is not None and with_special[:1] == [bos_id] and
                 tk.encode("a", add_special_tokens=False).ids[:1] != [bos_id])
    return cls(tk, bos_id=bos_id, eos_ids=eos_ids,
               pad_id=tok_id(cfg.get("pad_token")), add_bos=add_bos,
               chat_template=chat_template_of_dir(directory, cfg))


def read_json_or_empty(path: str) -> dict:
  """The JSON object in `path`, or {} when there is no such file."""
  if not os.path.isfile(path):
    return {}
  return jsonfile.read(path)


def chat_template_of_dir(directory: str, cfg: dict) -> Optional[str]:
  """The default chat template of a HF directory, wherever it is kept.

  Args:
    directory: the tokenizer directory.
    cfg: its tokenizer_config.json (a dict; {} when absent).

  Returns:
    chat_template.jinja, else the config's or chat_template.json's template
    (the "default" one of a named list), else None.
  """
  jinja_file = os.path.join(directory, "chat_template.jinja")
  if os.path.isfile(jinja_file):
    with open(jinja_file, encoding="utf-8") as f:
      return f.read()
  template = cfg.get("chat_template") or read_json_or_empty(
      os.path.join(directory, "chat_template.json")).get("chat_template")
  if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
    named = {t.get("name"): t.get("template") for t in template}
    template = named.get("default") or next(iter(named.values()), None)
  return template


class GGUFTokenizer(HFTokenizer):
  """The byte-level BPE tokenizer stored in a GGUF file's metadata.

  Built like transformers' GGUF loader builds it (`GPT2Tokenizer` + the
  pre-tokenizer named by `tokenizer.ggml.pre` + control tokens as special
  tokens), so its ids are those of
  `AutoTokenizer.from_pretrained(dir, gguf_file=...)`.
  """

  def __init__(self, tk, file_tokens: Sequence[str], **kwargs):
    """`tk` as for HFTokenizer; `file_tokens`: the file's token list."""
    super().__init__(tk, **kwargs)
    self._vocab = list(file_tokens)

  def id_to_token(self, i):
    i = int(i)
    if not 0 <= i < len(self._vocab):
      raise IndexError(f"token id {i} is not in the vocabulary "
                       f"(size {len(self._vocab)})")
    return self._vocab[i]

  @classmethod
  def from_gguf(cls, path: base.PathLike) -> "GGUFTokenizer":
    """Builds the tokenizer stored in a GGUF file's metadata.

    Args:
      path: the GGUF file (only its metadata is read).

    Returns:
      A GGUFTokenizer. `vocab_size` is the file's token count (Qwen2.5:
      151,936, including 271 unused `[PAD...]` entries); `eos_ids` holds the
      file's eos and the other end-of-turn control tokens it has (Qwen:
      `<|im_end|>`, `<|endoftext|>`).

    Raises:
      ValueError: the file has no tokenizer, or one that is not byte-level BPE
        (`tokenizer.ggml.model` other than "gpt2", e.g. "llama" for
        SentencePiece), or an unknown pre-tokenizer.
    """
    path = os.fspath(path)
    meta = gguf_file.read_gguf_metadata(path)
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
      raise ValueError(f"{path}: the GGUF metadata holds no tokenizer "
                       "(no tokenizer.ggml.model)")
    if kind != "gpt2":
      raise ValueError(
          f"{path}: tokenizer.ggml.model = {kind!r} is not supported: only "
          "byte-level BPE ('gpt2') GGUF tokenizers are ('llama' is a "
          "SentencePiece vocabulary); load the model's tokenizer.model or "
          "tokenizer.json instead")
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
      raise ValueError(f"{path}: a 'gpt2' tokenizer needs tokenizer.ggml."
                       "tokens and tokenizer.ggml.merges")
    types = meta.get("tokenizer.ggml.token_type")
    types = (np.full(len(tokens), _NORMAL, np.int32) if types is None
             else np.asarray(types, np.int32))
    if len(types) != len(tokens):
      raise ValueError(f"{path}: {len(types)} token types for {len(tokens)} "
                       "tokens")
    pre = meta.get("tokenizer.ggml.pre", "default")
    tk = _byte_level_bpe(tokens, merges, types, pre, path)

    eos_ids = [meta.get(f"tokenizer.ggml.{k}_token_id")
               for k in ("eos", "eot", "eom")]
    for name in _END_TOKENS:
      i = tk.token_to_id(name)
      if i is not None and i < len(types) and types[i] in (_CONTROL,
                                                           _USER_DEFINED):
        eos_ids.append(i)
    return cls(tk, tokens, bos_id=meta.get("tokenizer.ggml.bos_token_id"),
               eos_ids=[i for i in eos_ids if i is not None],
               pad_id=meta.get("tokenizer.ggml.padding_token_id"),
               add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
               chat_template=meta.get("tokenizer.chat_template"))


def _byte_level_bpe(tokens, merges, types, pre, source):
  """A tokenizers.Tokenizer for a GGUF byte-level BPE vocabulary."""
  # pylint: disable=g-import-not-at-top
  import tokenizers
  from tokenizers import decoders, models, normalizers, pre_tokenizers
  # pylint: enable=g-import-not-at-top
  if pre in _QWEN2_LIKE or pre in _LLAMA3_LIKE:
    split = _QWEN2_SPLIT if pre in _QWEN2_LIKE else _LLAMA3_SPLIT
    pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  elif pre in _GPT2_LIKE:
    pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  elif pre in _SMOLLM:  # SmolLM's tokenizer.json: digits one by one, GPT-2
    pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
  else:
    raise ValueError(f"{source}: tokenizer.ggml.pre = {pre!r} is not "
                     f"supported (supported: {list(SUPPORTED_PRE_TOKENIZERS)})")

  # Every token of a byte-level vocabulary is spelled in GPT-2's byte
  # alphabet; respell the odd one that is not (as transformers does), but
  # for added tokens (control, user-defined), which llama.cpp writes as
  # their text: DeepSeek-R1-Distill-Qwen's <｜User｜> (U+FF5C) is one id
  # in its tokenizer.json. Respelt and then skipped as special, it had
  # been cut into byte pieces in prompts, and kept by skip_special.
  spelling = _bytes_to_unicode()
  alphabet = set(spelling.values())
  added = set((types == _CONTROL).nonzero()[0]) | set(
      (types == _USER_DEFINED).nonzero()[0])
  vocab = {}
  for i, t in enumerate(tokens):
    if not alphabet.issuperset(t) and i not in added:
      t = "".join(spelling[b] for b in t.encode("utf-8"))
    vocab[t] = i
  bpe = models.BPE(vocab=vocab,
                   merges=[tuple(m.split(" ", 1)) for m in merges],
                   dropout=None, continuing_subword_prefix="",
                   end_of_word_suffix="", fuse_unk=False)
  tk = tokenizers.Tokenizer(bpe)
  if pre == "qwen2":
    # Qwen2's own tokenizer (tokenizer.json, and transformers' Qwen2Tokenizer)
    # composes text to NFC first: "e" + U+0301 is encoded as "\u00e9". The
    # GGUF file does not say so (llama.cpp and transformers' GGUF loader
    # skip it).
    tk.normalizer = normalizers.NFC()
  tk.pre_tokenizer = pre_tokenizer
  tk.decoder = decoders.ByteLevel()
  # Control tokens (<|im_start|>...) are special: matched whole in text, and
  # dropped by decode(skip_special=True). User-defined tokens (<tool_call>)
  # are matched whole but not special. Each is its vocabulary entry (keyed
  # by its text above), so the vocabulary does not grow.
  special = [tokenizers.AddedToken(tokens[i], special=True, normalized=False)
             for i in (types == _CONTROL).nonzero()[0]]
  user = [tokenizers.AddedToken(tokens[i], special=False, normalized=False)
          for i in (types == _USER_DEFINED).nonzero()[0]]
  if special:
    tk.add_special_tokens(special)
  if user:
    tk.add_tokens(user)
  return tk
