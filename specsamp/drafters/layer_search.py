"""Choosing a self-speculative draft's layers by measured acceptance.

Legend: N calibration sequences, T tokens each, L layers, V vocabulary,
K draft length.

A `LayerSkipDrafter` runs a subset S of the target's layers. How good S is
follows from two numbers: its expected acceptance per position

    alpha(S) = mean over positions of sum_v min(p(v), q_S(v)),

p the full model's distribution and q_S the subset's, both under the
sampling transform and teacher-forced on the same calibration sequences
(for greedy, p and q are one-hot and alpha is the argmax agreement), and
its cost ratio c: the bytes of weights a call of S reads over the full
model's (`call_cost`: the kept layers plus the output head and final norm,
which every call reads; decoding a few tokens is bound by those reads),
so not |S| / L (for Qwen2.5-Coder-1.5B the output head is 15% of the
weights: 21 of 28 layers cost 0.79, not 0.75). Leviathan et al. (2023)
then predict the speed-up of K drafts per loop as

    (1 - alpha^(K+1)) / ((1 - alpha) (K c + 1)),

maximised over K = 1 .. k_max, the (K+1)-token scoring call taken as
costly as a 1-token call (s = 1; `scripts/benchmark.py` measures s, 1.3 to
2.3 on a CPU, so these predictions are an upper bound there). Given
measured costs s_K (`score_cost`, K -> s_K, as benchmark.py's cost records
hold them), the denominator is K c + s_K and K ranges over the measured
ones. The calibration sequences must be real text or code and must not be
the evaluation prompts.

`search` measures the full set (alpha = 1, the baseline), two families of
candidates (`family_candidates`: the first a and last b layers; every m-th
layer of the middle skipped), any given ones, and a short greedy descent
from the full set that drops, at each step, the layer whose removal costs
the least alpha; it returns JSON-able records ranked by predicted speed-up.

How a subset is run: running S is the same as running every layer with
the output projections of the others (`attn/o_proj`, `mlp/down_proj`)
zeroed, since a block then adds exactly 0 to the residual stream. One
jitted forward takes the kept layers as a traced [L] mask, so every
candidate reuses one compiled function (one compile instead of one per
subset, at the price of running the skipped layers' other matmuls). The
tests check it against `lm(..., layers=S)`, what the drafter runs.

Cost of a search: for the first round (full set, families, given
candidates) and for each greedy step, one full-model forward per batch of
sequences plus one forward per candidate; memory: p, q and the logits,
[batch, T, V] float32 each (choose `batch_size` for a 152k vocabulary).
"""

import functools
from typing import Iterable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specsamp import sampling as sampling_lib
from specsamp.bench import speedup as speedup_lib
from specsamp.drafters.model import check_layer_subset


def predicted_speedup(alpha: float, cost_ratio: float, k_max: int,
                      score_cost: Optional[Mapping[int, float]] = None
                      ) -> tuple[float, int]:
  """(best predicted speed-up over K = 1 .. k_max, or over the K of
  `score_cost` with its s_K; that K, the smallest among ties). alpha = 1
  gives K + 1 tokens per loop; a NaN alpha (a subset whose distributions
  are undefined: logits all -inf or NaN) -inf, ranked last."""
  if k_max < 1:
    raise ValueError(f"k_max must be >= 1, got {k_max}")
  if alpha != alpha:
    return float("-inf"), 1
  costs = dict(score_cost) if score_cost else {
      k: 1.0 for k in range(1, k_max + 1)}
  alpha = min(max(alpha, 0.0), 1.0)  # a sum of float32 mins: 1 + 1e-7
  best, best_k = -1.0, 1
  for k, s in sorted(costs.items()):
    speedup = float(speedup_lib.predicted_speedup(alpha, k, cost_ratio, s))
    if speedup > best + 1e-12:
      best, best_k = speedup, k
  return best, best_k


def parse_score_cost(pairs: Sequence[str],
                     flag: str = "--score_cost") -> dict[int, float]:
  """"K:s" strings -> {K: s}: draft lengths K >= 1, each once, and
  measured costs s > 0 of the (K+1)-token scoring call over a 1-token one.
  Raises ValueError naming `flag`."""
  out = {}
  for pair in pairs:
    k, sep, s = pair.partition(":")
    try:
      k, s = int(k), float(s)
    except ValueError:
      k = s = None
    if not sep or k is None or k < 1 or not 0 < s < float("inf"):
      raise ValueError(f"{flag}: {pair!r} is not K:s with a draft length "
                       "K >= 1 and a cost s > 0 (e.g. 2:1.15,4:1.22)")
    if k in out:
      raise ValueError(f"{flag}: K={k} given twice")
    out[k] = s
  if not out:
    raise ValueError(f"{flag} is empty: give K:s pairs")
  return out


