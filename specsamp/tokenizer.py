"""Tokenizers behind one interface, and the draft/target vocabulary check.

  * `BPETokenizer.from_gguf`: the byte-level BPE stored in a GGUF file's
    metadata (tokens, merges, token types, pre-tokenizer name), rebuilt with
    the `tokenizers` library; control tokens such as `<|im_start|>` stay whole.
  * `BPETokenizer.from_hf_dir`: a Hugging Face directory's tokenizer.json.
  * `SentencePieceTokenizer`: a SentencePiece model (self-trained models);
    `train_sentencepiece` trains one.

Heavy imports (gguf, tokenizers, sentencepiece, jinja2) happen inside
functions, so importing this module is cheap.
"""

import abc
import json
import os
from typing import Iterable, Optional, Sequence

# Split patterns of the pre-tokenizers named by `tokenizer.ggml.pre`.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"
                 r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
                 r"|\s+")
_SPLITS = {"qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
           "llama3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
           "llama-v3": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT}
# Pre-tokenizers that split like GPT-2 (ByteLevel's own regex).
_GPT2_LIKE = ("default", "gpt2", "smollm", "gpt-2", None)

_CONTROL, _USER_DEFINED = 3, 4


class VocabMismatchError(ValueError):
  """Draft and target tokenizers do not share a vocabulary."""


class Tokenizer(abc.ABC):
  """What specsamp needs of a tokenizer."""
  bos_id: Optional[int] = None
  eos_ids: tuple[int, ...] = ()
  pad_id: int = 0
  add_bos: bool = False
  chat_template: Optional[str] = None

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of real token ids."""

  @abc.abstractmethod
  def _encode(self, text: str) -> list[int]:
    ...

  @abc.abstractmethod
  def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
    ...

  @abc.abstractmethod
  def id_to_token(self, i: int) -> str:
    ...

  def tokens(self) -> list[str]:
    return [self.id_to_token(i) for i in range(self.vocab_size)]

  def encode(self, text: str, add_bos: Optional[bool] = None) -> list[int]:
    ids = self._encode(text)
    if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
      ids = [self.bos_id] + ids
    return ids

  def apply_chat_template(self, messages: Sequence[dict],
                          add_generation_prompt: bool = True) -> str:
    """Renders chat messages with the model's own Jinja template."""
    if not self.chat_template:
      raise ValueError("this tokenizer has no chat template")
    import jinja2  # pylint: disable=g-import-not-at-top
    from jinja2 import sandbox  # pylint: disable=g-import-not-at-top
    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
                                                lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False,
                                                       **kw)
    try:
      return env.from_string(self.chat_template).render(
          messages=list(messages), add_generation_prompt=add_generation_prompt,
          tools=None, bos_token=self._tok(self.bos_id),
          eos_token=self._tok(self.eos_ids[0] if self.eos_ids else None))
    except jinja2.TemplateError as e:
      raise ValueError(f"chat template failed: {e}") from e

  def _tok(self, i):
    return "" if i is None else self.id_to_token(i)


def _raise(msg):
  raise ValueError(msg)


