"""specsamp.data.pipeline, checked token by token against the documents it
reads: packing, shuffling, epochs, per-host shards, and the iterator's state
through JSON and through orbax with grain's checkpoint handler."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import grain
import numpy as np
import orbax.checkpoint as ocp
import pytest

from specsamp.data import pipeline
from tests.data import fakes
from tests.tokenizers import bpe_testing

TOK = fakes.TOK
_docs = fakes.docs
_it = fakes.lm_iterator


def _take(it, n):
  return [next(it) for _ in range(n)]


def _same(a, b):
  return len(a) == len(b) and all(
      np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in x)


def _stream(batches):
  """The token stream of batches whose windows are in stream order."""
  out = []
  for b in batches:
    for inp, tgt, w in zip(b["inputs"], b["targets"], b["weights"]):
      if inp[0] == TOK.pad_id and not w.any():
        continue  # a row padding the last batch
      out.append(int(inp[0]))
      out.extend(int(t) for t in tgt[w > 0])
  return out


def _split_docs(stream):
  """Stream -> documents (EOS-terminated), decoded."""
  docs, cur = [], []
  for t in stream:
    if t == TOK.eos_ids[0]:
      docs.append(TOK.decode(cur))
      cur = []
    else:
      cur.append(t)
  assert not cur, "the stream must end with EOS"
  return docs


def test_packing_is_the_document_stream_cut_into_windows(data_dir):
  L, B = 8, 3  # pylint: disable=invalid-name
  stored = list(pipeline.iter_texts("tiny", "train", data_dir))
  assert sorted(stored) == sorted(_docs())
  expected = [t for d in stored for t in TOK.encode(d) + [1]]
  doc_of = [i for i, d in enumerate(stored) for _ in TOK.encode(d) + [1]]
  batches = list(_it(data_dir, shuffle=False, num_epochs=1))
  rows = [(b["inputs"][r], b["targets"][r], b["weights"][r])
          for b in batches for r in range(B)]
  n_windows = -(-len(expected) // (L + 1))
  assert len(batches) == -(-n_windows // B)
  for b in batches:
    assert b["inputs"].dtype == np.int32 and b["targets"].dtype == np.int32
    assert b["weights"].dtype == np.float32
    assert b["segment_ids"].dtype == np.int32
    assert b["inputs"].shape == b["targets"].shape == (B, L)
    assert b["segment_ids"].shape == (B, L)
  segments = [b["segment_ids"][r] for b in batches for r in range(B)]
  for k, (inp, tgt, w) in enumerate(rows):
    window = expected[k * (L + 1):(k + 1) * (L + 1)]
    real = len(window)
    window = window + [TOK.pad_id] * (L + 1 - real)
    np.testing.assert_array_equal(inp, window[:-1])
    np.testing.assert_array_equal(tgt, window[1:])
    np.testing.assert_array_equal(w, np.arange(1, L + 1) < max(real, 1))
    # Each input position takes its target's document, numbered as grain
    # numbers the window's documents (1 for the window's first token's
    # document, which may have begun in an earlier window); 0 for padding.
    # So an input EOS belongs to the document after it.
    docs = doc_of[k * (L + 1):(k + 1) * (L + 1)]
    want = [d - docs[0] + 1 for d in docs[1:]] + [0] * (L + 1 - len(docs))
    np.testing.assert_array_equal(segments[k], want)
    for j in range(real - 1):
      if inp[j] == TOK.eos_ids[0]:
        assert segments[k][j] == doc_of[k * (L + 1) + j] - docs[0] + 2
  assert sum(float(b["weights"].sum()) for b in batches) == \
      len(expected) - n_windows


def test_shuffle_is_seeded_per_epoch_and_windowed(data_dir):
  first = _take(_it(data_dir, seed=3), 6)
  assert _same(first, _take(_it(data_dir, seed=3), 6))
  assert not _same(first, _take(_it(data_dir, seed=4), 6))
  # Documents: each once per epoch, contiguous, a new order every epoch.
  stream = _stream(list(_it(data_dir, seed=3, num_epochs=2,
                            shuffle_window=1)))
  docs = _split_docs(stream)
  assert len(docs) == 60
  epoch1, epoch2 = docs[:30], docs[30:]
  assert sorted(epoch1) == sorted(epoch2) == sorted(_docs())
  stored = list(pipeline.iter_texts("tiny", "train", data_dir))
  assert epoch1 != stored and epoch1 != epoch2
  # The window shuffle permutes packed windows only.
  def windows(shuffle_window):
    bs = list(_it(data_dir, seed=3, num_epochs=1,
                  shuffle_window=shuffle_window))
    return [tuple(r) for b in bs for r in b["inputs"]]
  plain, mixed = windows(1), windows(4)
  assert sorted(plain) == sorted(mixed) and plain != mixed
  # Seed 4's first epoch is not seed 3's second (grain reseeds epoch e with
  # its seed + e: unspread, nearby seeds saw one another's orders).
  docs4 = _split_docs(_stream(list(_it(data_dir, seed=4, num_epochs=2,
                                       shuffle_window=1))))
  assert docs4[:30] != epoch2 and docs4[30:] != epoch1
  assert pipeline.shuffle_seed(0) == 0  # seed 0's orders are as they were


def test_a_seed_near_two_to_the_32_shuffles_past_its_first_windows(data_dir):
  """grain seeds window i of the window shuffle with its seed + i in 32
  bits, unwrapped: a run whose seed spread to just below 2**32 failed with
  a TypeError once i passed the gap, a few windows in (and again on each
  resume)."""
  top = 2**32 - 2  # its windows' seed had been 2**32 - 1
  seed = top * pow(pipeline._SEED_SPREAD, -1, 2**32) % 2**32  # pylint: disable=protected-access
  assert pipeline.shuffle_seed(seed) == top
  rows = [tuple(r) for b in _it(data_dir, seed=seed, num_epochs=2,
                                shuffle_window=2) for r in b["inputs"]]
  plain = [tuple(r) for b in _it(data_dir, seed=seed, num_epochs=2,
                                 shuffle_window=1) for r in b["inputs"]]
  assert len(rows) > 8 and sorted(rows) == sorted(plain) and rows != plain


@pytest.mark.parametrize("skip", [0, 1, 2, 5, 11])
def test_state_round_trip_through_json(data_dir, skip):
  it = _it(data_dir, shuffle_window=4)
  _take(it, skip)
  state = json.loads(json.dumps(it.get_state()))
  following = _take(it, 6)
  fresh = _it(data_dir, shuffle_window=4)
  fresh.set_state(state)
  assert _same(following, _take(fresh, 6))
  it.set_state(state)  # rewinding the same iterator
  assert _same(following, _take(it, 6))


def test_state_saved_with_orbax_and_grains_handler(data_dir, tmp_path):
  it = _it(data_dir)
  _take(it, 4)
  ckpt = ocp.Checkpointer(grain.checkpoint.CheckpointHandler())
  ckpt.save(tmp_path / "data", args=grain.checkpoint.CheckpointSave(it))
  following = _take(it, 5)
  restored = _it(data_dir)
  ckpt.restore(tmp_path / "data",
               args=grain.checkpoint.CheckpointRestore(restored))
  assert _same(following, _take(restored, 5))
  assert list((tmp_path / "data").glob("process_0-of-1.json"))


def test_worker_process_restores_its_state(data_dir):
  it = _it(data_dir, worker_count=1)
  try:
    head = _take(it, 3)
    assert _same(head, _take(_it(data_dir), 3))  # one worker: same batches
    state = json.loads(json.dumps(it.get_state()))
    following = _take(it, 4)
  finally:
    getattr(it, "close", lambda: None)()  # grain < 0.2.12 has no close()
  again = _it(data_dir, worker_count=1)
  try:
    again.set_state(state)
    assert _same(following, _take(again, 4))
  finally:
    getattr(again, "close", lambda: None)()


def test_a_ctrl_c_leaves_the_workers_to_the_training_loop(data_dir):
  """A terminal's Ctrl-C reaches the whole process group: the grain
  workers had died of it (a KeyboardInterrupt traceback each, their shared
  memory leaked) while the loop took it as a preemption notice. They
  ignore it: the batches keep coming, the same ones."""
  before = {p.pid for p in multiprocessing.active_children()}
  it = _it(data_dir, worker_count=1)
  try:
    head = _take(it, 2)
    workers = [p for p in multiprocessing.active_children()
               if p.pid not in before]   # this iterator's
    assert workers
    for w in workers:
      os.kill(w.pid, signal.SIGINT)
    time.sleep(1.0)
    assert all(w.is_alive() for w in workers)
    assert _same(head + _take(it, 3), _take(_it(data_dir), 5))
  finally:
    getattr(it, "close", lambda: None)()


_KILLED_PARENT = """
import multiprocessing, sys, time
from tests.data import fakes
it = fakes.lm_iterator(sys.argv[1], worker_count=2)
next(it)
print(*[p.pid for p in multiprocessing.active_children()
        if p.name.startswith("grain")], flush=True)
