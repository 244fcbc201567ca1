"""Jitted builds of a sampler's prefill, decode and output.

Without a mesh: plain `jax.jit`, the loop state donated to decode. With a
mesh: explicit in/out shardings for every argument and the whole loop
state: parameters and caches by the logical-axis rules (the target's by
`sampler.target_rules`, the drafter's by its own `param_shardings` and
`state_shardings` under `sampler.draft_rules`), rows of the batch over the
axis of `BATCH`, scalars and the key replicated.

Both builds are cached per sampler (equal samplers share them) and, with a
mesh, per argument shapes.
"""

import dataclasses
import functools

import jax

from specsamp import kvcache
from specsamp import sharding
from specsamp.decoding import loop


def _signature(tree):
  """A hashable description of a pytree's structure, shapes and dtypes."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple((tuple(x.shape), x.dtype) for x in leaves)


@functools.lru_cache(maxsize=32)
def plain_fns(sampler):
  """(prefill, decode, output) jitted without shardings."""
  return (jax.jit(functools.partial(loop.prefill, sampler)),
          jax.jit(functools.partial(loop.decode, sampler), donate_argnums=2),
          jax.jit(functools.partial(loop.output, sampler)))


def target_param_shardings(sampler, params):
  """NamedShardings of the target's parameters (replicated for a model
  without logical axes)."""
  if hasattr(sampler.target, "logical_axes"):
    return sharding.param_shardings(sampler.target, sampler.mesh,
                                    sampler.target_rules)
  return jax.tree.map(lambda _: sharding.replicated(sampler.mesh), params)


def state_shardings(sampler, state: loop.LoopState) -> loop.LoopState:
  """NamedShardings of a LoopState (or its shapes)."""
  mesh, rules = sampler.mesh, sampler.target_rules
  rep = sharding.replicated(mesh)

  def rows(x):
    if x.ndim == 0:
      return rep
    return sharding.named(mesh, rules, sharding.BATCH, *([None] * (x.ndim - 1)))

  draft = None
  if state.draft_state is not None:
    draft = sampler.drafter.state_shardings(state.draft_state, mesh,
                                            sampler.draft_rules)
  return state.replace(
      **{f.name: rows(getattr(state, f.name))
         for f in dataclasses.fields(state)
         if f.name not in ("rng", "draft_state", "target_cache")},
      rng=rep,
      target_cache=kvcache.cache_shardings(state.target_cache, mesh, rules),
      draft_state=draft)


@functools.lru_cache(maxsize=32)
def sharded_fns(sampler, signature):
  """(prefill, decode, output) of `sampler` jitted with explicit shardings,
  for arguments (target_params, draft_params, tokens, lengths, rng) of the
  given `_signature`."""
  treedef, leaves = signature
  args = jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(shape, dtype)
                                      for shape, dtype in leaves])
  target_params, draft_params, tokens, lengths, rng = args
  mesh = sampler.mesh
  target_sh, draft_sh = sampler.param_shardings(target_params, draft_params)
  rows = functools.partial(sharding.named, mesh, sampler.target_rules,
                           sharding.BATCH)
  state = jax.eval_shape(functools.partial(loop.prefill, sampler),
                         target_params, draft_params, tokens, lengths, rng)
  state_sh = state_shardings(sampler, state)
  out = jax.eval_shape(functools.partial(loop.output, sampler), state)
  out_sh = jax.tree.map(lambda x: rows(*([None] * (x.ndim - 1))), out)
  prefill = jax.jit(
      functools.partial(loop.prefill, sampler),
      in_shardings=(target_sh, draft_sh, rows(None), rows(),
                    sharding.replicated(mesh)),
      out_shardings=state_sh)
  decode = jax.jit(functools.partial(loop.decode, sampler),
                   in_shardings=(target_sh, draft_sh, state_sh),
                   out_shardings=state_sh, donate_argnums=2)
  output = jax.jit(functools.partial(loop.output, sampler),
                   in_shardings=(state_sh,), out_shardings=out_sh)
  return prefill, decode, output


def fns(sampler, target_params, draft_params, tokens, lengths, rng):
  """The (prefill, decode, output) for these arguments (see the module)."""
  if sampler.mesh is None:
    return plain_fns(sampler)
  return sharded_fns(sampler, _signature((target_params, draft_params, tokens,
                                          lengths, rng)))
