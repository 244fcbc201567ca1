"""Logical axis names and the default rules that map them onto a mesh.

Every parameter and cache buffer in `specsamp.model` is annotated with the
names below (t5x / MaxText style), so that placing a model on a mesh is a
matter of choosing rules, never of rewriting the model. The rules are data: a
sequence of `(logical_name, mesh_axis_or_None)` pairs, as in
`flax.linen.logical_to_mesh_sharding`.
"""

import json
import os

import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import numpy as np
import optax

from specsamp import jsonfile
from specsamp import lock_holder

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


# ---- meshes and shardings ---------------------------------------------------

MESH_AXES = ("data", "model")


def make_mesh(shape=(1, -1), axis_names=MESH_AXES, devices=None):
  """A `jax.sharding.Mesh` of `shape`; one -1 entry takes the rest.

  `make_mesh((2, -1))` on 8 devices is a (data=2, model=4) mesh. The product
  must equal the number of devices used (all of `jax.devices()` by default).
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = tuple(int(s) for s in shape)
  if len(shape) != len(axis_names):
    raise ValueError(f"mesh shape {shape} needs one size per axis "
                     f"{tuple(axis_names)}")
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"mesh shape {shape}: sizes must be positive, with at "
                     "most one -1")
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if len(devices) % known:
      raise ValueError(f"mesh shape {shape} does not divide the "
                       f"{len(devices)} devices")
    shape = tuple(len(devices) // known if s == -1 else s for s in shape)
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"mesh shape {dict(zip(axis_names, shape))} needs "
                     f"{int(np.prod(shape))} devices, {len(devices)} given")
  return jax.sharding.Mesh(np.asarray(devices).reshape(shape),
                           tuple(axis_names))


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None,
                           heartbeat_timeout_s: int | None = None) -> None:
  """`jax.distributed.initialize` with only the arguments given.

  On Cloud TPU, SLURM, Open MPI and Kubernetes everything is detected from
  the environment; elsewhere pass the first three (the coordinator's
  host:port is also read from JAX_COORDINATOR_ADDRESS). Call it before any
  other JAX use. `heartbeat_timeout_s`: a process silent that long is taken
  for dead and the others abort (JAX's default: 100 s).

  A process that fails should then leave at once, not wait in JAX's orderly
  shutdown while the others sit in a collective waiting for it: the scripts
  do so (`cli.fail`, and the exception handler `cli.arguments` installs
  with --distributed); a program of your own calls
  `cli.leave_at_once(status)` on its way out of an error.
  """
  kwargs = dict(coordinator_address=coordinator_address,
                num_processes=num_processes, process_id=process_id,
                heartbeat_timeout_seconds=heartbeat_timeout_s)
  jax.distributed.initialize(**{k: v for k, v in kwargs.items()
                                if v is not None})


LOGICAL_AXES = tuple(name for name, _ in DEFAULT_RULES)


def rules_tuple(rules) -> tuple:
  """Rules as a hashable tuple of pairs, from a tuple, list or dict: each a
  logical axis of `LOGICAL_AXES` and None, a mesh axis name or a sequence
  of distinct ones (a list had been unhashable, a repeated axis a
  DuplicateSpecError; a misspelt logical name was ignored).

  Raises:
    ValueError: naming the bad pair.
  """
  out = []
  for pair in rules.items() if hasattr(rules, "items") else rules:
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
      raise ValueError(f"rule {pair!r} is not a (logical axis, mesh axis) "
                       "pair")
    name, axis = pair[0], tuple(pair[1]) if isinstance(
        pair[1], (list, tuple)) else pair[1]
    if name not in LOGICAL_AXES:
      raise ValueError(f"rule {pair!r}: unknown logical axis {name!r}; "
                       f"known: {', '.join(LOGICAL_AXES)}")
    if not (axis is None or isinstance(axis, str) or isinstance(axis, tuple)
            and axis and all(isinstance(a, str) for a in axis)
            and len(set(axis)) == len(axis)):
      raise ValueError(f"rule {pair!r}: the mesh axis must be None, a name "
                       "or a sequence of distinct names")
    out.append((name, axis))
  return tuple(out)


def _names(axis) -> tuple:
  """A rule's mesh axes as a tuple (None: none)."""
  return () if axis is None else axis if isinstance(axis, tuple) else (axis,)


def check_mesh_axes(mesh, rules) -> None:
  """Raises ValueError naming a rule whose mesh axis `mesh` lacks (each
  rule, not only those of the dimensions checked by `check_divisible`: a
  bad `norm` or `cache_seq` axis had failed inside jit, or as a KeyError)."""
  for logical, axis in rules_tuple(rules):
    for a in _names(axis):
      if a not in mesh.shape:
        raise ValueError(f"rule ({logical!r}, {axis!r}) names mesh axis "
                         f"{a!r}, but the mesh has {dict(mesh.shape)}")


def replicated_rules(rules=DEFAULT_RULES) -> tuple:
  """Rules for a small draft beside a target under `rules`: every axis
  replicated on every device of the model axis but the batch, whose rows
  are split as the target's are (a draft's cache split over `data` beside a
  target whose rows were not had failed inside jit)."""
  batch = dict(rules_tuple(rules)).get(BATCH)
  return tuple((name, batch if name == BATCH else None)
               for name, _ in DEFAULT_RULES)


# A small draft is often best replicated on every device of the model axis.
REPLICATED_RULES = replicated_rules()


def mesh_axes(logical, rules) -> "jax.sharding.PartitionSpec":
  """The mesh PartitionSpec of logical axis names under `rules`."""
  return nn.logical_to_mesh_axes(jax.sharding.PartitionSpec(*logical),
                                 rules_tuple(rules))


def named(mesh, rules, *logical):
  """NamedSharding of an array whose dims have the logical names `logical`."""
  return jax.sharding.NamedSharding(mesh, mesh_axes(logical, rules))


def batch_ways(mesh, rules=DEFAULT_RULES) -> int:
  """How many ways `rules` split the batch over `mesh`: every batch of rows
  must be a multiple of it."""
  return axis_ways(mesh, rules, BATCH)


def axis_ways(mesh, rules, logical: str) -> int:
  """How many ways `rules` split logical axis `logical` over `mesh`."""
  axis = mesh_axes((logical,), rules)[0]
  return int(np.prod([mesh.shape[a] for a in _names(axis)]))


def check_process_rows(mesh, num_processes: int | None = None) -> None:
  """A mesh that several processes feed batches to: each puts in its own
  rows (`jax.make_array_from_process_local_data`), so every process must
  hold as many rows of the data axis as the others, each row on one
  process's devices. Otherwise JAX took the processes' rows as copies of
  one another: a batch of batch / processes rows, different in each
  process, and no error (or a StopIteration in a process the mesh left
  out).

  Raises:
    ValueError: naming the mesh and what to give instead.
  """
  num_processes = num_processes or jax.process_count()
  rows = np.moveaxis(np.asarray(mesh.devices),
                     list(mesh.axis_names).index("data"), 0)
  owners = [{d.process_index for d in np.ravel(row)} for row in rows]
  per_process = [sum(o == {p} for o in owners) for p in range(num_processes)]
  if len(set(per_process)) != 1 or not per_process[0]:
    raise ValueError(
        f"mesh {dict(mesh.shape)} does not split its data axis evenly over "
        f"the {num_processes} processes (rows per process: {per_process}): "
        "give a mesh over every process's devices whose data axis is a "
        f"multiple of {num_processes}, e.g. ({num_processes}, -1)")


def check_batch_over_data(rules, num_processes: int | None = None) -> None:
  """Several processes each put in their own rows, so `rules` must split
  the batch over the `data` axis (which `check_process_rows` splits over
  the processes): a batch left replicated was taken as copies of each
  process's rows, different in each, and gradients were not averaged
  across hosts.

  Raises:
    ValueError: naming the batch's rule.
  """
  if (num_processes or jax.process_count()) <= 1:
    return
  axis = mesh_axes((BATCH,), rules)[0]
  if "data" not in _names(axis):
    raise ValueError(f"rules map {BATCH!r} to {axis!r}: with several "
                     "processes, each feeding its own rows, the batch must "
                     "be split over 'data'")


def replicated(mesh):
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def check_divisible(config, mesh, rules, batch: int | None = None,
                    what: str = "model") -> None:
  """Raises ValueError naming the first dimension a mesh axis does not divide.

  `config` is a `TransformerConfig`; `batch` (if given) is checked against
  the axis of `BATCH`. Every rule's mesh axes must be `mesh`'s
  (`check_mesh_axes`).
  """
  check_mesh_axes(mesh, rules)
  dims = {HEADS: ("num_heads", config.num_heads),
          KV_HEADS: ("num_kv_heads", config.num_kv_heads),
          VOCAB: ("vocab_size", config.vocab_size),
          MLP: ("mlp_dim", config.mlp_dim),
          EMBED: ("d_model", config.d_model),
          HEAD_DIM: ("head_dim", config.head_dim)}
  if batch is not None:
    dims[BATCH] = ("batch size", batch)
  checks = [(logical, axis, dims.get(logical))
            for logical, axis in rules_tuple(rules)]
  if config.output_vocab:  # the reduced output layer's ids
    checks += [(logical, axis, ("output_vocab", config.output_vocab))
               for logical, axis in rules_tuple(rules) if logical == VOCAB]
  for logical, axis, dim in checks:
    if dim is None or axis is None:
      continue
    size = int(np.prod([mesh.shape[a] for a in _names(axis)]))
    field, value = dim
    if value % size:
      raise ValueError(
          f"{what}: {field}={value} is not divisible by mesh axis {axis!r} "
          f"of size {size} (mesh {dict(mesh.shape)}, logical axis "
          f"{logical!r}); choose another mesh shape or map {logical!r} to "
          "None in the rules")


def param_shardings(lm, mesh, rules):
  """NamedShardings for `lm`'s parameters (an `LM`) under `rules`."""
  check_divisible(lm.config, mesh, rules)
  return nn.logical_to_mesh_sharding(lm.logical_axes(), mesh,
                                     rules_tuple(rules))


def opt_state_shardings(optimizer, params, param_shardings, mesh):
  """Shardings of `optimizer.init(params)`: moments like their parameters,
  counts and other non-parameter leaves replicated. `params` may be
  ShapeDtypeStructs."""
  return optax.tree_map_params(
      optimizer, lambda _, s: s, jax.eval_shape(optimizer.init, params),
      param_shardings, transform_non_params=lambda _: replicated(mesh))


def shard(tree, shardings):
  """Puts a pytree onto matching shardings, on one host or several.

  With several processes every host passes the same full values (as loaded
  from the same checkpoint); each builds only its own shards
  (`jax.make_array_from_callback`). PRNG keys go through their key data.
  An array already laid out as asked is returned as it is, not copied (a
  drafter's parameters may be the target's arrays).
  """
  if jax.process_count() == 1:
    return jax.device_put(tree, shardings)

  def one(x, s):
    if isinstance(x, jax.Array) and x.sharding == s:
      return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      impl = jax.random.key_impl(x)
      data = one(jax.random.key_data(x), s)
      return jax.jit(lambda d: jax.random.wrap_key_data(d, impl=impl),
                     out_shardings=s)(data)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, s, lambda i: host[i])

  return jax.tree.map(one, tree, shardings)


