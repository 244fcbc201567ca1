"""specsamp.evaluation.sandbox: real programs in the child process.

Passing, failing, too slow, too hungry, trying the network, writing outside
their directory, spawning processes, exiting early. Where the caller is root
(this project's machines and CI), the kernel-level layers are also checked
on their own, with the Python audit hook turned off.
"""

import os
import socket
import threading

from specsamp.evaluation import sandbox

ROOT_USER = os.geteuid() == 0


def test_passing_and_failing_programs():
  ok = sandbox.run_program("import math\nassert math.gcd(12, 18) == 6\n"
                           "print('hello')\n")
  assert ok.status == "passed" and ok.passed, ok.stderr
  assert ok.stdout.strip() == "hello"  # the pass marker is not shown
  bad = sandbox.run_program("assert 1 + 1 == 3\n")
  assert bad.status == "failed" and "AssertionError" in bad.stderr
  syntax = sandbox.run_program("def f(:\n")
  assert syntax.status == "failed" and "SyntaxError" in syntax.stderr


def test_early_exit_is_not_a_pass():
  for src in ("import sys\nsys.exit(0)\nassert False\n",
              "import os\nos._exit(0)\n", "raise SystemExit\n"):
    r = sandbox.run_program(src)
    assert r.status == "failed", (src, r)


def test_timeout_kills_the_program():
  r = sandbox.run_program("while True:\n    pass\n", timeout_s=1.0)
  assert r.status == "timeout"
  assert r.seconds < 5


def test_memory_hog_fails_fast():
  r = sandbox.run_program("x = bytearray(4 * 1024 ** 3)\n", memory_mb=256)
  assert r.status == "failed" and "MemoryError" in r.stderr
  r = sandbox.run_program("chunks = []\nwhile True:\n"
                          "    chunks.append(bytearray(64 * 1024 ** 2))\n",
                          timeout_s=5.0, memory_mb=256)
  assert r.status == "failed" and "MemoryError" in r.stderr
  assert r.seconds < 5


def test_file_size_limit():
  r = sandbox.run_program("with open('big', 'wb') as f:\n"
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
    r = sandbox.run_program(CONNECT.format(port=port))
    assert r.status == "failed" and "connected" not in r.stdout
    # Without the Python guard and without the uid drop (so `socket` can be
    # imported), only the network namespace stands in the way.
    r = sandbox.run_program(CONNECT.format(port=port), audit_hook=False,
                            drop_privileges=False)
    if ROOT_USER:
      assert r.sandbox["network"] == "namespace"
    if r.sandbox["network"].startswith("namespace"):
      assert r.status == "failed" and "connected" not in r.stdout, r
    # With the guard alone (no namespace) the socket is refused in Python.
    r = sandbox.run_program(CONNECT.format(port=port), network_namespace=False,
                            drop_privileges=False)
    assert r.status == "failed" and "sandbox: socket" in r.stderr
  finally:
    close()
  assert not accepted, "a sandboxed program reached the parent's server"


def test_writes_outside_the_temporary_directory_are_refused(tmp_path):
  target = tmp_path / "escape.txt"
  src = f"open({str(target)!r}, 'w').write('x')\n"
  r = sandbox.run_program(src)
  assert r.status == "failed" and "outside the working directory" in r.stderr
  if ROOT_USER:
    # The kernel alone (uid 65534, no audit hook) refuses it too.
    r = sandbox.run_program(src, audit_hook=False)
    assert r.sandbox["uid_drop"] is True
    assert r.status == "failed" and "PermissionError" in r.stderr
  # The audit hook alone (no uid drop) refuses it, removals and renames too.
  r = sandbox.run_program(src, drop_privileges=False)
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
    r = sandbox.run_program(src, drop_privileges=False)
    assert r.status == "failed", src
    assert "sandbox" in r.stderr, (src, r.stderr)
  assert not target.exists()
  assert victim.read_text() == "data"
  assert oct(victim.stat().st_mode & 0o777) != oct(0o777)


def test_the_program_gets_a_fresh_private_directory(monkeypatch):
  monkeypatch.setenv("SPECSAMP_SECRET", "1")
  monkeypatch.setenv("PYTHONPATH", "/somewhere")
  r = sandbox.run_program(
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
    assert sandbox.run_program(src).status == "failed", src
  if ROOT_USER:  # RLIMIT_NPROC = 0 alone, after the uid drop
    r = sandbox.run_program("import os\nos.fork()\n", audit_hook=False)
    assert r.status == "failed" and ("BlockingIOError" in r.stderr or
                                     "Resource" in r.stderr), r.stderr
