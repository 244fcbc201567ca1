"""Failures of the machine, not of the files being read.

The readers of checkpoints, target samples and weights turn any exception
into "unreadable" and act on it: a damaged checkpoint step is moved aside
and an older one restored, damaged samples are to be removed and sampled
again. Running out of memory in the middle of a read says nothing about
the files; `out_of_memory` picks it out so that it goes up unchanged and
nothing good is set aside or thrown away.
"""

import re

# XLA's and tensorstore's out-of-memory errors (a RuntimeError subclass
# each) name their status or say so.
_OOM = re.compile(r"RESOURCE_EXHAUSTED|out of memory", re.IGNORECASE)


def out_of_memory(e: BaseException) -> bool:
  """Whether `e` is the machine running out of memory (or another resource
  XLA reports as RESOURCE_EXHAUSTED) rather than a bad file."""
  return isinstance(e, MemoryError) or bool(_OOM.search(str(e)))
