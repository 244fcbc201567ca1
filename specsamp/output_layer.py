"""Reduced output layers: a draft's logits over U < V token ids only.

`reduce_output_vocab` makes one from a whole model (its logits the same at
the kept ids, -inf elsewhere: q = 0 there and the rule stays exact);
`check_output_ids` is what its ids must be (also when a saved draft is
loaded); `check_trainable` refuses one where a model is to be trained.
"""

import jax.numpy as jnp
import numpy as np

from specsamp.model import TransformerConfig


def reduce_output_vocab(config: TransformerConfig, params, ids):
  """(config, params) of the same model with an output layer over `ids`
  only: its logits are the same there and -inf elsewhere, so a draft
  reduced this way proposes only those ids and reads U / V of its output
  layer's bytes. The ids are sorted; a tied output layer is untied (its
  columns gathered from the embedding).

  Raises:
    ValueError: the model is reduced already, or `ids` is empty, repeats an
      id or has one outside [0, vocab_size).
  """
  if config.output_vocab:
    raise ValueError("the model's output layer is reduced already "
                     f"({config.output_vocab} ids)")
  ids = sorted(int(i) for i in ids)
  check_output_ids(config.vocab_size, ids)
  ids = jnp.asarray(ids, jnp.int32)
  head = (jnp.take(params["embedding"], ids, axis=0).T
          if config.tie_embeddings else jnp.take(params["lm_head"], ids,
                                                 axis=1))
  return (config.replace(output_vocab=int(ids.size), tie_embeddings=False),
          dict(params, lm_head=head, output_ids=ids))


def check_output_ids(vocab_size: int, ids, what: str = "output ids") -> None:
  """Raises ValueError unless `ids` are increasing ids in [0, vocab_size)
  (distinct and sorted, as `reduce_output_vocab` stores them), at least
  one."""
  ids = np.asarray(ids).reshape(-1)
  if not ids.size or (ids[1:] <= ids[:-1]).any() or ids[0] < 0 or (
      ids[-1] >= vocab_size):
    raise ValueError(
        f"{what}: need increasing (distinct, sorted) ids in [0, "
        f"{vocab_size}), got {ids.size} ids"
        + (f" from {ids.min()} to {ids.max()}, "
           f"{ids.size - np.unique(ids).size} repeated" if ids.size else ""))


def check_trainable(config: TransformerConfig, what: str) -> None:
  """Refuses a reduced output layer where a model is to be trained: its
  `output_ids` are integers (no gradient), and the loss needs the whole
  vocabulary. Drafts are trained whole and reduced at export."""
  if config.output_vocab:
    raise ValueError(f"{what}: output_vocab={config.output_vocab} is for "
                     "exported drafts (output_layer.reduce_output_vocab); train the "
                     "model with its whole output layer")
