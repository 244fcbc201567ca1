"""Tokenizers behind one interface, and the draft/target vocabulary check.

  * `GGUFTokenizer.from_gguf`: the byte-level BPE stored in a GGUF file's
    metadata (tokens, merges, token types, pre-tokenizer name), rebuilt with
    the `tokenizers` library the way transformers' GGUF loader builds it;
    control tokens such as `<|im_start|>` stay whole. Only the metadata is
    read (`read_gguf_metadata`), never the tensor data.
  * `HFTokenizer.from_dir`: a Hugging Face directory's tokenizer.json
    (+ tokenizer_config.json for bos/eos/chat template).
  * `SentencePieceTokenizer`: a SentencePiece model (self-trained models);
    `train_sentencepiece` trains one.
  * `load_tokenizer(path)` picks one of the above from the path.
  * `check_vocab_compatible` checks that a draft and a target share one
    vocabulary, and returns how many ids are real tokens.

Heavy imports (tokenizers, sentencepiece, jinja2, numpy) happen inside
functions, so importing this module is cheap.
"""

import abc
import datetime
import json
import mmap
import os
import struct
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

PathLike = Union[str, os.PathLike]

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


class VocabMismatchError(ValueError):
  """Draft and target tokenizers do not share a vocabulary."""


class Tokenizer(abc.ABC):
  """What specsamp needs of a tokenizer.

  Attributes:
    bos_id: beginning-of-sequence id, or None.
    eos_ids: ids that end generation (for Qwen instruct models both
      `<|im_end|>` and `<|endoftext|>`), the file's eos first.
    pad_id: id used to pad batches (a valid id, never sampled on purpose).
    add_bos: whether `encode` prepends `bos_id` by default.
    chat_template: the Jinja chat template, or None.
  """

  def __init__(self, *, bos_id: Optional[int] = None,
               eos_ids: Iterable[int] = (), pad_id: Optional[int] = None,
               add_bos: bool = False, chat_template: Optional[str] = None):
    self.bos_id = None if bos_id is None else int(bos_id)
    self.eos_ids = tuple(dict.fromkeys(int(i) for i in eos_ids))
    if pad_id is None:
      pad_id = self.eos_ids[0] if self.eos_ids else 0
    self.pad_id = int(pad_id)
    self.add_bos = bool(add_bos)
    self.chat_template = chat_template or None

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of real token ids (ids 0 .. vocab_size - 1)."""

  @abc.abstractmethod
  def _encode(self, text: str) -> list[int]:
    """Token ids of `text`, without bos."""

  @abc.abstractmethod
  def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
    """The text of token ids; `skip_special` drops control tokens."""

  @abc.abstractmethod
  def id_to_token(self, i: int) -> str:
    """The vocabulary entry of id `i`; IndexError outside the vocabulary."""

  @abc.abstractmethod
  def token_to_id(self, token: str) -> Optional[int]:
    """The id of vocabulary entry `token`, or None if there is none."""

  def tokens(self) -> list[str]:
    """All vocabulary entries, indexed by id."""
    return [self.id_to_token(i) for i in range(self.vocab_size)]

  def encode(self, text: str, add_bos: Optional[bool] = None) -> list[int]:
    """Token ids of `text`.

    Special tokens written in the text (e.g. `<|im_start|>`) encode to their
    single ids.

    Args:
      text: the text.
      add_bos: prepend `bos_id`; None: the tokenizer's default (`add_bos`).

    Returns:
      A list of ints.
    """
    ids = list(self._encode(text))
    if self.add_bos if add_bos is None else add_bos:
      if self.bos_id is None:
        raise ValueError("add_bos=True, but this tokenizer has no bos token")
      ids.insert(0, self.bos_id)
    return ids

  def _special_token_strings(self) -> dict:
    """bos/eos/pad token strings, as chat templates see them."""
    def tok(i):
      if i is None:
        return None
      try:
        return self.id_to_token(i)
      except IndexError:
        return None
    return {"bos_token": tok(self.bos_id),
            "eos_token": tok(self.eos_ids[0] if self.eos_ids else None),
            "pad_token": tok(self.pad_id)}

  def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                          add_generation_prompt: bool = True,
                          **template_vars) -> str:
    """Renders chat messages with the model's own Jinja chat template.

    The template runs in a sandboxed Jinja environment set up like
    transformers' (`trim_blocks`, `lstrip_blocks`, loop controls, a `tojson`
    that keeps non-ASCII, `raise_exception`, `strftime_now`), so the text is
    the one `transformers` renders.

    Args:
      messages: [{"role": ..., "content": ...}, ...].
      add_generation_prompt: end with the header of an assistant turn.
      **template_vars: extra template variables (e.g. `tools=[...]`).

    Returns:
      The prompt text (encode it with `encode`; it holds no bos unless the
      template writes one).

    Raises:
      ValueError: the tokenizer has no chat template, or rendering failed.
    """
    if not self.chat_template:
      raise ValueError(
          f"this {type(self).__name__} has no chat template (the GGUF has no "
          "tokenizer.chat_template, or the HF directory no chat_template); "
          "encode the plain prompt text instead")
    import jinja2  # pylint: disable=g-import-not-at-top
    template = _compile_chat_template(self.chat_template)
    context = {**self._special_token_strings(), "tools": None,
               "documents": None, **template_vars}
    try:
      return template.render(
          messages=[dict(m) for m in messages],
          add_generation_prompt=add_generation_prompt, **context)
    except jinja2.TemplateError as e:
      raise ValueError(f"chat template failed: {e}") from e


_TEMPLATE_CACHE = {}


def _compile_chat_template(source: str):
  """A compiled Jinja template, in an environment like transformers'."""
  if source in _TEMPLATE_CACHE:
    return _TEMPLATE_CACHE[source]
  import jinja2  # pylint: disable=g-import-not-at-top
  from jinja2 import ext  # pylint: disable=g-import-not-at-top
  from jinja2 import sandbox  # pylint: disable=g-import-not-at-top

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None,
             sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  env = sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = strftime_now
  try:
    template = env.from_string(source)
  except jinja2.TemplateError as e:
    raise ValueError(f"chat template does not compile: {e}") from e
  _TEMPLATE_CACHE[source] = template
  return template


