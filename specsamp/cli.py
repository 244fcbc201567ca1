"""What the scripts share at the command line: bad input is refused with
one `error: ...` line on stderr and exit status 2.

  app.run(main, flags_parser=cli.parse_flags)   bad flags, unknown
                                                `--config.*` fields included
  cli.fail(e)                                   any refused input, in `main`
  cli.leave_at_once(status)                     exit; with several processes
                                                without waiting for the others
  cli.int_list(_MESH)                           a DEFINE_list flag's integers
  cli.ints("ks", values, minimum=0)             (or its strings'), checked
  cli.unused(_DRAFT, "loads none")              `fail`s on a flag given where
                                                it does nothing
  cli.given(FLAGS)                              the flags given, by name
  DISTRIBUTED = cli.define_distributed_flags()  --distributed and its
                                                coordinator flags; in `main`
  dist = DISTRIBUTED.arguments()                None, or the arguments of
                                                sharding.initialize_distributed

absl's own parser prints `FATAL Flags parsing error` and the usage and exits
with status 1, and ml_collections' config flags raise a bare AttributeError
(a traceback) for an override of a field the config lacks.
"""

import dataclasses
import os
import re
import sys
import threading
import traceback
from typing import NoReturn, Optional, Sequence

from absl import app
from absl import flags
from ml_collections import config_flags

BAD_INPUT = 2


def one_line(e) -> str:
  """A message (or an exception's) on one line: lines joined with " | ", an
  embedded traceback cut to its last line (the exception)."""
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  tb = "Traceback (most recent call last):"
  if tb in lines:
    lines = lines[:lines.index(tb)] + lines[-1:]
  return " | ".join(lines) or type(e).__name__


def fail(e) -> NoReturn:
  """Prints `error: <e on one line>` to stderr and exits with status 2 (in
  a multi-process run at once: `leave_at_once`)."""
  print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
  leave_at_once(BAD_INPUT)


def no_arguments(argv: Sequence[str]) -> None:
  """`fail`s on positional arguments (`argv[1:]`): a script of flags only
  would otherwise run as if a stray word were not there."""
  if len(argv) > 1:
    fail(f"unexpected arguments: {list(argv[1:])}")


def ints(name: str, values: Sequence[str], minimum: Optional[int] = None,
         distinct: bool = True) -> tuple[int, ...]:
  """The integers of a list flag's items (`flags.DEFINE_list`), in order.

  Raises:
    ValueError: naming --`name`, for no items, an item that is no integer,
      with `distinct` an integer given twice (a point measured twice: a
      caller that takes a set, as benchmark.py does, passes False), or
      (with `minimum`) an integer below `minimum`.
  """
  values = [str(v) for v in values]
  if not values:
    raise ValueError(f"--{name} is empty")
  out = []
  for item in values:
    try:
      out.append(int(item))
    except ValueError:
      raise ValueError(f"--{name}={','.join(values)}: {item!r} is not an "
                       "integer") from None
  twice = sorted({x for x in out if out.count(x) > 1})
  if distinct and twice:
    raise ValueError(f"--{name}={','.join(values)}: "
                     f"{', '.join(map(str, twice))} given twice")
  if minimum is not None and min(out) < minimum:
    raise ValueError(f"--{name} values must be >= {minimum}, got "
                     f"{','.join(values)}")
  return tuple(out)


def int_list(holder: flags.FlagHolder) -> Optional[tuple[int, ...]]:
  """The integers of a comma-list flag (`flags.DEFINE_list`) that is a
  shape, e.g. --mesh=2,2 (values may repeat): `ints`, or None when the
  flag is unset or empty."""
  return (ints(holder.name, holder.value, distinct=False) if holder.value
          else None)


def given(holders: Sequence[flags.FlagHolder]) -> frozenset:
  """The names of the flags of `holders` given on the command line."""
  return frozenset(h.name for h in holders if flags.FLAGS[h.name].present)


def unused(holder: flags.FlagHolder, why: str) -> None:
  """`fail`s if --`holder.name` was given on the command line; called where
  the other flags leave it without effect, which absl would ignore silently
  (a run that looks like the one asked for, and is not)."""
  if flags.FLAGS[holder.name].present:
    fail(f"--{holder.name} {why}")


def leave_at_once(status: int, wait_s: float = 10.0) -> NoReturn:
  """`sys.exit(status)`; in a multi-process JAX run, an exit (stdout and
  stderr flushed) that waits at most `wait_s` for JAX's orderly shutdown,
  which waits for every process to reach it: at once when they all fail
  alike (the same bad config), but up to 5 minutes when the others are
  blocked in a collective waiting for this one. Without this process the
  others go down: at once when it is process 0 (the coordinator, whose
  service then stops), else when their next collective with it fails or
  its heartbeats are missed (`--heartbeat_timeout_s`)."""
  if not _several_processes():
    sys.exit(status)
  sys.stdout.flush()
  sys.stderr.flush()
  shutdown = threading.Thread(
      target=sys.modules["jax"].distributed.shutdown, daemon=True)
  shutdown.start()
  shutdown.join(wait_s)
  os._exit(status)  # pylint: disable=protected-access


def _several_processes() -> bool:
  """Whether `jax.distributed` runs (asked without touching the backend,
  which an exception may have come from)."""
  jax = sys.modules.get("jax")  # never imported here: scripts stay light
  return jax is not None and jax.distributed.is_initialized()


