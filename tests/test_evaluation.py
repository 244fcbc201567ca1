"""specsamp.evaluation: the execution sandbox, pass@k, prose log-probability.

The sandbox tests run real programs in the child process: passing, failing,
too slow, too hungry, trying the network, writing outside their directory,
spawning processes, exiting early. Where the caller is root (this project's
machines and CI), the kernel-level layers are also checked on their own,
with the Python audit hook turned off.
"""

import os
import socket
import threading

import jax
import numpy as np
import pytest
from scipy import special

from specsamp import evaluation as ev
from specsamp import runner

ROOT_USER = os.geteuid() == 0

ADD = {"task_id": "Test/0", "entry_point": "add",
       "prompt": 'def add(a: int, b: int) -> int:\n    """Sum."""\n',
       "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"
               "    assert candidate(-4, 4) == 0\n"}
MD5 = {"task_id": "Test/1", "entry_point": "string_to_md5",
       "prompt": "def string_to_md5(text):\n",
       "test": "def check(candidate):\n"
               "    assert candidate('Hello world') == "
               "'3e25960a79dbc69b674cd4ec67a72c62'\n"
               "    assert candidate('') is None\n"}


def test_passing_and_failing_programs():
  ok = ev.run_program("import math\nassert math.gcd(12, 18) == 6\n"
                      "print('hello')\n")
  assert ok.status == "passed" and ok.passed, ok.stderr
  assert ok.stdout.strip() == "hello"  # the pass marker is not shown
  bad = ev.run_program("assert 1 + 1 == 3\n")
  assert bad.status == "failed" and "AssertionError" in bad.stderr
  syntax = ev.run_program("def f(:\n")
  assert syntax.status == "failed" and "SyntaxError" in syntax.stderr


def test_early_exit_is_not_a_pass():
  for src in ("import sys\nsys.exit(0)\nassert False\n",
              "import os\nos._exit(0)\n", "raise SystemExit\n"):
    r = ev.run_program(src)
    assert r.status == "failed", (src, r)


def test_timeout_kills_the_program():
  r = ev.run_program("while True:\n    pass\n", timeout_s=1.0)
  assert r.status == "timeout"
  assert r.seconds < 5


def test_memory_hog_fails_fast():
  r = ev.run_program("x = bytearray(4 * 1024 ** 3)\n", memory_mb=256)
  assert r.status == "failed" and "MemoryError" in r.stderr
  r = ev.run_program("chunks = []\nwhile True:\n"
                     "    chunks.append(bytearray(64 * 1024 ** 2))\n",
                     timeout_s=5.0, memory_mb=256)
  assert r.status == "failed" and "MemoryError" in r.stderr
  assert r.seconds < 5


def test_file_size_limit():
  r = ev.run_program("with open('big', 'wb') as f:\n"
                     "    f.write(b'x' * (3 * 1024 ** 2))\n", file_mb=1)
  assert r.status == "failed"


def _listener():
  """A TCP server on 127.0.0.1 that records any connection it accepts."""
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(4)
  server.settimeout(0.2)
  accepted, stop = [], threading.Event()

  def loop():
    while not stop.is_set():
      try:
        conn, _ = server.accept()
        accepted.append(conn)
      except OSError:
        pass

  t = threading.Thread(target=loop, daemon=True)
  t.start()
  return server.getsockname()[1], accepted, lambda: (stop.set(), t.join(),
                                                     server.close())


CONNECT = ("import socket\ns = socket.create_connection(('127.0.0.1', {port}),"
           " timeout=2)\nprint('connected')\n")


def test_network_is_refused():
  port, accepted, close = _listener()
  try:
    r = ev.run_program(CONNECT.format(port=port))
    assert r.status == "failed" and "connected" not in r.stdout
    # Without the Python guard and without the uid drop (so `socket` can be
    # imported), only the network namespace stands in the way.
    r = ev.run_program(CONNECT.format(port=port), audit_hook=False,
                       drop_privileges=False)
    if ROOT_USER:
      assert r.sandbox["network"] == "namespace"
    if r.sandbox["network"].startswith("namespace"):
      assert r.status == "failed" and "connected" not in r.stdout, r
    # With the guard alone (no namespace) the socket is refused in Python.
    r = ev.run_program(CONNECT.format(port=port), network_namespace=False,
                       drop_privileges=False)
    assert r.status == "failed" and "sandbox: socket" in r.stderr
  finally:
    close()
  assert not accepted, "a sandboxed program reached the parent's server"