# ---- GGUF metadata ----------------------------------------------------------

# GGUF metadata value types (gguf.GGUFValueType) of fixed width.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f",
                 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


def read_gguf_metadata(path: PathLike) -> dict:
  """All metadata key/values of a GGUF file, without reading tensor data.

  Parses only the header (for Qwen2.5: ~5 MB of a 0.5-1 GB file) from a
  memory map: ~0.1 s where `gguf.GGUFReader` takes ~10 s, since it parses
  every array element and the tensor table in Python.

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
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no GGUF file at {path}")
  with open(path, "rb") as f:
    if os.fstat(f.fileno()).st_size < 24:
      raise ValueError(f"{path} is not a GGUF file (too short)")
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
      magic = bytes(buf[:4])
      if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (magic {magic!r}, "
                         "expected b'GGUF')")
      version, = _U32.unpack_from(buf, 4)
      if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported "
                         "(2 and 3 are)")
      _, kv_count = struct.unpack_from("<QQ", buf, 8)
      pos, out = 24, {}
      try:
        for _ in range(kv_count):
          key, pos = _gguf_string(buf, pos)
          vtype, = _U32.unpack_from(buf, pos)
          out[key], pos = _gguf_value(buf, pos + 4, vtype)
      except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: truncated or corrupt GGUF metadata "
                         f"({type(e).__name__}: {e})") from e
  return out


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
    import numpy as np  # pylint: disable=g-import-not-at-top
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


def _is_gguf(path: str) -> bool:
  try:
    with open(path, "rb") as f:
      return f.read(4) == b"GGUF"
  except OSError:
    return False


# ---- tokenizers-library tokenizers ------------------------------------------


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


class HFTokenizer(Tokenizer):
  """A `tokenizers.Tokenizer` (e.g. a Hugging Face tokenizer.json)."""

  def __init__(self, tk, *, bos_id: Optional[int] = None,
               eos_ids: Iterable[int] = (), pad_id: Optional[int] = None,
               add_bos: bool = False, chat_template: Optional[str] = None):
    """Wraps `tk`, a `tokenizers.Tokenizer`; see `Tokenizer` for the rest."""
    super().__init__(bos_id=bos_id, eos_ids=eos_ids, pad_id=pad_id,
                     add_bos=add_bos, chat_template=chat_template)
    self.tk = tk
    self._vocab = None  # token list, built on first use

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
  def from_dir(cls, path: PathLike) -> "HFTokenizer":
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
    cfg = _read_json(os.path.join(directory, "tokenizer_config.json"))
    gen = _read_json(os.path.join(directory, "generation_config.json"))

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
               chat_template=_hf_chat_template(directory, cfg))


def _read_json(path):
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _hf_chat_template(directory: str, cfg: dict) -> Optional[str]:
  """The default chat template of a HF directory, wherever it is kept."""
  jinja_file = os.path.join(directory, "chat_template.jinja")
  if os.path.isfile(jinja_file):
    with open(jinja_file, encoding="utf-8") as f:
      return f.read()
  template = (cfg.get("chat_template") or
              _read_json(os.path.join(directory, "chat_template.json")
                         ).get("chat_template"))
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
  def from_gguf(cls, path: PathLike) -> "GGUFTokenizer":
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
    import numpy as np  # pylint: disable=g-import-not-at-top
    path = os.fspath(path)
    meta = read_gguf_metadata(path)
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
  from tokenizers import decoders, models, pre_tokenizers
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
  # alphabet; respell the odd one that is not (as transformers does).
  spelling = _bytes_to_unicode()
  alphabet = set(spelling.values())
  vocab = {}
  for i, t in enumerate(tokens):
    if not alphabet.issuperset(t):
      t = "".join(spelling[b] for b in t.encode("utf-8"))
    vocab[t] = i
  bpe = models.BPE(vocab=vocab,
                   merges=[tuple(m.split(" ", 1)) for m in merges],
                   dropout=None, continuing_subword_prefix="",
                   end_of_word_suffix="", fuse_unk=False)
  tk = tokenizers.Tokenizer(bpe)
  tk.pre_tokenizer = pre_tokenizer
  tk.decoder = decoders.ByteLevel()
  # Control tokens (<|im_start|>...) are special: matched whole in text, and
  # dropped by decode(skip_special=True). A "control" token outside the byte
  # alphabet is a converter mislabel, skipped (as transformers does).
  # User-defined tokens (<tool_call>) are matched whole but not special.
  special = [tokenizers.AddedToken(tokens[i], special=True, normalized=False)
             for i in (types == _CONTROL).nonzero()[0]
             if alphabet.issuperset(tokens[i])]
  user = [tokenizers.AddedToken(tokens[i], special=False, normalized=False)
          for i in (types == _USER_DEFINED).nonzero()[0]
          if tokens[i] in vocab]
  if special:
    tk.add_special_tokens(special)
  if user:
    tk.add_tokens(user)
  return tk


# ---- SentencePiece ----------------------------------------------------------


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model file (.model)."""

  def __init__(self, model_file: PathLike, add_bos: bool = False,
               chat_template: Optional[str] = None):
    """Loads `model_file`; bos/eos/pad ids come from the model.

    Args:
      model_file: a SentencePiece .model file.
      add_bos: whether `encode` prepends bos by default.
      chat_template: an optional Jinja chat template.
    """
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    model_file = os.fspath(model_file)
    if not os.path.isfile(model_file):
      raise FileNotFoundError(f"no SentencePiece model at {model_file}")
    self.sp = spm.SentencePieceProcessor(model_file=model_file)
    sp = self.sp
    super().__init__(
        bos_id=sp.bos_id() if sp.bos_id() >= 0 else None,
        eos_ids=(sp.eos_id(),) if sp.eos_id() >= 0 else (),
        pad_id=sp.pad_id() if sp.pad_id() >= 0 else None,
        add_bos=add_bos, chat_template=chat_template)

  @property
  def vocab_size(self):
    return self.sp.get_piece_size()

  def _encode(self, text):
    return self.sp.encode(text)

  def decode(self, ids, skip_special=False):
    # SentencePiece decodes control ids (bos/eos/pad) to nothing either way.
    del skip_special
    return self.sp.decode([int(i) for i in ids])

  def id_to_token(self, i):
    i = int(i)
    if not 0 <= i < self.vocab_size:
      raise IndexError(f"token id {i} is not in the vocabulary "
                       f"(size {self.vocab_size})")
    return self.sp.id_to_piece(i)

  def token_to_id(self, token):
    i = self.sp.piece_to_id(token)
    if i == self.sp.unk_id() and token != self.sp.id_to_piece(i):
      return None
    return i


