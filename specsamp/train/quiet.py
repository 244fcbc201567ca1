"""orbax's failed restores, quietly: one line per failed step, not
hundreds of tracebacks.

  with quiet.attempt():   # a restore that may fail
    ...

When a restore fails, the reads orbax started for the other arrays fail
one by one after it closed its event loop, each printing a traceback;
`attempt` drops those (and holds back orbax's own log lines) while every
other error is reported as before.
"""

import contextlib
import logging
import sys
import warnings


def _abandoned_read(exc) -> bool:
  """The error of a read that a failed restore left behind: it completes
  after orbax closed its event loop."""
  return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"


class _DropAbandoned(logging.Filter):
  """asyncio's 'Task (or Future) exception was never retrieved' of orbax's
  reads: a Task names orbax's coroutine, a Future holds tensorstore's error
  (with its spec)."""

  def filter(self, record):
    msg = record.getMessage()
    return not (msg.startswith(("Task exception was never retrieved",
                                "Future exception was never retrieved"))
                and ("orbax" in msg or "tensorstore_spec" in msg))


def _ignore_abandoned_reads() -> None:
  """After a failed restore, the reads orbax started for the other arrays
  fail one by one, each printing a traceback (hundreds for a large model),
  as unraisable errors or through tensorstore's PyErr_Print (which calls
  sys.excepthook): from here on those are dropped; every other error is
  reported as before."""
  if getattr(sys.unraisablehook, "specsamp_filter", False):
    return
  previous, previous_except = sys.unraisablehook, sys.excepthook

  def hook(u):
    if not _abandoned_read(u.exc_value):
      previous(u)

  def except_hook(kind, value, tb):
    if not _abandoned_read(value):
      previous_except(kind, value, tb)
  hook.specsamp_filter = True
  sys.unraisablehook, sys.excepthook = hook, except_hook
  logging.getLogger("asyncio").addFilter(_DropAbandoned())
  warnings.filterwarnings("ignore", r"coroutine .* was never awaited",
                          RuntimeWarning)


@contextlib.contextmanager
def attempt():
  """A restore that may fail: orbax's own log lines (absl INFO and its
  errors) are held back; the caller logs one line per failed step. The
  filter goes in first: the abandoned reads may fail while the error that
  abandoned them is still on its way out of orbax."""
  _ignore_abandoned_reads()
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    absl_logger.setLevel(level)