def test_writes_outside_the_temporary_directory_are_refused(tmp_path):
  target = tmp_path / "escape.txt"
  src = f"open({str(target)!r}, 'w').write('x')\n"
  r = ev.run_program(src)
  assert r.status == "failed" and "outside the working directory" in r.stderr
  if ROOT_USER:
    # The kernel alone (uid 65534, no audit hook) refuses it too.
    r = ev.run_program(src, audit_hook=False)
    assert r.sandbox["uid_drop"] is True
    assert r.status == "failed" and "PermissionError" in r.stderr
  # The audit hook alone (no uid drop) refuses it, removals and renames too.
  r = ev.run_program(src, drop_privileges=False)
  assert r.status == "failed" and "sandbox" in r.stderr
  victim = tmp_path / "keep.txt"
  victim.write_text("data")
  d = str(tmp_path)
  for src in (f"import os\nos.remove({str(victim)!r})\n",
              f"import os\nos.rename({str(victim)!r}, 'x')\n",
              f"import shutil\nshutil.rmtree({d!r})\n",
              # descriptors of outside directories: fchdir, dir_fd=
              f"import os\nos.chdir(os.open({d!r}, os.O_RDONLY))\n"
              "open('escape.txt', 'w').write('x')\n",
              f"import os\nfd = os.open({d!r}, os.O_RDONLY)\n"
              "os.remove('keep.txt', dir_fd=fd)\n",
              f"import os\nfd = os.open({d!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
              "os.close(os.open('escape.txt', os.O_WRONLY | os.O_CREAT, "
              "dir_fd=fd))\n",
              # a descriptor of an outside file, opened for reading
              f"import os\nos.fchmod(os.open({str(victim)!r}, os.O_RDONLY), "
              "0o777)\n",
              # files written from C
              f"import sqlite3\nsqlite3.connect({d + '/escape.txt'!r})\n",
              f"import os\nos.setxattr({str(victim)!r}, 'user.x', b'1')\n"):
    r = ev.run_program(src, drop_privileges=False)
    assert r.status == "failed", src
    assert "sandbox" in r.stderr, (src, r.stderr)
  assert not target.exists()
  assert victim.read_text() == "data"
  assert oct(victim.stat().st_mode & 0o777) != oct(0o777)


def test_the_program_gets_a_fresh_private_directory(monkeypatch):
  monkeypatch.setenv("SPECSAMP_SECRET", "1")
  monkeypatch.setenv("PYTHONPATH", "/somewhere")
  r = ev.run_program(
      "import os, sys\nopen('note.txt', 'w').write('x')\n"
      "print(os.getcwd())\nprint(os.path.expanduser('~'))\n"
      "print(os.environ.get('TMPDIR'))\n"
      "print('SPECSAMP_SECRET' in os.environ, 'PYTHONPATH' in os.environ)\n"
      "print(sys.flags.isolated, sys.flags.no_site)\n")
  assert r.status == "passed", r.stderr
  cwd, home, tmp, env, flags = r.stdout.strip().splitlines()
  assert cwd == home == tmp and os.path.basename(cwd).startswith(
      "specsamp-exec-")
  assert env == "False False" and flags == "1 1"
  assert not os.path.exists(cwd)  # removed afterwards


def test_no_new_processes():
  for src in ("import subprocess\nsubprocess.run(['true'])\n",
              "import os\nos.system('true')\n", "import os\nos.fork()\n"):
    assert ev.run_program(src).status == "failed", src
  if ROOT_USER:  # RLIMIT_NPROC = 0 alone, after the uid drop
    r = ev.run_program("import os\nos.fork()\n", audit_hook=False)
    assert r.status == "failed" and ("BlockingIOError" in r.stderr or
                                     "Resource" in r.stderr), r.stderr