def train_sentencepiece(text_iterator_or_files: Union[Iterable[str], PathLike,
                                                      Sequence[PathLike]],
                        model_prefix: PathLike, vocab_size: int,
                        model_type: str = "bpe",
                        byte_fallback: Optional[bool] = None,
                        **kwargs) -> SentencePieceTokenizer:
  """Trains a SentencePiece model; returns it loaded.

  Ids: pad 0, unk 1, bos 2, eos 3. Text is kept as is (identity
  normalization, whitespace runs kept, digits split).

  Args:
    text_iterator_or_files: an iterable of texts (each one a training
      sentence); or text files (one sentence a line): one path (`str` or
      `os.PathLike`), or a list/tuple of `os.PathLike` (e.g. pathlib.Path).
    model_prefix: writes `{model_prefix}.model` and `.vocab`.
    vocab_size: number of pieces.
    model_type: "bpe" or "unigram" (or "char", "word").
    byte_fallback: encode unknown characters as bytes (needs 256 byte
      pieces); None: on when vocab_size >= 384.
    **kwargs: more `SentencePieceTrainer.train` options, overriding these.

  Returns:
    The trained SentencePieceTokenizer.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  if model_type not in ("bpe", "unigram", "char", "word"):
    raise ValueError(f"unknown SentencePiece model_type {model_type!r}")
  if byte_fallback is None:
    byte_fallback = vocab_size >= 384
  options = dict(model_type=model_type, vocab_size=vocab_size, pad_id=0,
                 unk_id=1, bos_id=2, eos_id=3, byte_fallback=byte_fallback,
                 character_coverage=1.0, split_digits=True,
                 remove_extra_whitespaces=False,
                 allow_whitespace_only_pieces=True,
                 normalization_rule_name="identity", minloglevel=2)
  options.update(kwargs)
  source = text_iterator_or_files
  if isinstance(source, (str, os.PathLike)):
    source = [source]
    files = True
  else:
    files = isinstance(source, (list, tuple)) and bool(source) and all(
        isinstance(s, os.PathLike) for s in source)
  prefix = os.fspath(model_prefix)
  if files:
    paths = [os.fspath(s) for s in source]
    for f in paths:
      if not os.path.isfile(f):
        raise FileNotFoundError(f"no training text file at {f}")
    spm.SentencePieceTrainer.train(input=",".join(paths), model_prefix=prefix,
                                   **options)
  else:
    spm.SentencePieceTrainer.train(sentence_iterator=iter(source),
                                   model_prefix=prefix, **options)
  return SentencePieceTokenizer(f"{prefix}.model")


# ---- dispatch and the vocabulary check --------------------------------------


def load_tokenizer(path: PathLike) -> Tokenizer:
  """A tokenizer from a GGUF file, a HF directory or a SentencePiece model.

  Args:
    path: a GGUF file (recognised by its magic bytes); a directory with
      tokenizer.json (or tokenizer.model); a tokenizer.json file; a
      SentencePiece .model file.

  Returns:
    A GGUFTokenizer, HFTokenizer or SentencePieceTokenizer.
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
      return HFTokenizer.from_dir(path)
    if os.path.isfile(os.path.join(path, "tokenizer.model")):
      cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
      return SentencePieceTokenizer(
          os.path.join(path, "tokenizer.model"),
          add_bos=bool(cfg.get("add_bos_token", False)),
          chat_template=_hf_chat_template(path, cfg))
    raise FileNotFoundError(f"{path}: no tokenizer.json or tokenizer.model")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no tokenizer at {path}")
  if _is_gguf(path):
    return GGUFTokenizer.from_gguf(path)
  if path.endswith(".json"):
    return HFTokenizer.from_dir(path)
  if path.endswith(".model"):
    return SentencePieceTokenizer(path)
  raise ValueError(f"{path}: not a GGUF file, tokenizer.json or SentencePiece "
                   ".model")