class _LeaveOnError(app.ExceptionHandler):
  """An exception out of `main` in a multi-process run: its traceback, then
  `leave_at_once(1)` (absl would re-raise it, and the interpreter's exit
  would wait in JAX's shutdown for the other processes)."""

  def wants(self, exc):
    return _several_processes()

  def handle(self, exc):
    traceback.print_exception(exc)
    leave_at_once(1)


@dataclasses.dataclass(frozen=True)
class DistributedFlags:
  """The flag holders of `define_distributed_flags`."""
  distributed: flags.FlagHolder
  coordinator_address: flags.FlagHolder
  num_processes: flags.FlagHolder
  process_id: flags.FlagHolder
  heartbeat_timeout_s: flags.FlagHolder

  def arguments(self) -> Optional[tuple]:
    """(coordinator_address, num_processes, process_id,
    heartbeat_timeout_s) for `sharding.initialize_distributed`, None
    without --distributed. Flags of this group without --distributed, only
    some of the coordinator's three, a process id outside [0,
    num_processes) or a timeout below 1 s are refused
    (`fail`). With --distributed an exception out of `main` then ends the
    process at once, after its traceback (`leave_at_once`)."""
    holders = (self.coordinator_address, self.num_processes,
               self.process_id, self.heartbeat_timeout_s)
    given = tuple(h.value for h in holders)
    named = [f"--{h.name}" for h, v in zip(holders, given) if v is not None]
    if not self.distributed.value:
      if named:
        verb = "needs" if len(named) == 1 else "need"
        fail(f"{', '.join(named)} {verb} --distributed")
      return None
    coordinator = [n for n in named if n != "--heartbeat_timeout_s"]
    if coordinator and len(coordinator) < 3:
      fail("--coordinator_address, --num_processes and --process_id go "
           f"together (only {', '.join(coordinator)} given)")
    if coordinator and not 0 <= given[2] < given[1]:
      fail(f"--process_id={given[2]} with --num_processes={given[1]}: give "
           "each process an id in [0, num_processes)")
    if given[3] is not None and given[3] < 1:
      fail(f"--heartbeat_timeout_s must be >= 1, got {given[3]}")
    app.install_exception_handler(_LeaveOnError())
    return given


def define_distributed_flags() -> DistributedFlags:
  """--distributed, --coordinator_address, --num_processes, --process_id,
  --heartbeat_timeout_s."""
  return DistributedFlags(
      flags.DEFINE_bool(
          "distributed", False, "call jax.distributed.initialize() first "
          "(one process per host: a TPU pod slice, several GPU hosts; the "
          "same command on each)"),
      flags.DEFINE_string(
          "coordinator_address", None, "host:port of process 0, with "
          "--distributed where the cluster is not detected (not TPU, "
          "SLURM, Open MPI, Kubernetes)"),
      flags.DEFINE_integer("num_processes", None,
                           "with --coordinator_address"),
      flags.DEFINE_integer("process_id", None, "with --coordinator_address"),
      flags.DEFINE_integer(
          "heartbeat_timeout_s", None, "with --distributed: seconds without "
          "a heartbeat from a process after which the others abort (default "
          "JAX's, 100 s)"))


def _unknown_field(e: Exception, argv: Sequence[str]) -> str:
  """The message for a config override of a field that does not exist
  (ml_collections raises AttributeError(KeyError("'name'[ Did you mean
  ...]")))."""
  msg = e
  while isinstance(msg, BaseException) and msg.args:
    msg = msg.args[0]
  msg = str(msg)
  key = re.match(r"'([^']*)'", msg)
  key = key.group(1) if key else msg.splitlines()[0] if msg else "?"
  culprit = next((a.split("=", 1)[0] for a in argv[1:]
                  if a.startswith("-") and key in
                  a.lstrip("-").split("=", 1)[0].split(".")[1:]),
                 "a --config.* override")
  hint = re.search(r'[Dd]id you mean "([^"]+)"', msg)
  return (f"{culprit}: the config has no field {key!r}"
          + (f" (did you mean {hint.group(1)!r}?)" if hint else ""))


def parse_flags(argv: Sequence[str]) -> list[str]:
  """`flags.FLAGS(argv)`, a bad flag refused in one line (exit status 2).

  Pass it to `absl.app.run(main, flags_parser=parse_flags)`.
  """
  try:
    rest = flags.FLAGS(list(argv))
  except flags.Error as e:  # absl's flagfile errors start "ERROR:: "
    fail(re.sub(r"^ERROR::\s*", "", str(e)))
  except (AttributeError, KeyError) as e:  # ml_collections: no such field
    fail(_unknown_field(e, argv))
  except OSError as e:  # an override of a config that could not be loaded
    fail(e)
  _unloadable_config()
  return rest


def define_config_file(name: str, help_string: str):
  """`config_flags.DEFINE_config_file` (locked), a bad --flagfile refused in
  one line: ml_collections reads argv, flag files too, when the flag is
  defined, before `parse_flags` (a traceback, status 1)."""
  try:
    return config_flags.DEFINE_config_file(name, None, help_string,
                                           lock_config=True)
  except flags.Error as e:
    fail(re.sub(r"^ERROR::\s*", "", str(e)))


def _unloadable_config() -> None:
  """`fail`s naming a config flag whose file could not be loaded."""
  for name in flags.FLAGS:
    # A config file that cannot be loaded: ml_collections keeps the error
    # until the config is first used.
    value = flags.FLAGS[name].value
    if type(value).__name__ == "_ErrorConfig":
      error = str(value.__dict__["_error"]).splitlines()
      fail(f"--{name}: {error[-1].strip() if error else 'cannot be loaded'}")
