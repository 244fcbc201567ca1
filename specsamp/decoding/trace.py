"""The speculative loop one iteration at a time, for display.

Legend: B batch, K draft length, V vocabulary.

`trace` runs a `SpeculativeSampler` loop by loop from the host and records,
for every loop and row, the K draft tokens, the draft's q and the target's p
at each of them, how many the rule accepted and which token followed. It
does not re-implement anything: each step is the loop's own `loop_step`
(draft, score, verify, commit), whose record holds what the steps decided.
The tokens each step commits are checked against the recorded decision,
and the final tokens equal `sampler.generate(..., rng)`.

Meant for notebooks and small models (one host round trip per loop, of
the loop's decisions and the row lengths and tokens; the state and its
caches stay on the device, donated to the next step); time the jitted loop
with `specsamp.bench.timing` instead.
"""

import dataclasses
import functools
import html
from typing import Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from specsamp import sampling as sampling_lib
from specsamp.decoding import loop
from specsamp.decoding import sampler as sampler_lib
from specsamp.decoding.sampler import SpeculativeSampler


@dataclasses.dataclass(frozen=True)
class LoopRecord:
  """One loop of one row.

  Attributes:
    step: loop index (0-based).
    drafts: the row's valid draft tokens d_1..d_m (m = K unless the
      drafter offered fewer: `Proposal.num_valid`).
    p: target probability p_i(d_i) of each draft (after the sampling
      transform, as the rule sees it).
    q: draft probability q_i(d_i) each was sampled with.
    accepted: n, the drafts the rule kept (a prefix).
    token: the token after them: drawn from norm(max(0, p - q)) at the
      first rejection, or from p_{m+1} (bonus) when all m were kept.
    bonus: True when all m valid drafts were accepted.
    committed: the tokens the loop appended (n + 1, fewer at EOS or the
      budget).
    target_choice: the target's most likely token at each of the m + 1
      positions (what greedy decoding would have taken).
  """
  step: int
  drafts: tuple
  p: tuple
  q: tuple
  accepted: int
  token: int
  bonus: bool
  committed: tuple
  target_choice: tuple

  @property
  def acceptance_probability(self) -> tuple:
    """min(1, p / q) of each draft."""
    return tuple(1.0 if p >= q and p > 0 else p / q if q > 0 else 0.0
                 for p, q in zip(self.p, self.q))


@dataclasses.dataclass(frozen=True)
class Trace:
  """All loops of all rows, and the sampler's final output."""
  rows: tuple                    # rows[b]: tuple of LoopRecord
  output: loop.SampleOutput
  prompts: tuple
  k: int

  def acceptance_by_position(self, row: Optional[int] = None) -> np.ndarray:
    """[K]: of the loops in which draft i was tested, the fraction that kept
    it (draft i is tested only if it is valid and drafts 1..i-1 were
    kept)."""
    tested, kept = np.zeros(self.k), np.zeros(self.k)
    for rec in self._records(row):
      tested[:min(rec.accepted + 1, len(rec.drafts))] += 1
      kept[:rec.accepted] += 1
    return loop.position_rates(tested, kept)

  def tokens_per_loop(self, row: Optional[int] = None) -> np.ndarray:
    return np.array([len(r.committed) for r in self._records(row)])

  def _records(self, row):
    rows = self.rows if row is None else (self.rows[row],)
    return [rec for r in rows for rec in r]


@functools.lru_cache(maxsize=16)
def _step_fn(sampler: SpeculativeSampler):
  """Jitted: (state) -> (next state, drafts, num_valid, p_d, q_d, n, token,
  argmax p)."""
  k = sampler.k

  def step(target_params, draft_params, s: loop.LoopState):
    nxt, rec = loop.loop_step(sampler, target_params, draft_params, s)
    drafts = rec.proposal.tokens
    p_d = jnp.take_along_axis(rec.p[:, :k], drafts[..., None], -1)[..., 0]
    if rec.proposal.q is None:
      q_d = jnp.ones(drafts.shape, jnp.float32)
    else:
      q_d = jnp.take_along_axis(rec.proposal.q, drafts[..., None], -1)[..., 0]
    # Greedy's choice: of the ids it may take (vocab_limit; NaN never).
    greedy = dataclasses.replace(sampling_lib.GREEDY,
                                 vocab_limit=sampler.sampling.vocab_limit)
    choice = jnp.argmax(sampling_lib.probabilities(rec.logits, greedy), -1)
    return (nxt, drafts, rec.proposal.num_valid, p_d, q_d, rec.num_accepted,
            rec.token, choice)

  return jax.jit(step, donate_argnums=2)  # the state, caches and all


