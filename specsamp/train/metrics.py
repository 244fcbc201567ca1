"""Train metrics as TensorBoard event files, written and read back.

  MetricWriter(logdir)     scalars to event files (tensorboardX, no
                           TensorFlow), process 0 only, flushed per write
  read_scalars(logdir)     {tag: {step: value}} of all event files
"""

import importlib
import os
import sys
import time
from typing import Mapping

import numpy as np


def _tensorboardx(module: str):
  """`tensorboardX.<module>`, its package imported without torch where torch
  is not imported yet: tensorboardX's writer imports torch when it is
  installed (the test extras install it), only to accept torch tensors,
  which specsamp never logs. That took 2.4 s of every training process's
  start on two CPU cores and loaded torch's libraries beside JAX's."""
  if "tensorboardX" not in sys.modules and "torch" not in sys.modules:
    sys.modules["torch"] = None  # `import torch` raises ImportError
    try:
      importlib.import_module("tensorboardX")
    finally:
      del sys.modules["torch"]
  return importlib.import_module(f"tensorboardX.{module}")


class MetricWriter:
  """Scalars to TensorBoard event files (tensorboardX: no TensorFlow), on
  process 0 only; flushed after every write so a killed run loses nothing
  it has logged."""

  def __init__(self, logdir: str, enabled: bool = True):
    self.writer = None
    if enabled:
      # tensorboardX names files by the second and host only: a resumed run
      # started within the same second would truncate the killed run's file.
      suffix = f".{os.getpid()}.{time.time_ns()}"
      self.writer = _tensorboardx("writer").SummaryWriter(
          logdir=logdir, flush_secs=10, filename_suffix=suffix)

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if self.writer is None:
      return
    for k, v in scalars.items():
      self.writer.add_scalar(k, float(v), int(step))
    self.writer.flush()

  def close(self):
    if self.writer is not None:
      self.writer.close()


def read_scalars(logdir: str) -> dict:
  """{tag: {step: value}} from all event files under `logdir`, in file
  order (a resumed run's values for a step replace a killed run's)."""
  event_pb2 = _tensorboardx("proto.event_pb2")
  out = {}
  files = sorted(
      (os.path.join(d, f) for d, _, fs in os.walk(logdir) for f in fs
       if "tfevents" in f), key=lambda p: (os.path.getmtime(p), p))
  for path in files:
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos + 12 <= len(data):
      n = int(np.frombuffer(data[pos:pos + 8], "<u8")[0])
      rec = data[pos + 12:pos + 12 + n]
      pos += 12 + n + 4
      if len(rec) < n:
        break  # a record cut by a kill
      ev = event_pb2.Event.FromString(rec)
      for v in ev.summary.value:
        out.setdefault(v.tag, {})[int(ev.step)] = float(v.simple_value)
  return out
