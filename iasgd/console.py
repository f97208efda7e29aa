"""What a run shows on the terminal, and how it answers signals, so that
every way a command-line run can end ends in one line.

- Output whose reader is gone (`| head -1`, `> /dev/full`, a closed
  terminal) is dropped, never an exception: the run trains on and writes
  its results and checkpoint.
- Ctrl-C or SIGTERM while the run starts (imports, data, the model) stops it
  in one line (`Stopped`); once it trains, `Interrupts` asks it to stop at
  the next step and save.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from iasgd.results import EpochRecord, Live

EXIT_SIGINT = 130
EXIT_SIGTERM = 143
SIGNAL_EXITS = {signal.SIGINT: EXIT_SIGINT, signal.SIGTERM: EXIT_SIGTERM}
# the signals a command-line run handles (main() restores their handlers)
SIGNALS = (*SIGNAL_EXITS, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))


def mute(stream: TextIO | None) -> None:
    """Send what `stream` writes from now on to /dev/null: its reader is gone,
    and a later write (the interpreter's last flush too) must not fail."""
    try:
        fd = stream.fileno()  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):  # None, closed, or not a file
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def write_line(line: str, stream: TextIO | None = None) -> None:
    """Print `line` to `stream` (stdout) and flush; a stream that cannot take
    it (a closed pipe, a full disk, a terminal that is gone) is muted."""
    stream = sys.stdout if stream is None else stream
    if stream is None:  # started with the stream closed
        return
    try:
        print(line, file=stream, flush=True)
    except OSError:  # BrokenPipeError, ENOSPC, EIO
        mute(stream)


def error(line: str) -> None:
    """One line on stderr, `iasgd: ` first."""
    write_line(f"iasgd: {line}", sys.stderr)


def _terminal_gone(signum: int, frame: object) -> None:
    """SIGHUP: the terminal closed. The run goes on (as under nohup), its
    output to nowhere."""
    for stream in (sys.stdout, sys.stderr):
        mute(stream)


class Stopped(BaseException):
    """Ctrl-C or SIGTERM while the run was starting; nothing was written."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = SIGNAL_EXITS[signal.Signals(signum)]


def _exit_starting(signum: int, frame: object) -> None:
    """While the modules load: nothing to save or clean up, so exit at once."""
    with contextlib.suppress(OSError):
        os.write(2, b"iasgd: stopped while starting; nothing was written\n")
    os._exit(SIGNAL_EXITS[signal.Signals(signum)])


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(signum)


def exit_quietly_while_importing() -> None:
    """Ctrl-C or SIGTERM before main() runs is one line and its exit code."""
    for signum in SIGNAL_EXITS:
        signal.signal(signum, _exit_starting)


def stop_by_exception() -> None:
    """From here until `Interrupts.install`, Ctrl-C or SIGTERM raises
    Stopped, so that the files being written are cleaned up on the way out;
    and a closed terminal mutes the run instead of ending it."""
    for signum in SIGNAL_EXITS:
        signal.signal(signum, _raise_stopped)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, _terminal_gone)


class Interrupts:
    """SIGINT / SIGTERM while training: the first asks the run to stop at the
    workers' next step and save; a second Ctrl-C exits at once."""

    def __init__(self, saves: str = "a checkpoint and the results") -> None:
        self.signum: int | None = None
        self.saves = saves  # what stopping keeps, as the first signal's line says

    def install(self) -> None:
        for signum in SIGNAL_EXITS:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            error("interrupted again: exiting now without saving")
            os._exit(EXIT_SIGINT)
        self.signum = signum
        error(f"stopping at the next step to save {self.saves} "
              "(Ctrl-C again quits at once)")

    def reason(self) -> str | None:
        return "interrupted" if self.signum is not None else None

    def exit_code(self) -> int:
        return EXIT_SIGTERM if self.signum == signal.SIGTERM else EXIT_SIGINT


class Display:
    """Live progress bar within an epoch, one line per epoch, a summary."""

    def __init__(self, quiet: bool, epochs: int):
        self.quiet = quiet
        self.epochs = epochs
        self.bar = None

    def say(self, line: str) -> None:
        if not self.quiet:
            write_line(line)

    def compiling(self, seconds: tuple[int, int]) -> None:
        """The kernels are about to be compiled (an empty numba cache), in
        about `seconds` (low, high) on this machine as busy as it is now."""
        self.say(f"compiling the kernels of this model and algorithm, which numba's cache does "
                 f"not hold yet (once for each new model, algorithm or option that changes "
                 f"the step): about {seconds[0]}-{seconds[1]} s, longer while other programs "
                 "keep the cores busy")
        self._compile_t0 = time.perf_counter()

    def compiled(self) -> None:
        """Compilation is over: say how long it took (once; only after `compiling`)."""
        t0 = vars(self).pop("_compile_t0", None)
        if t0 is not None:
            self.say(f"kernels compiled in {time.perf_counter() - t0:.1f} s; later runs load "
                     "them from numba's cache")

    def epoch_start(self, epoch: int, num_samples: int) -> None:
        self.compiled()  # the engine compiles before the first epoch starts
        if self.quiet:
            return
        from tqdm import tqdm  # progress bars are a solved problem; tqdm solves it

        self.bar = tqdm(total=num_samples, desc=f"epoch {epoch}/{self.epochs}", unit="sample",
                        unit_scale=True, leave=False, file=sys.stderr, dynamic_ncols=True,
                        disable=None)  # None: no bar when stderr is not a terminal
        self._done = 0

    def progress(self, samples_done: int, live: Live) -> None:
        if self.bar is None:
            return
        parts = [f"{live.updates_per_s:,.0f} upd/s"]
        if live.y is not None:
            parts.append(f"y={live.y}")
        if live.m is not None:
            parts.append(f"m={live.m}")
        parts.append(f"mean tau {live.mean_tau:.2f}")
        try:
            self.bar.set_postfix_str(", ".join(parts), refresh=False)
            self.bar.update(samples_done - self._done)
        except OSError:  # the terminal is gone: no more bars
            self.bar = None
        self._done = samples_done

    def epoch_end(self, r: EpochRecord) -> None:
        if self.bar is not None:
            with contextlib.suppress(OSError):
                self.bar.close()
            self.bar = None
        cut = "" if r.complete else "  (cut short by --time-budget)"
        self.say(f"epoch {r.epoch:3d}  train loss {r.train_loss:.4f}  test acc "
                 f"{100 * r.test_accuracy:6.2f}%  elapsed {r.wall_s:7.1f}s  "
                 f"{r.samples_per_s:,.0f} samples/s{cut}")