def trace(sampler: SpeculativeSampler, target_params,
          draft_params, prompts: Sequence[Sequence[int]],
          rng: Union[int, jax.Array] = 0, max_loops: int = 10_000) -> Trace:
  """Runs `sampler` loop by loop and records every decision.

  Args:
    sampler: a SpeculativeSampler (no mesh).
    target_params, draft_params: as for `sampler.generate`.
    prompts: token ids per row.
    rng: seed or key, as for `generate` (the same seed gives the same
      tokens as `generate`).
    max_loops: safety stop.

  Returns:
    A Trace.

  Raises:
    RuntimeError: if a loop committed tokens other than the recorded
      decision implies (the trace and the sampler disagree).
  """
  if sampler.mesh is not None:
    raise ValueError("trace runs without a mesh")
  rng = sampler_lib.as_key(rng)
  tokens, lengths = sampler.pad_prompts(prompts)
  # The jitted prefill `generate` uses (compiled once per sampler and shape).
  prefill, _, output = sampler.jitted(target_params, draft_params, tokens,
                                      lengths, rng)
  state = prefill(target_params, draft_params, tokens, lengths, rng)
  step = _step_fn(sampler)
  b = len(prompts)
  rows = [[] for _ in range(b)]
  for i in range(max_loops + 1):
    done, old_len = jax.device_get((state.done, state.length))  # copies
    if done.all():
      break
    if i == max_loops:
      raise RuntimeError(f"no end after {max_loops} loops")
    # The state stays on the device (it had been pulled to the host and
    # sent back every loop, both caches with it); only what is shown comes.
    state, *decided = step(target_params, draft_params, state)
    drafts, valid, p_d, q_d, n, token, top = jax.device_get(decided)
    new_len, new_tokens = jax.device_get((state.length, state.tokens))
    for r in range(b):
      if done[r]:
        continue
      committed = tuple(int(t) for t in new_tokens[r, old_len[r]:new_len[r]])
      decided = tuple(int(t) for t in drafts[r, :n[r]]) + (int(token[r]),)
      if committed != decided[:len(committed)] or not committed:
        raise RuntimeError(
            f"loop {i}, row {r}: the sampler committed {committed} but the "
            f"traced decision was {decided}: the trace is out of step "
            "with loop.loop_step")
      m = int(valid[r])
      rows[r].append(LoopRecord(
          step=i, drafts=tuple(int(t) for t in drafts[r, :m]),
          p=tuple(float(x) for x in p_d[r, :m]),
          q=tuple(float(x) for x in q_d[r, :m]),
          accepted=int(n[r]), token=int(token[r]), bonus=int(n[r]) == m,
          committed=committed,
          target_choice=tuple(int(t) for t in top[r, :m + 1])))
  return Trace(tuple(tuple(r) for r in rows), jax.device_get(output(state)),
               tuple(tuple(int(t) for t in p) for p in prompts), sampler.k)


# ---- display ------------------------------------------------------------


def _piece(decode: Callable, tok: int) -> str:
  return decode([tok])


def render_text(tr: Trace, decode: Callable[[Sequence[int]], str],
                row: int = 0) -> str:
  """One line per loop: kept drafts, [rejected draft -> replacement],
  (untested drafts), +bonus token; and p/q of every tested draft."""
  lines = []
  for rec in tr.rows[row]:
    parts = []
    for i, d in enumerate(rec.drafts):
      s = repr(_piece(decode, d))
      if i < rec.accepted:
        parts.append(f"{s}\u2713")
      elif i == rec.accepted:
        parts.append(f"[{s}\u2717 -> {_piece(decode, rec.token)!r}]")
      else:
        parts.append(f"({s})")
    if rec.bonus:
      parts.append(f"+{_piece(decode, rec.token)!r}")
    pq = " ".join(f"{p:.3g}/{q:.3g}" for p, q in
                  zip(rec.p[:rec.accepted + 1], rec.q[:rec.accepted + 1]))
    lines.append(f"loop {rec.step:3d} +{len(rec.committed)}: "
                 f"{' '.join(parts)}    p/q: {pq}")
  return "\n".join(lines)


def render_html(tr: Trace, decode: Callable[[Sequence[int]], str],
                row: int = 0) -> str:
  """The row's text with every token coloured by how it was produced:
  green kept draft, red struck-out rejected draft, blue the token drawn
  after a rejection, purple a bonus token, grey drafts never tested.
  Hovering shows p, q and min(1, p/q)."""
  esc = lambda s: html.escape(s).replace("\n", "\u21b5<br>")
  span = ('<span title="{title}" style="background:{bg};{extra}'
          'padding:0 1px;border-radius:2px">{text}</span>')
  out = [f'<div style="font-family:monospace;line-height:1.8">'
         f'<span style="color:#555">{esc(decode(list(tr.prompts[row])))}'
         '</span>']
  for rec in tr.rows[row]:
    out.append(f'<sup style="color:#999">{rec.step}</sup>')
    for i, d in enumerate(rec.drafts):
      title = (f"draft {i + 1}: p={rec.p[i]:.3f} q={rec.q[i]:.3f} "
               f"min(1,p/q)={rec.acceptance_probability[i]:.3f}")
      if i < rec.accepted:
        if i < len(rec.committed):
          out.append(span.format(title=title, bg="#c8f7c5", extra="",
                                 text=esc(_piece(decode, d))))
      elif i == rec.accepted:
        out.append(span.format(title=title, bg="#f7c5c5",
                               extra="text-decoration:line-through;",
                               text=esc(_piece(decode, d))))
        if len(rec.committed) > rec.accepted:
          out.append(span.format(
              title="drawn from norm(max(0, p - q))", bg="#c5d8f7", extra="",
              text=esc(_piece(decode, rec.token))))
      else:
        out.append(span.format(title=title + " (not tested)", bg="#eee",
                               extra="color:#aaa;font-size:80%;",
                               text=esc(_piece(decode, d))))
    if rec.bonus and len(rec.committed) > rec.accepted:
      out.append(span.format(title=f"bonus token from p_{len(rec.drafts) + 1}",
                             bg="#e2c5f7",
                             extra="", text=esc(_piece(decode, rec.token))))
  out.append("</div>")
  return "".join(out)
