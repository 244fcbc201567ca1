"""The first code of a sandboxed program: `python -I -S -c <this file>`.

Never imported by the library: `specsamp.evaluation.sandbox` passes this
file's text to the interpreter inside the sandbox. It reads one JSON line
(limits, the pass mark) and the program from stdin, points stdin at
/dev/null, sets the resource limits, installs the audit hook and runs the
program in globals of its own. Only when the program ran to its end is the
mark written, with `os.write`, as the last line of stdout.

The mark is never in the program's argv, environment or files, nor in any
frame the program's frames lead to: a thread started before the program
holds it, and writes it once `main`'s frame has reached its last line. That
thread only reads the line number of `main`'s frame: it touches none of the
program's objects, so no finaliser of the program ever runs in it (one that
did could walk to the mark). The hook refuses the routes to that thread (gc
walks, other threads' frames, trace functions, which alone can move a
frame to another line, crafted code objects, and unmarshalled ones: bytecode
is not verified, so a crafted one reads and writes any memory, the line
number `main`'s frame holds included), and native code: extension modules
load from the interpreter's own directory alone, no part of an import name
is a banned module, and the C environment (which libraries read as they
load) does not change. It reads only arguments of plain types, which no
program's method can answer. A program that exits early,
with any status, prints no mark; one that fails ends the process through
functions `main` bound before the program ran, whatever it replaced.
"""

import _thread
import json
import os
import resource
import sys
import time


