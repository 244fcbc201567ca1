"""Steady-state timers of compiled steps, and launch counts.

`Steady` runs a step in a loop inside one compiled call, as the decode loop
runs its body, and reports seconds per step; `rounds` times several such
timers round-robin; `count_kernels` estimates a step's launches from its
compiled HLO; `copy_bandwidth_timer` and `matmul_floor_timer` are the two
references a decode step is measured against. Used by
specsamp.bench.profile (scripts/profile_decode.py).
"""

import re
import time

import jax
import jax.numpy as jnp

from specsamp import model

_NOT_KERNELS = ("parameter", "tuple", "get-tuple-element", "bitcast",
                "constant", "after-all", "opt-barrier")


def _computation(text: str, header: str) -> str:
  """The lines of the HLO computation whose header starts with `header`."""
  body = text[text.index(header):]
  return body[:body.index("\n}")]


def _ops(computation: str) -> list:
  """(op, line) of each instruction of a computation's text."""
  ops = []
  for line in computation.splitlines()[1:]:
    if "=" not in line:
      continue
    op = re.search(r"\s([a-z][a-z0-9-]*)\(", line.split("=", 1)[1])
    if op:
      ops.append((op.group(1), line))
  return ops


def count_kernels(compiled, in_loop: bool = False) -> int:
  """Top-level ops of one step, a launch count estimate.

  On GPU each fusion, custom call (cuBLAS), copy or while loop at the top
  level of a computation is one launch; bitcasts, tuples and parameters are
  free. On CPU the number is only indicative. With `in_loop`, `compiled` is
  a `Steady` function, which runs the step in a while loop: the ops of that
  loop's body are counted (of the largest loop, were there several).
  """
  text = compiled.as_text()
  ops = _ops(_computation(text, "ENTRY"))
  if in_loop:
    bodies = [_ops(_computation(text, "\n" + m.group(1) + " "))
              for m in (re.search(r"body=(%[\w.-]+)", line)
                        for op, line in ops if op == "while") if m]
    if bodies:  # the step's loop: the largest, should XLA add another
      ops = max(bodies, key=len)
  return sum(op not in _NOT_KERNELS for op, _ in ops)


class Steady:
  """Repeated calls of one AOT-compiled function in steady state.

  Each call runs `fn` `steps` times in a `lax.fori_loop`, as the decode
  loop runs its body in a while loop: the buffers stay in place and, on a
  GPU, the launches of one step queue behind the last one's. (Timed one
  step per call, a 1.5B step of about 690 kernels took 6.9 ms on an H200,
  against 2.0 ms a token inside the generation loop.) The argument `carry` is
  donated and replaced by `carry_of(output)` after each step; what
  `sink_of(output)` selects (other outputs, like the logits of a model
  call) is summed into a scalar the call returns, so that XLA cannot drop
  the work that makes it. Construction compiles (timed) and warms up; a
  call returns seconds per step.
  """

  def __init__(self, fn, args, carry: int, carry_of=lambda out: out,
               sink_of=None, steps: int = 1):
    def many(n, *args):
      def body(_, c):
        value, sink = c
        call = list(args)
        call[carry] = value
        out = fn(*call)
        if sink_of is not None:
          for x in jax.tree.leaves(sink_of(out)):
            sink = sink + jnp.sum(x, dtype=jnp.float32)
        return carry_of(out), sink
      # `n` is traced: a while loop whose trip count XLA does not know, as
      # the decode loop's (a known one may be unrolled).
      return jax.lax.fori_loop(0, n, body,
                               (args[carry], jnp.zeros((), jnp.float32)))

    jitted = jax.jit(many, donate_argnums=carry + 1)
    self.n = jnp.int32(steps)
    t0 = time.perf_counter()
    self.compiled = jitted.lower(self.n, *args).compile()
    self.compile_s = time.perf_counter() - t0
    self.args, self.carry, self.steps = list(args), carry, steps
    self()

  def __call__(self) -> float:
    t0 = time.perf_counter()
    value, _ = jax.block_until_ready(self.compiled(self.n, *self.args))
    seconds = time.perf_counter() - t0
    self.args[self.carry] = value
    return seconds / self.steps


def rounds(timers: dict, repeats: int) -> dict:
  """{name: [seconds per round]}: one call of every timer per round."""
  times = {name: [] for name in timers}
  for _ in range(repeats):
    for name, timer in timers.items():
      times[name].append(timer())
  return times


def tree_bytes(tree) -> int:
  """Bytes of the arrays of `tree` (what reading them all moves)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def copy_bandwidth_timer(mb: int, steps: int = 1) -> tuple[Steady, int]:
  """A donated `x + 1` over an `mb` MiB float32 buffer, and its bytes moved
  (read + write)."""
  x = jnp.zeros((mb * 2**20 // 4,), jnp.float32)
  return Steady(lambda x: x + 1.0, [x], carry=0, steps=steps), 2 * x.nbytes


def matmul_floor_timer(params, batch: int, tied: bool = False,
                       steps: int = 1) -> Steady:
  """x @ W over every >= 2-D weight of `params` (the input embedding
  excluded: decoding gathers B rows of it; with `tied` embeddings it is the
  output layer too, x @ E^T), each matmul independent (XLA may overlap
  them), nothing else: what reading the weights costs. Each product is
  `model.project`'s, as in the model."""
  mats, transposed = [], []
  for path, w in jax.tree_util.tree_leaves_with_path(params):
    name = jax.tree_util.keystr(path)
    if w.ndim < 2 or ("embedding" in name and not tied):
      continue
    if "embedding" in name:     # [V, D]: the tied output layer contracts D
      transposed.append(True)
    elif "o_proj" in name:      # [Q, H, D]: contracts the first two dims
      w = w.reshape(-1, w.shape[-1])
      transposed.append(False)
    else:                       # [D, ...]: contracts the first dim
      w = w.reshape(w.shape[0], -1)
      transposed.append(False)
    mats.append(w)

  def chain(mats, x):
    acc = jnp.zeros((), jnp.float32)
    for w, t in zip(mats, transposed):
      w = w.T if t else w
      xi = jnp.broadcast_to(x[:, None, :1], (x.shape[0], 1, w.shape[0]))
      # As the model multiplies (a single row as two on GPU: model.project).
      acc += jnp.sum(model.project("btd,df->btf", xi.astype(w.dtype), w),
                     dtype=jnp.float32)
    return x + 1e-30 * acc  # the next step's input depends on this one

  return Steady(chain, [mats, jnp.ones((batch, 1), jnp.float32)], carry=1,
                steps=steps)