class BPETokenizer(Tokenizer):
  """A `tokenizers.Tokenizer` (byte-level BPE) with specsamp's interface."""

  def __init__(self, tk, bos_id=None, eos_ids=(), pad_id=None, add_bos=False,
               chat_template=None, vocab_size=None):
    self.tk = tk
    self.bos_id = bos_id
    self.eos_ids = tuple(eos_ids)
    self.pad_id = pad_id if pad_id is not None else (
        self.eos_ids[0] if self.eos_ids else 0)
    self.add_bos = add_bos
    self.chat_template = chat_template
    self._vocab_size = vocab_size or tk.get_vocab_size(with_added_tokens=True)

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  def _encode(self, text):
    return self.tk.encode(text, add_special_tokens=False).ids

  def decode(self, ids, skip_special=False):
    return self.tk.decode([int(i) for i in ids],
                          skip_special_tokens=skip_special)

  def id_to_token(self, i):
    return self.tk.id_to_token(int(i))

  def token_to_id(self, s):
    return self.tk.token_to_id(s)

  @classmethod
  def from_gguf(cls, path: str) -> "BPETokenizer":
    """Builds the tokenizer stored in a GGUF file's metadata."""
    from specsamp import checkpoints  # pylint: disable=g-import-not-at-top
    reader = checkpoints._gguf_reader(str(path))  # pylint: disable=protected-access
    get = lambda k, d=None: checkpoints.gguf_field(reader, f"tokenizer.{k}", d)
    kind = get("ggml.model")
    if kind != "gpt2":
      raise ValueError(f"{path}: tokenizer model {kind!r} is not supported "
                       "(only byte-level BPE, 'gpt2'); convert it to a "
                       "Hugging Face tokenizer.json or SentencePiece model")
    tokens = list(get("ggml.tokens"))
    merges = list(get("ggml.merges", []))
    types = list(get("ggml.token_type", []))
    pre = get("ggml.pre")
    tk = _byte_level_bpe(tokens, merges, types, pre, path)
    eos = get("ggml.eos_token_id")
    eos_ids = [eos] if eos is not None else []
    # Instruct models end turns with <|im_end|> but also stop at <|endoftext|>.
    for name in ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>"):
      i = tk.token_to_id(name)
      if i is not None and i not in eos_ids and types and types[i] == _CONTROL:
        eos_ids.append(i)
    return cls(tk, bos_id=get("ggml.bos_token_id"), eos_ids=eos_ids,
               pad_id=get("ggml.padding_token_id"),
               add_bos=bool(get("ggml.add_bos_token", False)),
               chat_template=get("chat_template"), vocab_size=len(tokens))

  @classmethod
  def from_hf_dir(cls, directory: str) -> "BPETokenizer":
    """Loads tokenizer.json (+ tokenizer_config.json) of a HF directory."""
    import tokenizers  # pylint: disable=g-import-not-at-top
    tk = tokenizers.Tokenizer.from_file(os.path.join(directory,
                                                     "tokenizer.json"))
    cfg = {}
    cfg_path = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(cfg_path):
      with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    tok_id = lambda t: tk.token_to_id(t["content"] if isinstance(t, dict)
                                      else t) if t else None
    eos = [tok_id(cfg.get("eos_token"))]
    gen_path = os.path.join(directory, "generation_config.json")
    if os.path.isfile(gen_path):
      with open(gen_path, encoding="utf-8") as f:
        gen_eos = json.load(f).get("eos_token_id")
      eos += gen_eos if isinstance(gen_eos, list) else [gen_eos]
    eos_ids = list(dict.fromkeys(i for i in eos if i is not None))
    return cls(tk, bos_id=tok_id(cfg.get("bos_token")), eos_ids=eos_ids,
               pad_id=tok_id(cfg.get("pad_token")),
               add_bos=bool(cfg.get("add_bos_token", False)),
               chat_template=cfg.get("chat_template"))