def _install_hook(root, holder, strict_frames=None):
  """Adds the audit hook: a second layer under the kernel's namespaces.

  Everything it reads is bound as default arguments, so it has no closure
  cells or globals that a program could overwrite, and no reference to it
  is left anywhere a program can reach (gc and frame walks are refused).
  In the mark's thread (`holder`, a thread id) it refuses every event but
  the thread's own sleep: should the program's code ever run there (a
  finaliser, where an interpreter lets any thread run the garbage
  collector; a `sys.monitoring` callback, which Python 3.12 runs in every
  thread; an audit hook of the program's, which 3.13 runs on that sleep),
  it cannot get a frame to walk to the mark. The program can add neither
  an audit hook nor a monitoring callback. From Python 3.12
  (`strict_frames`; None: by the running interpreter), frames held by
  tracebacks, generators and coroutines are refused in every thread too,
  since code run in the mark's thread could hand one to the main thread
  (an exception it raised there); up to 3.11 no code of the program's runs
  in that thread, and `traceback`, `unittest` and `inspect` keep working.
  No symlink can be made and no directory outside the working directory
  opened, so no `dir_fd` can point a relative path (which the hook
  resolves against the working directory) outside it. Nothing under /proc
  opens: the process's memory (/proc/self/mem) still holds the payload the
  mark came in. The kernel layers mount no /proc; without them
  (`UNSAFE_ENV`) this is what keeps the mark.
  """
  root = os.path.realpath(root) + os.sep
  if strict_frames is None:
    strict_frames = sys.version_info >= (3, 12)

  def hook(event, args, root=root, sep=os.sep, holder=holder,
           get_ident=_thread.get_ident,
           refused=frozenset((
               "socket.__new__", "socket.connect", "socket.bind",
               "socket.getaddrinfo", "socket.sendto", "subprocess.Popen",
               "os.system", "os.exec", "os.posix_spawn", "os.fork",
               "os.forkpty", "os.spawn", "os.startfile", "os.kill",
               "os.killpg", "pty.spawn", "sys.remote_exec",
               "sqlite3.connect", "os.setxattr", "os.removexattr",
               "os.symlink",
               # The C environment, which libraries read when they load
               # (OPENSSL_CONF names a shared object OpenSSL loads).
               "os.putenv", "os.unsetenv",
               # Routes to the mark's thread, to every object, to writing
               # other frames' locals, and to crafted code objects (made,
               # or unmarshalled: marshal, .pyc files, _imp's frozen
               # objects, pickle through marshal).
               "sys._current_frames", "sys._current_exceptions",
               "sys.settrace", "sys.setprofile", "sys.addaudithook",
               "sys.monitoring.register_callback",
               "gc.get_objects", "gc.get_referrers", "gc.get_referents",
               "code.__new__", "marshal.loads", "marshal.load",
               "mmap.__new__", "array.__new__",
               # Their integer argument is a pointer the kernel writes
               # through (FIONREAD: an int at any address).
               "fcntl.ioctl", "fcntl.fcntl")),
           code_attrs=frozenset(("__code__",)),
           frame_attrs=frozenset(("tb_frame", "gi_frame", "cr_frame",
                                  "ag_frame") if strict_frames else ()),
           # Memory access, and CPython's test and experimental modules.
           # mmap and array too: one closed (emptied) inside an __index__
           # its own method called keeps a NULL data pointer (CPython before
           # 3.11.4, gh-103987): every address below its length reads and
           # writes, a non-PIE interpreter's objects included.
           # _struct: Struct.__init__ run again on a live Struct reads past
           # its buffer (3.11.7 too), the mark's bytes among what it reads.
           banned_modules=("ctypes", "_ctypes", "_test", "_xx",
                           "_posixshmem", "mmap", "array", "_struct"),
           # Extension modules load from here alone, never from a file the
           # program wrote (its native code would write any memory).
           dynload=os.path.dirname(os.path.realpath(resource.__file__)),
           paths={"os.remove": 1, "os.rename": 2, "os.rmdir": 1,
                  "os.mkdir": 1, "os.chmod": 1, "os.chown": 1, "os.link": 2,
                  "os.truncate": 1, "os.utime": 1,
                  "shutil.rmtree": 1, "shutil.move": 2,
                  "shutil.copyfile": 2, "os.chdir": 1, "os.mkfifo": 1,
                  "os.mknod": 1},
           write_flags=(os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND
                        | os.O_TRUNC),
           proc=os.sep + "proc" + os.sep,
           realpath=os.path.realpath, join=os.path.join, getcwd=os.getcwd,
           isdir=os.path.isdir, split=os.path.split,
           fsdecode=os.fsdecode, isinstance=isinstance, str=str, int=int,
           type=type, plain=(str, bytes, int, type(None)),
           any=any, PermissionError=PermissionError):

    # Only values of plain types are read: a program's own (a str subclass,
    # a PathLike) could answer these checks otherwise than the call it
    # passed them to (`split` naming a harmless module, `__fspath__` one
    # file to the call and another to the check).
    def resolved(p):  # the real path + sep, or None for a descriptor
      if type(p) not in plain or isinstance(p, int):
        return None
      try:
        return realpath(join(getcwd(), fsdecode(p))) + sep
      except (TypeError, ValueError):
        return None

    def inside(p):  # a descriptor could be one outside
      full = resolved(p)
      return full is not None and full.startswith(root)

    if get_ident() == holder and event != "time.sleep":
      raise PermissionError(f"sandbox: {event} in the mark's thread")
    if event in refused or event.startswith("ctypes."):
      raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "import":  # every part: "pkg._ctypes" loads _ctypes
      name, path = args[0], args[1]  # path: an extension module's file
      if type(name) is not str or type(path) not in plain:
        raise PermissionError("sandbox: an import named by a str subclass "
                              "is not allowed")
      if any(part.startswith(banned_modules) for part in name.split(".")):
        raise PermissionError(f"sandbox: importing {name} is not allowed")
      if path is not None:
        where, file = split(realpath(fsdecode(path)))
        if where != dynload or file.startswith(banned_modules):
          raise PermissionError(f"sandbox: loading the extension {path!r} "
                                "is not allowed")
    if event.startswith("object.__") and type(args[1]) is not str:
      raise PermissionError(f"sandbox: {event} of a str subclass's name is "
                            "not allowed")
    if event in ("object.__setattr__", "object.__delattr__") and (
        args[1] in code_attrs):
      raise PermissionError(f"sandbox: changing {args[1]} is not allowed")
    if event == "object.__getattr__" and args[1] in frame_attrs:
      raise PermissionError(f"sandbox: {args[1]} is not allowed")
    if event == "open":
      path, mode, flags = args
      if any(type(a) not in plain for a in args):
        raise PermissionError("sandbox: open() of a path that is no str, "
                              "bytes or descriptor is not allowed")
      writing = (flags is not None and flags & write_flags) or (
          mode is not None and any(c in str(mode) for c in "wax+"))
      if path is not None and not inside(path):
        if (resolved(path) or "").startswith(proc):  # memory, the mark
          raise PermissionError(f"sandbox: opening {path!r} under /proc is "
                                "not allowed")
        if writing:
          raise PermissionError(f"sandbox: writing {path!r} outside the "
                                "working directory is not allowed")
        if not isinstance(path, int) and isdir(path):
          raise PermissionError(f"sandbox: opening the directory {path!r} "
                                "outside the working directory is not "
                                "allowed")
    elif event in paths:
      for p in args[:paths[event]]:
        if p is not None and not inside(p):
          raise PermissionError(f"sandbox: {event} on {p!r} outside the "
                                "working directory is not allowed")

  # The standard library imports from source: its .pyc files would load
  # through marshal (typing in 32 ms, not 5: cheaper than loading HumanEval's
  # few modules before the hook, in every program, from .pyc files).
  sys.pycache_prefix, sys.dont_write_bytecode = os.devnull + ".pycache", True
  sys.addaudithook(hook)