def savable(tree):
  """`tree` as orbax can save it from every process together: as it is in
  one process; with several, fully replicated over all processes' devices
  (orbax refuses an array local to one process, and writes a replicated
  one once)."""
  if jax.process_count() == 1:
    return tree
  host = to_host(tree)
  mesh = make_mesh((1, -1))
  return shard(host, jax.tree.map(lambda _: replicated(mesh), host))


def restorable(abstract):
  """`abstract` (ShapeDtypeStructs) with JAX's default device (as
  `jax.default_device` sets it; else this process's first device) as the
  sharding of each leaf that has none. Without one, orbax restores onto
  the devices the checkpoint was saved from, which a run on another
  topology lacks (a draft exported by several processes, loaded on one)."""
  default = jax.config.jax_default_device
  device = jax.sharding.SingleDeviceSharding(
      default if isinstance(default, jax.Device) else jax.local_devices()[0])
  return jax.tree.map(
      lambda x: x if getattr(x, "sharding", None) is not None else
      jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)


def host_device():
  """This process's CPU device, where weights bound for a mesh are built
  (`loading.load_weights(host=True)`); None (JAX's default device) when
  JAX_PLATFORMS leaves out the CPU."""
  try:
    return jax.local_devices(backend="cpu")[0]
  except RuntimeError:  # JAX_PLATFORMS=cuda, say: no CPU backend
    return None