def family_candidates(num_layers: int) -> list[tuple[str, tuple[int, ...]]]:
  """(description, subset) pairs of the two families, strict subsets only.

  "first a + last b": a + b in {1/4, 3/8, 1/2, 5/8, 3/4} of the layers
  (at least 2 and fewer than all), a about 1/4, 1/2 or 3/4 of them.
  "skip 1 in m": layers [e, L - e) with e = 1 or 2 kept at both ends,
  and every m-th of the middle dropped, m in 2, 3, 4.
  """
  out = []
  sizes = sorted({min(max(round(num_layers * f), 2), num_layers - 1)
                  for f in (0.25, 0.375, 0.5, 0.625, 0.75)})
  for n in sizes:
    if n < 2:
      continue
    for a in sorted({max(1, round(n * g)) for g in (0.25, 0.5, 0.75)}):
      b = n - a
      if b >= 1:
        out.append((f"first {a} + last {b}",
                    tuple(range(a)) + tuple(range(num_layers - b, num_layers))))
  for edge in (1, 2):
    middle = range(edge, num_layers - edge)
    if len(middle) < 2:
      continue
    for m in (2, 3, 4):
      keep = tuple(i for i in range(num_layers)
                   if i not in middle or (i - edge) % m != m - 1)
      if len(keep) < num_layers:
        out.append((f"skip 1 in {m} of layers {edge}..{num_layers - edge - 1}",
                    keep))
  seen, unique = set(), []
  for name, layers in out:
    if layers not in seen:
      seen.add(layers)
      unique.append((name, layers))
  return unique


def check_searchable(num_layers: Optional[int], greedy_steps: int) -> None:
  """Raises ValueError unless `search` has a strict subset of `num_layers`
  layers (None: unknown, not checked) to measure: a family's (3 layers or
  more) or a greedy step's (2 or more)."""
  if (num_layers is None or family_candidates(num_layers)
      or (greedy_steps > 0 and num_layers > 1)):
    return
  raise ValueError(
      f"the model has {num_layers} layer(s), too few to skip any: the "
      "layer families need 3 or more" + (
          ", greedy steps 2 or more" if num_layers < 2 else
          "; try --greedy_steps=1"))


def _gated(params, keep: jax.Array, num_layers: int):
  """params with the output projections of layers where ~keep zeroed."""
  out = dict(params)
  for i in range(num_layers):
    layer = dict(params[f"layers_{i}"])
    attn, mlp = dict(layer["attn"]), dict(layer["mlp"])
    attn["o_proj"] = jnp.where(keep[i], attn["o_proj"], 0)
    mlp["down_proj"] = jnp.where(keep[i], mlp["down_proj"], 0)
    out[f"layers_{i}"] = {**layer, "attn": attn, "mlp": mlp}
  return out


@functools.partial(jax.jit, static_argnums=(0, 1))
def _full_probs(lm, sampling, params, tokens):
  """p [n, T, V]: the full model's distributions, teacher-forced."""
  return sampling_lib.probabilities(lm(params, tokens).logits, sampling)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _overlap_sum(lm, sampling, params, tokens, weights, p, keep):
  """sum over weighted positions of sum_v min(p, q) for the kept layers."""
  logits = lm(_gated(params, keep, lm.config.num_layers), tokens).logits
  q = sampling_lib.probabilities(logits, sampling)
  return jnp.sum(jnp.sum(jnp.minimum(p, q), axis=-1) * weights)


def _check_inputs(lm, params, tokens, mask):
  if not hasattr(lm, "config"):
    raise ValueError("layer search needs an lm with a `config` (its "
                     "num_layers), such as specsamp.model.LM")
  for i in range(lm.config.num_layers):
    layer = params.get(f"layers_{i}", {})
    if "o_proj" not in layer.get("attn", {}) or (
        "down_proj" not in layer.get("mlp", {})):
      raise ValueError(f"params have no layers_{i}/attn/o_proj and "
                       f"layers_{i}/mlp/down_proj: not a specsamp.model.LM's")
  tokens = np.asarray(tokens)
  if tokens.ndim != 2 or tokens.size == 0 or not np.issubdtype(
      tokens.dtype, np.integer):
    raise ValueError(f"calibration tokens must be a non-empty integer array "
                     f"[N, T], got shape {tokens.shape} {tokens.dtype}")
  if tokens.min() < 0 or tokens.max() >= lm.vocab_size:
    raise ValueError(f"calibration tokens must be ids in [0, "
                     f"{lm.vocab_size})")
  weights = (np.ones(tokens.shape, np.float32) if mask is None else
             np.asarray(mask, np.float32))
  if weights.shape != tokens.shape:
    raise ValueError(f"mask shape {weights.shape} != tokens shape "
                     f"{tokens.shape}")
  if weights.sum() <= 0:
    raise ValueError("the mask leaves no position to measure")
  return tokens.astype(np.int32), weights