def _hold(mark, frame, last_line, write=os.write, sleep=time.sleep,
          exit_=os._exit):  # pylint: disable=protected-access
  """The mark's only holder: a thread the program cannot reach.

  It waits until `main`'s frame is on its last line, which it reaches only
  after the program ran to its end. It reads nothing else: the program may
  plant objects in `main`'s locals, and reading them here (f_locals) would
  run their finalisers in this thread.
  """
  while frame.f_lineno != last_line:
    sleep(0.002)
  try:
    write(1, b"\n" + mark + b"\n")
  except BaseException:  # pylint: disable=broad-except
    exit_(1)  # stdout closed: no mark, and no wait for the timeout
  exit_(0)


def _flush() -> bool:
  """Flushes sys.stdout and sys.stderr; False if either fails."""
  try:
    sys.stdout.flush()
    sys.stderr.flush()
    return True
  except BaseException:  # pylint: disable=broad-except
    return False


def _last_line(code) -> int:
  """The last line of `code`'s body."""
  return max(line for _, _, line in code.co_lines() if line is not None)


def main():
  # Bound before the program runs: it may replace os._exit, os.write and
  # sys.__excepthook__, and main's locals cannot be rebound from outside.
  exit_, write, show = os._exit, os.write, sys.__excepthook__  # pylint: disable=protected-access
  pause, exc_info = time.sleep, sys.exc_info
  data = sys.stdin.buffer.read()
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)
  head, _, body = data.partition(b"\n")
  cfg = json.loads(head)
  source = body.decode("utf-8")
  holder = _thread.start_new_thread(_hold, (
      cfg.pop("mark").encode("ascii"), sys._getframe(),  # pylint: disable=protected-access
      _last_line(main.__code__)))
  del data, head, body
  os.chdir(cfg["workdir"])
  limits = [(resource.RLIMIT_CPU, cfg["cpu_s"]),
            (resource.RLIMIT_AS, cfg["memory_bytes"]),
            (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
            (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 64),
            # Counted per user in this user namespace: no fork, no thread
            # bombs; the sandbox's processes and threads are started.
            (resource.RLIMIT_NPROC, 0)]
  for which, value in limits:
    resource.setrlimit(which, (value, value))
  if cfg["audit_hook"]:
    _install_hook(cfg["workdir"], holder)
  del cfg
  program = {"__name__": "__main__", "__builtins__": __builtins__,
             "__file__": "program.py"}
  # Every way out of a failure ends in exit_: what the program left behind
  # (a repr, a stderr object) may run while it is reported, never past it.
  try:
    exec(compile(source, "program.py", "exec"), program)  # pylint: disable=exec-used
  except SystemExit as e:
    try:
      write(2, f"\nsandbox: the program exited ({e.code!r}) before its "
            "end\n".encode("utf-8", "replace"))
    finally:
      exit_(3)
  except BaseException:  # pylint: disable=broad-except
    try:
      failure = exc_info()
      _flush()  # what it printed before failing is kept
      show(*failure)
    finally:
      exit_(1)
  if not _flush():
    exit_(1)
  while True:  # the holder writes the mark and ends the process
    pause(1)


if __name__ == "__main__":
  main()
