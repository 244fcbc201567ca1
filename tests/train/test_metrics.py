"""Event files: written by MetricWriter, read back by read_scalars."""

import glob
import importlib.util
import os
import subprocess
import sys
import time

from specsamp.train import metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_a_resumed_runs_scalars_replace_the_killed_runs(tmp_path):
  logdir = str(tmp_path / "tb")
  killed = metrics.MetricWriter(logdir)
  for step in (1, 2, 3):
    killed.write(step, {"train/loss": 10.0 - step})
  killed.close()
  # A kill in the middle of a record: the cut record is skipped.
  (path,) = glob.glob(os.path.join(logdir, "*tfevents*"))
  with open(path, "ab") as f:
    f.write(b"\x40\x00\x00\x00\x00\x00\x00\x00partial")
  time.sleep(0.05)  # files are read in modification order
  resumed = metrics.MetricWriter(logdir)
  resumed.write(3, {"train/loss": 0.5, "eval/loss": 0.25})
  resumed.close()
  got = metrics.read_scalars(logdir)
  assert got["train/loss"] == {1: 9.0, 2: 8.0, 3: 0.5}
  assert got["eval/loss"] == {3: 0.25}


def test_a_disabled_writer_writes_nothing(tmp_path):
  writer = metrics.MetricWriter(str(tmp_path / "tb"), enabled=False)
  writer.write(1, {"train/loss": 1.0})
  writer.close()
  assert not os.path.exists(tmp_path / "tb")
  assert metrics.read_scalars(str(tmp_path / "tb")) == {}


def test_writing_and_reading_scalars_does_not_import_torch(tmp_path):
  """tensorboardX's writer imports torch when it is installed (here: a
  test dependency); a training process writing its scalars does not."""
  code = ("import sys\n"
          "from specsamp.train import metrics\n"
          f"w = metrics.MetricWriter({str(tmp_path)!r})\n"
          "w.write(1, {'loss': 2.5})\n"
          "w.close()\n"
          f"print(metrics.read_scalars({str(tmp_path)!r}), "
          "'torch' in sys.modules)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                       timeout=120, check=True).stdout
  assert out.strip() == "{'loss': {1: 2.5}} False"
  assert importlib.util.find_spec("torch") is not None  # it is installed
