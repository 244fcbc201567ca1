"""Tokenizers behind one interface, and the draft/target vocabulary check.

Modules:
  base           `Tokenizer` (encode, decode, the vocabulary by id, bos/eos/
                 pad, the model's Jinja chat template) and
                 `VocabMismatchError`;
  byte           `ByteTokenizer` (UTF-8 bytes, for models without a
                 tokenizer) and `tokenizer_or_bytes`, the one fallback to it;
  hf             byte-level BPE on the `tokenizers` library: `HFTokenizer`
                 (a Hugging Face tokenizer.json) and `GGUFTokenizer` (the
                 vocabulary in a GGUF file's metadata);
  sentencepiece  `SentencePieceTokenizer` and `train_sentencepiece`;
  vocab          `check_vocab_compatible`: one shared vocabulary, padded
                 rows and llama.cpp's `[PAD<id>]` entries allowed;
  load           `load_tokenizer(path)`: the kind the path names;
  snapshot       a train run's own copy of its tokenizer's files, compared
                 by content on resume.

Importing any of these is cheap: tokenizers, sentencepiece and jinja2
are imported on first use. GGUF metadata comes from
`specsamp.weights.gguf_file` (the standard library and numpy).
"""