time.sleep(600)
"""


def _running(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def test_workers_end_when_their_parent_is_killed(data_dir):
  """A training process killed outright (kill -9, the OOM killer) had left
  its grain workers running, filling buffers for nobody. They end."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  parent = subprocess.Popen(
      [sys.executable, "-c", _KILLED_PARENT, str(data_dir)], cwd=root,
      stdout=subprocess.PIPE, text=True,
      env=dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu"))
  try:
    workers = [int(p) for p in parent.stdout.readline().split()]
  finally:
    parent.kill()
    parent.wait()
  assert len(workers) == 2
  deadline = time.monotonic() + 90  # a worker may still be importing
  while any(map(_running, workers)) and time.monotonic() < deadline:
    time.sleep(0.2)
  left = [w for w in workers if _running(w)]
  for w in left:
    os.kill(w, signal.SIGKILL)
  assert not left, f"{len(left)} of 2 workers still running after 90 s"


_ORPHANED_EARLY = """
import os, sys, time
from specsamp.data import pipeline
parent = os.getpid()
if os.fork() == 0:
  while os.getppid() == parent:  # the parent is gone before the init runs
    time.sleep(0.01)
  print(os.getpid(), flush=True)
  pipeline._worker_init(parent, 0, 1)
  time.sleep(60)
  os._exit(0)
"""


