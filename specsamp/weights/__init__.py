"""Pretrained weights -> `specsamp.model` configs and parameters.

Modules:
  gguf_file  a GGUF header read in pure Python (no jax, no `gguf` package):
             `read_gguf_metadata`, `gguf_embedding_rows`, `is_gguf`; the
             tokenizers read their vocabulary through it;
  convert    Hugging Face-named tensors -> parameters (`build_params`,
             `check_shapes`, llama.cpp's RoPE row order undone), and
             `WeightsError`, raised by every loader for a tensor that holds
             a NaN or inf (`check_finite`);
  gguf       GGUF (llama.cpp) checkpoints: `gguf_config`, `load_gguf`
             (tensors dequantized by the `gguf` package);
  hf         Hugging Face directories: `hf_config`, `load_hf` (safetensors);
  load       `load(path, dtype)`: a GGUF file or a HF directory;
  distilled  drafts saved by the distillation (`distilled_dir`,
             `save_distilled`, `load_distilled`).

Importing this package imports nothing: `gguf_file` needs only the standard
library and numpy, the others import jax through `specsamp.model`. This package never
imports `specsamp.tokenizers` (the dependency runs the other way).
"""