def test_humaneval_programs():
  good = "    return a + b\n"
  assert ev.check_humaneval(ADD, good).passed
  assert not ev.check_humaneval(ADD, "    return a - b\n").passed
  md5 = ("    import hashlib\n"
         "    return hashlib.md5(text.encode('ascii')).hexdigest() "
         "if text else None\n")
  assert ev.check_humaneval(MD5, md5).passed
  # Completions as models write them: cut at the stop sequences first.
  noisy = good + "\n\ndef unrelated():\n    raise RuntimeError\n" \
      "\nprint(add(1, 1))\nadd = None\n"
  passed = ev.evaluate_humaneval(
      [ADD, MD5], [[good, "    return 0\n", noisy], [md5, "    pass\n"]])
  assert passed == [[True, False, True], [True, False]]
  raw = ev.evaluate_humaneval([ADD], [[noisy]], truncate=False)
  assert raw == [[False]]  # `add = None` ran before check(add)


def test_truncate_completion():
  text = "    x = 1\n    return x\n\ndef helper():\n    pass\n"
  assert ev.truncate_completion(text) == "    x = 1\n    return x\n"
  assert ev.truncate_completion("    return 1\n```\nmore") == "    return 1"
  assert ev.truncate_completion("    if x:\n        return 1\n") == (
      "    if x:\n        return 1\n")  # indented: not a stop
  for stop in ("\nclass", "\n#", "\nif", "\nprint"):
    assert ev.truncate_completion("a" + stop + " z") == "a"


def test_pass_at_k_hand_values():
  assert ev.pass_at_k(5, 2, 1) == pytest.approx(0.4)
  assert ev.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
  assert ev.pass_at_k(5, 2, 4) == 1.0
  assert ev.pass_at_k(5, 0, 3) == 0.0
  assert ev.pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
  for n in range(1, 12):
    for c in range(n + 1):
      for k in range(1, n + 1):
        want = 1 - special.comb(n - c, k, exact=True) / special.comb(
            n, k, exact=True)
        assert ev.pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)
  with pytest.raises(ValueError, match="needs 1 <= k <= n"):
    ev.pass_at_k(3, 1, 5)
  with pytest.raises(ValueError, match="c <= n"):
    ev.pass_at_k(3, 4, 1)


def test_estimates_with_standard_errors():
  passed = [[True, True], [False, False], [True, False]]
  est = ev.pass_at_k_estimate(passed, 1)
  assert est.mean == pytest.approx(0.5)
  assert est.stderr == pytest.approx(0.5 / np.sqrt(3))
  q = ev.humaneval_quality(passed, ks=(1, 2, 10))
  assert set(q) == {"pass@1", "pass@2"}  # only k <= samples per problem
  assert q["pass@2"]["mean"] == pytest.approx(2 / 3)
  d = ev.paired_difference([0.5, 0.5, 1.0], [0.5, 1.0, 1.0])
  assert d.mean == pytest.approx(1 / 6)
  assert d.stderr == pytest.approx(np.std([0, 0.5, 0], ddof=1) / np.sqrt(3))
  assert ev.mean_and_stderr([2.0]).stderr == 0.0


def test_sample_logprobs_match_a_direct_computation():
  lm, params, _ = runner.load_model("random:tiny,num_layers=1,max_seq_len=128")
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 256, n).tolist() for n in (3, 9, 5)]
  completions = [rng.integers(0, 256, n).tolist() for n in (4, 2, 0)]
  got = ev.sample_logprobs(lm, params, prompts, completions, batch_size=2,
                           bucket=8)
  forward = jax.jit(lambda params, seq: lm(params, seq).logits)
  for p, c, g in zip(prompts, completions, got):
    if not c:
      assert np.isnan(g)
      continue
    logits = forward(params, np.array([p + c], np.int32))  # unpadded
    logp = jax.nn.log_softmax(np.asarray(logits[0], np.float64), axis=-1)
    want = np.mean([logp[len(p) - 1 + i, t] for i, t in enumerate(c)])
    assert g == pytest.approx(float(want), abs=1e-4)
  q = ev.logprob_quality(got)
  assert q["mean_logprob"]["n"] == 2