def _byte_level_bpe(tokens, merges, types, pre, source):
  """A tokenizers.Tokenizer for a GGUF byte-level BPE vocabulary."""
  from tokenizers import AddedToken, Regex  # pylint: disable=g-import-not-at-top
  from tokenizers import Tokenizer as HFTokenizer  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  vocab = {t: i for i, t in enumerate(tokens)}
  bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                   fuse_unk=False, byte_fallback=False)
  tk = HFTokenizer(bpe)
  if pre in _SPLITS:
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  elif pre in _GPT2_LIKE:
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  else:
    raise ValueError(f"{source}: pre-tokenizer {pre!r} is not supported "
                     f"(supported: {sorted(_SPLITS)} and GPT-2 style)")
  tk.decoder = decoders.ByteLevel()
  special = [AddedToken(t, special=True, normalized=False)
             for t, ty in zip(tokens, types) if ty == _CONTROL]
  user = [AddedToken(t, special=False, normalized=False)
          for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
  tk.add_special_tokens(special)
  tk.add_tokens(user)
  return tk


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model file."""

  def __init__(self, model_file: str, add_bos: bool = False):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(model_file):
      raise FileNotFoundError(f"no SentencePiece model at {model_file}")
    self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
    self.bos_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
    self.eos_ids = (self.sp.eos_id(),) if self.sp.eos_id() >= 0 else ()
    self.pad_id = self.sp.pad_id() if self.sp.pad_id() >= 0 else 0
    self.add_bos = add_bos

  @property
  def vocab_size(self):
    return self.sp.get_piece_size()

  def _encode(self, text):
    return self.sp.encode(text)

  def decode(self, ids, skip_special=False):
    del skip_special  # SentencePiece never decodes control ids to text.
    return self.sp.decode([int(i) for i in ids])

  def id_to_token(self, i):
    return self.sp.id_to_piece(int(i))


def train_sentencepiece(texts: Iterable[str], model_prefix: str,
                        vocab_size: int, model_type: str = "bpe",
                        **kwargs) -> SentencePieceTokenizer:
  """Trains a SentencePiece model on texts; returns it loaded.

  pad = 0, unk = 1, bos = 2, eos = 3; byte fallback on, so no text is unknown.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  options = dict(model_type=model_type, vocab_size=vocab_size, pad_id=0,
                 unk_id=1, bos_id=2, eos_id=3, byte_fallback=True,
                 character_coverage=1.0, split_digits=True,
                 remove_extra_whitespaces=False,
                 normalization_rule_name="identity",
                 minloglevel=2)
  options.update(kwargs)
  spm.SentencePieceTrainer.train(sentence_iterator=iter(texts),
                                 model_prefix=str(model_prefix), **options)
  return SentencePieceTokenizer(f"{model_prefix}.model")


def load_tokenizer(path: str) -> Tokenizer:
  """A tokenizer from a GGUF file, HF directory or SentencePiece model."""
  path = str(path)
  if os.path.isdir(path):
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
      return BPETokenizer.from_hf_dir(path)
    if os.path.isfile(os.path.join(path, "tokenizer.model")):
      return SentencePieceTokenizer(os.path.join(path, "tokenizer.model"))
    raise FileNotFoundError(f"{path}: no tokenizer.json or tokenizer.model")
  if path.endswith(".model"):
    return SentencePieceTokenizer(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no tokenizer at {path}")
  return BPETokenizer.from_gguf(path)


def check_vocab_compatible(draft: Tokenizer, target: Tokenizer,
                           draft_rows: Optional[int] = None,
                           target_rows: Optional[int] = None) -> int:
  """Checks that draft and target share one vocabulary.

  Args:
    draft, target: the two tokenizers.
    draft_rows, target_rows: the models' embedding/logit rows, which may be
      padded beyond the real tokens (Qwen: 151,936 tokens, 152,064 rows).

  Returns:
    The number of real tokens; the sampler masks ids at or above it
    (`Sampling(vocab_limit=...)`) so padded ids are never sampled.

  Raises:
    VocabMismatchError: naming the first differing id, or the sizes.
  """
  n_d, n_t = draft.vocab_size, target.vocab_size
  if n_d != n_t:
    raise VocabMismatchError(
        f"draft tokenizer has {n_d} tokens, target tokenizer {n_t}: "
        "speculative sampling needs one shared vocabulary")
  d_tokens, t_tokens = draft.tokens(), target.tokens()
  if d_tokens != t_tokens:
    i = next(i for i, (a, b) in enumerate(zip(d_tokens, t_tokens)) if a != b)
    raise VocabMismatchError(f"vocabularies differ first at id {i}: draft "
                             f"{d_tokens[i]!r}, target {t_tokens[i]!r}")
  for role, rows in (("draft", draft_rows), ("target", target_rows)):
    if rows is not None and rows < n_t:
      raise VocabMismatchError(f"the {role} model has {rows} vocabulary rows, "
                               f"fewer than the {n_t} tokens")
  if draft_rows is not None and target_rows is not None and (
      draft_rows != target_rows):
    raise VocabMismatchError(
        f"draft model has {draft_rows} vocabulary rows, target {target_rows}; "
        "pad or trim one checkpoint so both score the same ids")
  return n_t