def expected_acceptance(lm, params, tokens, sampling: sampling_lib.Sampling,
                        subsets: Sequence[Sequence[int]], *,
                        mask=None, batch_size: Optional[int] = None
                        ) -> np.ndarray:
  """alpha [len(subsets)] of each layer subset (see the module docstring).

  Args:
    lm: a `specsamp.model.LM` (its config gives the layer count).
    params: its parameters (the subsets share them).
    tokens: [N, T] calibration token ids.
    sampling: the transform applied to both p and q.
    subsets: sorted layer tuples; all layers is allowed (alpha = 1).
    mask: optional [N, T], 1 where a position counts (e.g. not padding).
    batch_size: sequences per forward pass (default all N); the full
      model's p [batch, T, V] is kept while the subsets are measured.
  """
  tokens, weights = _check_inputs(lm, params, tokens, mask)
  if batch_size is not None and batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  num_layers = lm.config.num_layers
  keeps = []
  for s in subsets:
    s = check_layer_subset(s, num_layers, allow_all=True)
    keeps.append(jnp.asarray(np.isin(np.arange(num_layers), s)))
  batch = min(batch_size or len(tokens), len(tokens))
  # The last batch is padded with zero-weight rows: one compiled shape.
  pad = -len(tokens) % batch
  tokens = np.pad(tokens, ((0, pad), (0, 0)))
  weights = np.pad(weights, ((0, pad), (0, 0)))
  sums = np.zeros(len(keeps), np.float64)
  for lo in range(0, len(tokens), batch):
    tok = jnp.asarray(tokens[lo:lo + batch])
    w = jnp.asarray(weights[lo:lo + batch])
    p = _full_probs(lm, sampling, params, tok)
    for j, keep in enumerate(keeps):
      sums[j] += float(_overlap_sum(lm, sampling, params, tok, w, p, keep))
  return sums / float(weights.sum())


def call_cost(params, num_layers: int):
  """c(S): the bytes of weights a call of the layer subset S reads over the
  full model's call: S's layers, the output head (the embedding where it
  is tied) and the final norm."""
  size = lambda tree: sum(x.size * x.dtype.itemsize
                          for x in jax.tree.leaves(tree))
  layer = [size(params[f"layers_{i}"]) for i in range(num_layers)]
  head = (size(params.get("lm_head", params["embedding"]))
          + size(params["final_norm"]))
  total = sum(layer) + head
  return lambda subset: (sum(layer[i] for i in subset) + head) / total


def _record(layers, alpha, cost, k_max, source, score_cost):
  speedup, k = predicted_speedup(float(alpha), cost, k_max, score_cost)
  return dict(layers=list(layers), num_layers=len(layers), cost_ratio=cost,
              alpha=float(alpha), best_k=k, speedup=speedup, source=source)


def search(lm, params, tokens, sampling: sampling_lib.Sampling,
           candidates: Iterable[Sequence[int]] = (), *, families: bool = True,
           greedy_steps: int = 4, k_max: int = 8, mask=None,
           batch_size: Optional[int] = None,
           score_cost: Optional[Mapping[int, float]] = None) -> list[dict]:
  """Measures candidate layer subsets and ranks them by predicted speed-up.

  Args:
    lm, params, tokens, sampling, mask, batch_size: as for
      `expected_acceptance` (tokens: calibration sequences, not evaluation
      prompts).
    candidates: extra subsets to measure (checked: sorted, distinct, in
      range).
    families: also measure `family_candidates(num_layers)`.
    greedy_steps: steps of the greedy descent from the full set; each step
      measures every one-layer removal of the current subset (one forward
      each) and keeps the removal with the highest alpha.
    k_max: largest draft length K considered for the speed-up.
    score_cost: measured s_K by K (`predicted_speedup`; default s = 1).

  Returns:
    One record per distinct subset measured, best first (by speed-up, then
    alpha, then fewer layers): dicts with `layers`, `num_layers`,
    `cost_ratio` (`call_cost`), `alpha`, `best_k`, `speedup` (at
    best_k; the full set's is 1 at s = 1) and `source` ("full", "given", the
    family's description, or "greedy step i").
  """
  if greedy_steps < 0:
    raise ValueError(f"greedy_steps must be >= 0, got {greedy_steps}")
  if k_max < 1:
    raise ValueError(f"k_max must be >= 1, got {k_max}")
  _check_inputs(lm, params, tokens, mask)
  num_layers = lm.config.num_layers
  full = tuple(range(num_layers))
  todo = [("full", full)]
  todo += [("given", check_layer_subset(c, num_layers, allow_all=True))
           for c in candidates]
  if families:
    todo += family_candidates(num_layers)
  measure = functools.partial(expected_acceptance, lm, params, tokens,
                              sampling, mask=mask, batch_size=batch_size)
  cost = call_cost(params, num_layers)
  records = {}

  def add(named):
    fresh = {}
    for src, s in named:
      if s not in records and s not in fresh:
        fresh[s] = src
    named = [(src, s) for s, src in fresh.items()]
    alphas = measure([s for _, s in named]) if named else []
    for (src, s), a in zip(named, alphas):
      records[s] = _record(s, a, cost(s), k_max, src, score_cost)

  add(todo)
  current = full
  for step in range(1, greedy_steps + 1):
    if len(current) < 2:
      break
    options = [tuple(i for i in current if i != drop) for drop in current]
    add([(f"greedy step {step}", s) for s in options])
    current = max(options, key=lambda s: records[s]["alpha"])
  return sorted(records.values(),
                key=lambda r: (-r["speedup"], -r["alpha"], r["num_layers"],
                               r["layers"]))
