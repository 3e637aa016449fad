"""Every file memplan_torch writes is written atomically: to a temporary file in the target's directory, then
renamed over the target; the temporary file is removed when anything fails and on every signal that would end the
process (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2, SIGALRM; SIGKILL cannot be caught), a signal the caller
ignores staying ignored. The file keeps the mode of the one it replaces (a new one: 0666 less the umask). A symbolic link given as the output is written through (its target is replaced and
the link kept); anything else that is not a regular file (a directory, a named pipe, a device, a socket) is
refused before any work starts, in one line naming the flag. So is a path whose directory does not exist: no
folder is made for an output (as memplan fit --emit-out refuses one), so a mistyped path is not created.
"""

import json
import os
import signal
import stat
import sys
import tempfile
import threading


class OutputError(ValueError):
    """An output path that cannot be written; the message names the flag and the path."""


def is_interrupt(err):
    """err is Ctrl-C: a KeyboardInterrupt, or the RuntimeError PyTorch 1.13's C extension makes of one that lands
    while it loads ("KeyboardInterrupt: <EMPTY MESSAGE>")."""
    return isinstance(err, KeyboardInterrupt) or (isinstance(err, RuntimeError) and
                                                  str(err).startswith("KeyboardInterrupt"))


def one_line(err):
    """err on one line, as the command line prints it. Errors of memplan_torch say what to do in their message;
    anything else (a builder's own exception, a bug) is named by its type and first line."""
    msg = " ".join(str(err).split())
    if msg.startswith("memplan_torch"):
        return msg
    return "memplan_torch: %s: %s" % (type(err).__name__, msg or "(no message)")


def exit_interrupted():
    """Ctrl-C's answer on the command line: one line and exit status 130 (128 + SIGINT), never a traceback."""
    print("error: memplan_torch: interrupted; nothing was written", file=sys.stderr)
    return 130


class Interrupted(BaseException):
    """A signal arrived while a file was being written (the temporary file is gone)."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


# Every signal whose default action ends the process, so none leaves the temporary file behind (sweep G, round
# 25: SIGUSR1, SIGALRM and SIGQUIT did); one the caller ignores (nohup's SIGHUP, a background job's SIGINT) stays
# ignored (write does not arm it).
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2",
                                              "SIGALRM") if hasattr(signal, n))

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def resolve(path, flag="--out"):
    """The file to replace for output `path`: the path itself, or, for a symbolic link, the file it points to
    (written through). Raises OutputError for anything that is not a regular file or a path to create."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise OutputError("memplan_torch: %s needs a file path" % flag)
    path = os.fspath(path)
    # abspath drops a trailing separator: --out newdir/ wrote a file named newdir (sweep G, B2)
    if path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep)):
        raise OutputError("memplan_torch: %s %s ends in '%s', which names a directory; give the path of a file to "
                          "write" % (flag, path, path[-1]))
    target = os.path.realpath(path) if os.path.islink(path) else os.path.abspath(path)
    if os.path.islink(path) and os.path.islink(target):  # a loop: realpath gives up on it
        raise OutputError("memplan_torch: %s %s is a symbolic link that loops; give a file path" % (flag, path))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError("memplan_torch: %s %s cannot be written: %s" % (flag, path, e.strerror or e))
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = next((k for f, k in _KINDS if f(st.st_mode)), "not a regular file")
        via = " (through the symbolic link %s)" % path if target != os.path.abspath(path) else ""
        raise OutputError("memplan_torch: %s %s is %s%s; give the path of a file to write"
                          % (flag, target, kind, via))
    check_dir(os.path.dirname(target), path, flag)
    return target


def check_dir(d, path, flag="--out"):
    """Refuses (OutputError naming the flag and `path`) a directory `d` for an output that does not exist, is
    not a directory or is not writable: no folder is made for an output."""
    if not os.path.exists(d):
        raise OutputError("memplan_torch: %s %s: its directory %s does not exist" % (flag, path, d))
    if not os.path.isdir(d):
        raise OutputError("memplan_torch: %s %s: %s is not a directory" % (flag, path, d))
    if not os.access(d, os.W_OK | os.X_OK):
        raise OutputError("memplan_torch: %s %s: the directory %s is not writable" % (flag, path, d))


def check_out(path, flag="--out"):
    """Checks before any work that `path` can be written (see resolve); returns it."""
    resolve(path, flag)
    return path


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def _mode_for(target):
    """The mode the written file gets: the replaced file's, else what open() would give a new file (0666 less
    the umask): the temporary file is 0600, and a fixed 0644 ignored both (sweep G, round 25)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write(path, fill, flag="--out", mode=None):
    """Writes `path` atomically; fill(f) writes the content to the text file f. The file keeps the mode of the
    file it replaces (a new one: 0666 less the umask) unless mode is given."""
    target = resolve(path, flag)
    if mode is None:
        mode = _mode_for(target)
    old = {}
    if threading.current_thread() is threading.main_thread():
        for s in _SIGNALS:
            try:
                if signal.getsignal(s) == signal.SIG_IGN:
                    continue
                old[s] = signal.signal(s, _raise_interrupted)
            except (OSError, ValueError):  # pragma: no cover
                pass
    tmp = None
    try:
        try:
            # the target's extension only when short: .tmp-XXXXXXXX plus a long one went past NAME_MAX for
            # a legal name, refused only after the whole export (sweep G, B6)
            ext = os.path.splitext(target)[1]
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=ext if 0 < len(ext) <= 16 else ".out",
                                       dir=os.path.dirname(target))
            with os.fdopen(fd, "w") as f:
                fill(f)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
            tmp = None
        except OSError as e:
            raise OutputError("memplan_torch: %s %s cannot be written: %s" % (flag, path, e.strerror or e))
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        for s, h in old.items():
            signal.signal(s, h)


def write_json(doc, path, flag="--out", indent=None):
    def fill(f):
        if indent is None:
            json.dump(doc, f, separators=(",", ":"))
        else:
            json.dump(doc, f, indent=indent)
        f.write("\n")
    write(path, fill, flag)


def write_text(text, path, flag="--out"):
    write(path, lambda f: f.write(text), flag)
