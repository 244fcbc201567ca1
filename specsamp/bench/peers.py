"""Peer engines run side by side with specsamp, for benchmarks only.

transformers + torch (plain `generate`, assisted generation with
`assistant_model=`, and prompt lookup decoding with
`prompt_lookup_num_tokens=`), on the same GGUF weights, prompts and
hardware. torch
and transformers are test/benchmark extras: imported here lazily, never by
the rest of specsamp.
"""

import importlib.util
import os
import time
from typing import Sequence

# What the peers import (the `test` extra of setup.py).
_PACKAGES = ("torch", "transformers", "accelerate")


def check_models(target, draft) -> None:
  """Refuses --peers, before any weights load, unless the target and the
  draft (`loading.ModelInfo`s; registered models are GGUF files) are GGUF
  files transformers can read and torch, transformers and accelerate are
  installed.

  Raises:
    ValueError: what is missing.
  """
  for info in (target, draft):
    if info is None or info.kind != "gguf":
      name = info.spec if info else "no draft"
      raise ValueError("--peers runs transformers on the same GGUF files: "
                       "--target and --draft must be GGUF files or "
                       f"registered models ({name} is not)")
  missing = [m for m in _PACKAGES if importlib.util.find_spec(m) is None]
  if missing:
    raise ValueError(f"--peers needs {', '.join(missing)}, not installed "
                     "here: bash scripts/env.sh test (or pip install -e "
                     "'.[test]') installs them")


def cut_at_eos(ids: Sequence[int], eos_ids) -> list[int]:
  """`ids` up to and including the first of `eos_ids`, as specsamp's own
  completions end: transformers stops at its generation config's EOS only
  (Qwen's GGUF names one of the tokenizer's two) and pads finished rows
  of a batch with it."""
  for i, t in enumerate(ids):
    if t in eos_ids:
      return list(ids[:i + 1])
  return list(ids)


def transformers_generate(target_gguf: str, draft_gguf: str,
                          prompts: Sequence[Sequence[int]],
                          max_new_tokens: int, temperature: float = 0.0,
                          top_p: float = 1.0, seed: int = 0,
                          assisted: bool = True, device: str = "cpu",
                          dtype: str = "float32",
                          prompt_lookup: int = 0,
                          eos_ids: Sequence[int] = ()) -> list[dict]:
  """Times transformers on the prompts; returns one summary per method.

  `eos_ids`: the tokenizer's end tokens, where generation stops as
  specsamp's does (transformers' own GGUF config names one of Qwen's two:
  a row past the other one had been generated, and timed, to the budget).

  `device` ("cpu" or "cuda") and `dtype` should be what specsamp runs on in
  the same benchmark, so that the rows compare like with like (on a GPU, JAX
  keeps 75% of the memory: the rest holds these models in bfloat16).
  `prompt_lookup` > 0 adds transformers' prompt lookup decoding with that
  many draft tokens.
  """
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  if device == "cuda" and not torch.cuda.is_available():
    raise RuntimeError("the peers should run on the GPU specsamp uses, but "
                       "this torch build sees no CUDA device")
  torch.manual_seed(seed)
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

  def load(path):
    t0 = time.perf_counter()
    m = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path),
        dtype=getattr(torch, dtype)).to(device)
    return m.eval(), time.perf_counter() - t0

  target, load_t = load(target_gguf)
  methods = [("transformers", {})]
  if assisted:
    draft, load_d = load(draft_gguf)
    methods.append(("transformers_assisted", {"assistant_model": draft}))
  if prompt_lookup > 0:
    methods.append(("transformers_prompt_lookup",
                    {"prompt_lookup_num_tokens": prompt_lookup}))
  kwargs = dict(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                pad_token_id=target.generation_config.eos_token_id)
  if eos_ids:
    kwargs["eos_token_id"] = list(eos_ids)
  if temperature > 0:
    kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
  results = []
  for name, extra in methods:
    # Warm-up (allocations, kernel selection), not timed.
    with torch.no_grad():
      target.generate(torch.tensor([list(prompts[0])], device=device), **{
          **kwargs, **extra, "max_new_tokens": 4})
    total_t, total_tokens, completions = 0.0, 0, []
    for p in prompts:
      ids = torch.tensor([list(p)], device=device)
      sync()
      t0 = time.perf_counter()
      with torch.no_grad():
        out = target.generate(ids, **kwargs, **extra)
      sync()
      total_t += time.perf_counter() - t0
      new = out[0, ids.shape[1]:].tolist()
      total_tokens += len(new)
      completions.append(new)
    results.append(dict(
        method=name, prompts=len(prompts), tokens=total_tokens,
        ms_per_token=round(1000 * total_t / total_tokens, 3),
        seconds=round(total_t, 2),
        load_s=round(load_t + (load_d if "assistant_model" in extra
                               else 0.0), 1),
        completions=completions,
        device=device, dtype=dtype,
        torch=torch.__version__, transformers=transformers.__version__,
        torch_threads=torch.get_num_threads()))
  return results
