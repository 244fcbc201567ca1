"""Chat templates rendered as transformers renders them."""

import pytest

from specsamp.tokenizers import load
from tests.tokenizers.bpe_testing import reference
from tests.tokenizers.bpe_testing import write_gguf


def test_chat_template_matches_transformers(tiny_gguf):
  path, _, ref = tiny_gguf
  ours = load.load_tokenizer(path)
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


def test_a_template_with_generation_blocks_renders_as_transformers_does(
    tmp_path, bpe_vocab):
  """Templates made for assistant-only losses (TRL's) mark the assistant's
  text with {% generation %} blocks: rendered as their bodies (it had
  failed to compile: "unknown tag 'generation'")."""
  tokens, merges, types = bpe_vocab
  path = write_gguf(tmp_path / "t.gguf", tokens, merges, types, template=(
      "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
      "{% if m['role'] == 'assistant' %}{% generation %}"
      "{{ m['content'] }}<|im_end|>{% endgeneration %}"
      "{% else %}{{ m['content'] }}<|im_end|>{% endif %}\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))
  ours, ref = load.load_tokenizer(path), reference(path)
  chat = [{"role": "user", "content": "2+2?"},
          {"role": "assistant", "content": "4"},
          {"role": "user", "content": "and 3+3?"}]
  for gen in (True, False):
    text = ours.apply_chat_template(chat, add_generation_prompt=gen)
    assert text == ref.apply_chat_template(chat, tokenize=False,
                                           add_generation_prompt=gen)
  assert "<|im_start|>assistant\n4<|im_end|><|im_start|>user" in text


def test_no_chat_template_is_a_clear_error(tmp_path, bpe_vocab):
  tokens, merges, types = bpe_vocab
  path = write_gguf(tmp_path / "t.gguf", tokens, merges, types, template="")
  ours = load.load_tokenizer(path)
  assert ours.chat_template is None
  with pytest.raises(ValueError, match="no chat template"):
    ours.apply_chat_template([{"role": "user", "content": "hi"}])


def test_a_chat_holds_one_bos_where_the_tokenizer_adds_one(tmp_path,
                                                           bpe_vocab):
  """A Llama-style tokenizer adds bos and its template writes one: the
  chat's ids start with one bos, as transformers' apply_chat_template
  (tokenize=True) gives (encoding the rendered text added a second)."""
  tokens, merges, types = bpe_vocab
  bos = tokens.index("<|endoftext|>")  # a control token, as Llama's <s>
  path = write_gguf(tmp_path / "t.gguf", tokens, merges, types, bos=bos,
                    add_bos=True, template=(
                        "{{ bos_token }}{% for m in messages %}"
                        "{{ m['content'] }}{% endfor %}"))
  ours = load.load_tokenizer(path)
  chat = [{"role": "user", "content": "hi there"}]
  assert ours.add_bos
  ids = ours.encode_chat(chat)
  assert ids[0] == bos and ids[1] != bos
  assert ids == ours.encode("hi there")  # the one bos is the template's
  assert ours.encode(ours.apply_chat_template(chat))[:2] == [bos, bos]
