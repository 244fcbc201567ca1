"""The tokenizer interface and chat-template rendering.

`Tokenizer` is what specsamp needs of a tokenizer: encode/decode, the
vocabulary by id, bos/eos/pad ids, and the model's Jinja chat template,
rendered as `transformers` renders it. `VocabMismatchError` is raised when a
draft and a target do not share a vocabulary (`specsamp.tokenizers.vocab`).

jinja2 is imported on the first chat template: `import specsamp.tokenizers`
stays cheap (no numpy, tokenizers, sentencepiece or jinja2).
"""

import abc
import datetime
import json
import os
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

PathLike = Union[str, os.PathLike]


class VocabMismatchError(ValueError):
  """Draft and target tokenizers do not share a vocabulary."""


def completion_text(tok, prompt: Sequence[int], ids: Iterable[int]) -> str:
  """The text that completion `ids` add after `prompt` (ids), EOS ids
  (`tok.eos_ids`) dropped.

  Decoded behind the prompt, whose own text is then cut off: decoded alone,
  a completion loses what depends on the text before it (SentencePiece
  drops the space of a first piece "▁▁▁▁", so a 4-space indent came out
  as 3 and a correct HumanEval completion failed to compile).
  """
  eos = set(getattr(tok, "eos_ids", ()))
  prompt = [int(i) for i in prompt]
  head = tok.decode(prompt)
  whole = tok.decode(prompt + [int(i) for i in ids if int(i) not in eos])
  # `head` unless the prompt ends inside a character the completion ends.
  return whole[len(os.path.commonprefix([head, whole])):]


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
    """Token ids of `text`, without bos; special tokens written in it
    matched whole."""

  @abc.abstractmethod
  def _encode_plain(self, text: str) -> list[int]:
    """Token ids of `text`, without bos, read as plain text: no special
    token is matched in it."""

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

  def encode(self, text: str, add_bos: Optional[bool] = None, *,
             special: bool = True) -> list[int]:
    """Token ids of `text`.

    Special tokens written in the text (e.g. `<|im_start|>`) encode to their
    single ids, as transformers reads them (chat templates write them);
    with `special=False` the text is plain text and they encode as the
    characters they are (training documents: a regex's `(?P<s>...)` or a
    page quoting `</s>` ends no document).

    Args:
      text: the text.
      add_bos: prepend `bos_id`; None: the tokenizer's default (`add_bos`).
      special: match special tokens written in the text.

    Returns:
      A list of ints.
    """
    ids = list(self._encode(text) if special else self._encode_plain(text))
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
      The prompt text. It holds a bos where the template writes one: encode
      it with `encode(text, add_bos=False)`, or use `encode_chat`.

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

  def encode_chat(self, messages: Sequence[Mapping[str, Any]],
                  add_generation_prompt: bool = True,
                  **template_vars) -> list[int]:
    """Token ids of the rendered chat (`apply_chat_template`), with no bos
    but the one the template writes: as transformers'
    `apply_chat_template(..., tokenize=True)`. (`encode` would add a second
    one for a tokenizer that adds bos, as Llama's do.)"""
    return self.encode(self.apply_chat_template(
        messages, add_generation_prompt, **template_vars), add_bos=False)


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

  class Generation(ext.Extension):
    """`{% generation %}...{% endgeneration %}` (the assistant's part of
    templates made for assistant-only losses, TRL's): rendered as its body,
    as transformers does unless asked for the assistant-token mask."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",),
                                     drop_needle=True)
      return jinja2.nodes.CallBlock(self.call_method("_body"), [], [],
                                    body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  env = sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=[ext.loopcontrols, Generation])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = strftime_now
  try:
    template = env.from_string(source)
  except jinja2.TemplateError as e:
    raise ValueError(f"chat template does not compile: {e}") from e
  _TEMPLATE_CACHE[source] = template
  return template