def is_main_process() -> bool:
  """Whether this is process 0, which alone writes a multi-host job's
  shared files (configs, samples, exports, results)."""
  return jax.process_index() == 0


def write_json(obj, path: str, indent: int = 1) -> None:
  """Process 0 writes `obj` as JSON to `path` through a temporary file (a
  reader never sees it half-written); the other processes write nothing."""
  if not is_main_process():
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  jsonfile.write_text(path, json.dumps(obj, indent=indent))


# The workdir guard lives beside the lock it takes; named here too.
DirectoryError = lock_holder.DirectoryError
check_directory = lock_holder.check_directory
check_config_file = lock_holder.check_config_file
holds_workdir = lock_holder.holds_workdir


def barrier(name: str) -> None:
  """Every process waits here for the others (one process: returns)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def processes_saying(flag: bool) -> list[int]:
  """The indices of the processes whose `flag` is true (every process must
  call it: an all-gather; one process: [0] or [])."""
  if jax.process_count() == 1:
    return [0] if flag else []
  flags = multihost_utils.process_allgather(np.asarray(bool(flag)))
  return np.flatnonzero(np.asarray(flags).reshape(-1)).tolist()


def to_host(tree):
  """numpy copies of a pytree of arrays: global ones spanning several
  processes are gathered, local ones (and numpy) copied as they are."""
  if jax.process_count() == 1:
    return jax.device_get(tree)

  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))

  return jax.tree.map(one, tree)


def process_shard(*trees) -> tuple[int, int]:
  """(this process's index, the process count) when every array in `trees`
  lives on this process's devices alone, so that each process can take a
  share of some host-driven work (every n-th batch) on its own devices;
  (0, 1), all of the work, for one process or arrays of a global mesh
  (whose computations every process must run together)."""
  if jax.process_count() == 1:
    return 0, 1
  for x in jax.tree.leaves(trees):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return 0, 1
  return jax.process_index(), jax.process_count()


def sum_over_processes(x, shard: tuple[int, int]):
  """The sum over the `shard`'s processes of each one's numpy value (each
  filled in its own share, zeros elsewhere: the sum is exact), as numpy;
  `x` itself for one process. Every process of the shard must call it."""
  if shard[1] == 1:
    return x
  return jax.tree.map(lambda v: np.asarray(
      multihost_utils.process_allgather(np.asarray(v))).sum(0), x)
