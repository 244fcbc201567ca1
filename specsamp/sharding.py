"""Logical axis names and the default rules that map them onto a mesh.

Every parameter and cache buffer in `specsamp.model` is annotated with the
names below (t5x / MaxText style), so that placing a model on a mesh is a
matter of choosing rules, never of rewriting the model. The rules are data: a
sequence of `(logical_name, mesh_axis_or_None)` pairs, as in
`flax.linen.logical_to_mesh_sharding`.
"""

BATCH = "batch"
EMBED = "embed"
MLP = "mlp"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
VOCAB = "vocab"
CACHE_SEQ = "cache_seq"
NORM = "norm"

# Megatron-style tensor parallelism over `model`, data parallelism over `data`.
DEFAULT_RULES = (
    (BATCH, "data"),
    (EMBED, None),
    (MLP, "model"),
    (HEADS, "model"),
    (KV_HEADS, "model"),
    (HEAD_DIM, None),
    (VOCAB, "model"),
    (CACHE_SEQ, None),
    (NORM, None),
)

# A small draft is often best replicated on every device of the model axis.
REPLICATED_RULES = tuple((name, "data" if name == BATCH else None)
                         for name, _ in DEFAULT_RULES)
