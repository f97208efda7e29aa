"""Writing files so that no reader ever sees half of one: results, checkpoints
and data caches go to a temporary file beside the target, renamed onto it in
one step. A writer killed in between leaves its temporary behind; the next
write of the same target removes it."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _json_safe(value: Any) -> Any:
    """NaN and infinities become null: strict JSON that every tool reads."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _host() -> str:
    """This machine's name, as it appears in the names of temporary files."""
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "localhost"


def _alive(pid: int) -> bool:
    """Whether a process `pid` runs on this machine (of any user)."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether it exists
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's; or no pid at all: left alone
        pass
    return True


def remove_stale_temporaries(path: str | Path) -> None:
    """Delete the temporary files of `path` (see `replacing`) whose writer is
    dead: a process of this machine, killed while it wrote, whose pid no longer
    runs. A temporary of a live process, or of another machine sharing the
    folder, stays; so does one whose name says no writer (an older iasgd's)."""
    path = Path(path)
    if os.name != "posix":  # elsewhere os.kill(pid, 0) is no question but a signal
        return
    ours = re.compile(re.escape(f".{path.name}.") + r"(\d+)@" + re.escape(_host())
                      + r"\.[^.]+\.tmp")  # the pid of its writer, on this machine
    with contextlib.suppress(OSError):  # best effort: a folder we cannot list keeps them
        for entry in os.scandir(path.parent):
            match = ours.fullmatch(entry.name)
            if match and not _alive(int(match[1])):
                with contextlib.suppress(FileNotFoundError):  # another writer removed it
                    os.unlink(entry.path)


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block succeeds, move it
    onto `path` in one rename (with the permissions a new file would get), so
    a reader never sees half a file and the old one survives any failure.
    The temporary's name, .NAME.PID@HOST.XXXXXXXX.tmp, says who writes it, so
    that a later write can remove it if that process died first."""
    path = Path(path)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}@{_host()}.", suffix=".tmp",
                               dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_json_atomic(path: str | Path, document: dict[str, Any]) -> None:
    """Write JSON atomically (see `replacing`); non-finite numbers as null."""
    with replacing(path) as tmp, open(tmp, "w") as f:
        json.dump(_json_safe(document), f, indent=2, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
