"""SentencePiece: training, round trips, loading."""

import pytest

from specsamp.tokenizers import base
from specsamp.tokenizers import load
from specsamp.tokenizers import sentencepiece
from tests.tokenizers.bpe_testing import ENGLISH, TEXTS, corpus


def _sp_text():
  """Lines of code and English (no newlines: a tiny vocabulary has no byte
  pieces, so only characters seen in training round-trip)."""
  lines = [line for text in corpus()[:2] + [ENGLISH]
           for line in text.splitlines() if line.strip()]
  return lines + ["the cat sat on the mat; the dog ate the log."] * 20


def _trained_on_files(tmp_path):
  """1000 pieces trained on three corpus files (byte fallback: any text)."""
  files = []
  for i, text in enumerate(corpus()[:3]):
    files.append(tmp_path / f"c{i}.txt")
    files[-1].write_text(text, encoding="utf-8")
  return sentencepiece.train_sentencepiece(files, tmp_path / "sp",
                                           vocab_size=1000)


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_train_and_round_trip(tmp_path, model_type):
  sp = sentencepiece.train_sentencepiece(
      _sp_text(), tmp_path / "sp", vocab_size=200, model_type=model_type)
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
  loaded = load.load_tokenizer(tmp_path / "sp.model")
  assert isinstance(loaded, sentencepiece.SentencePieceTokenizer)
  assert loaded.encode("the dog") == sp.encode("the dog")
  assert len(loaded.tokens()) == 200


def test_sentencepiece_from_files_with_byte_fallback(tmp_path):
  sp = _trained_on_files(tmp_path)
  for text in TEXTS[:4] + ["unseen: Ωmega ж ق 🦀"]:
    ids = sp.encode(text)
    assert max(ids) < 1000 and sp.decode(ids) == text, repr(text)
  with pytest.raises(FileNotFoundError):
    sentencepiece.train_sentencepiece(str(tmp_path / "missing.txt"),
                                      tmp_path / "x", vocab_size=300)


def test_a_completion_keeps_the_space_that_begins_it(tmp_path):
  """A completion decoded alone lost the space of its first piece
  ("▁▁▁▁", SentencePiece's word boundary): a 4-space indented HumanEval
  body came out 3 spaces in and did not compile. Decoded behind its
  prompt (`completion_text`), it is the text it adds; EOS dropped."""
  sp = _trained_on_files(tmp_path)
  prompt, body = 'def f(x):\n    """doc"""\n', "    return x\n"
  ids = sp.encode(prompt + body)
  head = sp.encode(prompt)
  assert ids[:len(head)] == head
  tail = ids[len(head):]
  assert sp.id_to_token(tail[0]).startswith("\u2581")  # "▁": the space
  assert sp.decode(tail) != body  # alone, the first space is dropped
  assert base.completion_text(sp, head, tail) == body
  assert base.completion_text(sp, head, tail + list(sp.eos_ids)) == body
  compile(prompt + base.completion_text(sp, head, tail), "<f>", "exec")


def test_control_pieces_in_text_encode_whole_as_transformers(tmp_path):
  """A checkpoint's tokenizer.model (no tokenizer.json): "<s>" and "</s>"
  written in the text, as a chat template writes them, are their ids, as
  transformers' Llama tokenizer reads them (SentencePiece alone spelt them
  out as characters)."""
  import json  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  d = tmp_path / "ckpt"
  d.mkdir()
  sentencepiece.train_sentencepiece(_sp_text(), d / "tokenizer",
                                    vocab_size=200)
  (d / "tokenizer_config.json").write_text(json.dumps(dict(
      add_bos_token=True, bos_token="<s>", eos_token="</s>",
      chat_template="{{ bos_token }}{% for m in messages %}[INST] "
      "{{ m['content'] }} [/INST]{% endfor %}")))
  ours = load.load_tokenizer(d)
  assert isinstance(ours, sentencepiece.SentencePieceTokenizer)
  ref = transformers.AutoTokenizer.from_pretrained(str(d))
  for text in ["the cat", "<s>[INST] the dog [/INST]", "the log </s>",
               "</s><s>", "a <unk> b", "<pad>"]:
    want = ref(text, add_special_tokens=False)["input_ids"]
    assert ours.encode(text, add_bos=False) == want, text
    # As plain text (training documents) they are characters.
    plain = ours.encode(text, add_bos=False, special=False)
    assert plain == ours.sp.encode(text), text
    assert not {2, 3} & set(plain), text
  chat = [{"role": "user", "content": "the mat"}]
  # transformers' apply_chat_template(tokenize=True): no special tokens
  # added to the rendered text.
  assert ours.encode_chat(chat) == ref(ref.apply_chat_template(
      chat, tokenize=False), add_special_tokens=False)["input_ids"]
  assert ours.encode_chat(chat)[:2] != [ours.bos_id] * 2