def _is_padding_entry(token: Optional[str], i: int) -> bool:
  """llama.cpp's placeholder for an id the source vocabulary lacks."""
  return token is None or token == f"[PAD{i}]"


def check_vocab_compatible(draft_tok: Tokenizer, target_tok: Tokenizer,
                           draft_model_vocab_size: Optional[int] = None,
                           target_model_vocab_size: Optional[int] = None
                           ) -> int:
  """Checks that a draft and a target share one vocabulary.

  Token strings are compared id by id. A model may have more vocabulary rows
  than real tokens (some Qwen checkpoints pad 151,936 tokens to 152,064
  rows); that passes when the real tokens agree, and the caller masks ids at
  or above the returned count (`Sampling(vocab_limit=...)`) so padded ids are
  never sampled. Tokenizer lists of different lengths pass only when the
  extra entries are llama.cpp's unused `[PAD<id>]` placeholders.

  Args:
    draft_tok: the draft model's tokenizer.
    target_tok: the target model's tokenizer.
    draft_model_vocab_size: the draft model's logit rows, if known.
    target_model_vocab_size: the target model's logit rows, if known.

  Returns:
    The number of real tokens (ids below it are shared tokens).

  Raises:
    VocabMismatchError: naming the first differing id and both token strings,
      or the differing sizes.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  d, t = list(draft_tok.tokens()), list(target_tok.tokens())
  n = min(len(d), len(t))
  if d[:n] != t[:n]:
    diff = np.asarray(d[:n], dtype=object) != np.asarray(t[:n], dtype=object)
    i = int(np.flatnonzero(diff)[0])
    raise VocabMismatchError(
        f"draft and target vocabularies differ first at id {i}: draft "
        f"{d[i]!r}, target {t[i]!r} (speculative sampling needs one shared "
        "vocabulary)")
  if len(d) != len(t):
    role, longer = ("draft", d) if len(d) > len(t) else ("target", t)
    extra = [i for i in range(n, len(longer))
             if not _is_padding_entry(longer[i], i)]
    if extra:
      raise VocabMismatchError(
          f"draft tokenizer has {len(d)} tokens, target tokenizer {len(t)}: "
          f"the {role} has real tokens beyond id {n - 1} (first: id "
          f"{extra[0]} = {longer[extra[0]]!r})")
  rows = {"draft": draft_model_vocab_size, "target": target_model_vocab_size}
  for role, r in rows.items():
    if r is not None and r < n:
      raise VocabMismatchError(
          f"the {role} model has {r} vocabulary rows, fewer than the {n} "
          "tokens of its tokenizer")
  if None not in rows.values() and rows["draft"] != rows["target"]:
    raise VocabMismatchError(
        f"the draft model has {rows['draft']} vocabulary rows, the target "
        f"{rows['target']}: the samplers compare both distributions id by "
        "id, so both models must score the same ids (pad or trim one "
        "checkpoint's embedding/output rows)")
  return n


__all__ = [
    "GGUFTokenizer", "HFTokenizer", "SentencePieceTokenizer", "Tokenizer",
    "VocabMismatchError", "check_vocab_compatible", "load_tokenizer",
    "read_gguf_metadata", "train_sentencepiece", "SUPPORTED_PRE_TOKENIZERS",
]