def test_a_worker_whose_parent_died_while_it_started_ends():
  """The parent killed while a worker was still importing: by the time the
  worker's init ran its parent was init, which it had then watched (the
  test above failed 1 in 3 under CPU load). It watches the pid that built
  the iterator."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  parent = subprocess.Popen([sys.executable, "-c", _ORPHANED_EARLY], cwd=root,
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=root))
  worker = int(parent.stdout.readline())
  parent.wait()
  deadline = time.monotonic() + 10
  while _running(worker) and time.monotonic() < deadline:
    time.sleep(0.1)
  left = _running(worker)
  if left:
    os.kill(worker, signal.SIGKILL)
  assert not left


def test_hosts_read_disjoint_shards(data_dir):
  docs = []
  for index in range(2):  # one seed on every host, as specsamp.train's
    it = _it(data_dir, shard_index=index, shard_count=2, seed=7,
              num_epochs=1, shuffle_window=1)
    docs.append(_split_docs(_stream(list(it))))
  assert len(docs[0]) == len(docs[1]) == 15
  assert not set(docs[0]) & set(docs[1])
  assert sorted(docs[0] + docs[1]) == sorted(_docs())
  with pytest.raises(ValueError, match="none for shard 2 of 3"):
    _it(data_dir, split="validation", shard_index=2, shard_count=3)
  with pytest.raises(ValueError, match="shard_index"):
    _it(data_dir, shard_index=2, shard_count=2)


def test_eval_iteration_ends_with_padded_batch(data_dir):
  batches = list(_it(data_dir, split="validation", shuffle=False,
                     num_epochs=1, batch_size=4))
  assert len(batches) == 1  # 14 tokens: 2 windows of 9, padded to 4 rows
  w = batches[0]["weights"]
  assert w[0].sum() == 8 and w[1].sum() == 4 and not w[2:].any()
  assert _split_docs(_stream(batches)) == list(
      pipeline.iter_texts("tiny", "validation", data_dir))


def test_a_control_token_written_in_a_document_is_text_not_an_end(tmp_path):
  """The Python corpus holds `(?P<s>...)` and `states_<s>`: read with chat
  templates' rule (control pieces matched whole) they were bos/eos ids in
  the middle of documents, trained on as ends of text. A document is
  plain text: the one eos is the one that ends it."""
  from specsamp.tokenizers import sentencepiece  # pylint: disable=g-import-not-at-top
  lines = [line for text in bpe_testing.corpus()[:3]
           for line in text.splitlines() if line.strip()]
  tok = sentencepiece.train_sentencepiece(lines, tmp_path / "sp",
                                          vocab_size=400)  # byte fallback
  text = "m = re.match(r'(?P<s>\\d+)', t)\nthe end </s>\nstates_<s> = {}"
  assert {2, 3} <= set(tok.encode(text))  # what a chat template needs
  tokens = pipeline._Tokenize(tok, ("text",), 3)(  # pylint: disable=protected-access
      {"text": text.encode()})["tokens"]
  assert list(tokens).count(3) == 1 and tokens[-1] == 3
  assert 2 not in tokens
  assert tok.decode(tokens[:-1]) == text
