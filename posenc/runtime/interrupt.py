"""Stop a long run cleanly on SIGINT (Ctrl-C) or SIGTERM: save what it has, then exit with one line.

``with StopSignals() as stop:`` replaces the handlers of SIGINT and SIGTERM for the block (main thread
only; elsewhere it does nothing) by one that only records the signal. The run calls :meth:`StopSignals.check`
at points where its state is saved (after a training step's checkpoint, after an evaluation cell), which
raises :class:`Interrupted` once a signal arrived. A second signal while the run is still saving raises
:class:`Interrupted` at once: every file posenc writes is committed atomically, so that loses at most the
save in progress, never a previous one. The previous handlers come back when the block ends.

``StopSignals(now=message)`` stops at the first signal instead: the handler raises :class:`Interrupted` with
``message(signal name)`` wherever the run is. For a run whose work in flight is worth nothing once stopped and whose
every write is atomic (the cells of the suite and of ``posenc tune``: a cell being computed is simply computed again
on resume, a cell being written is either whole or absent), so neither Ctrl-C nor a scheduler's SIGTERM waits for a
long prefill to end.

:class:`Interrupted` is a ``KeyboardInterrupt`` (``except Exception`` does not swallow it); its message is
the one line ``posenc`` prints (:mod:`posenc.cli`), and :attr:`Interrupted.exit_status` is the shell's
``128 + signal number`` (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import signal
import threading

__all__ = ["Interrupted", "StopSignals"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal after saving what it had; ``str(exc)`` says what was kept and how to resume."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = int(signum)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "interrupted"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopSignals:
    """Records SIGINT/SIGTERM instead of dying; see the module docstring. Nesting is fine: an inner block
    restores the outer block's handler and hands a signal it recorded to the outer block."""

    def __init__(self, now=None):
        self.signum: int | None = None
        self.now = now  # a function of the signal name giving the message: stop at the first signal (module docstring)
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - the signal module's signature
        if self.now is not None and self.signum is None:
            self.signum = signum
            raise Interrupted(self.now(signal_name(signum)), signum)
        if self.signum is not None:
            raise Interrupted(f"interrupted again by {signal_name(signum)} while saving: stopped at once (what was "
                              f"committed before is intact; run the same command to resume)", signum)
        self.signum = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
        outer = signal.getsignal(signal.SIGINT)
        if self.signum is not None and isinstance(getattr(outer, "__self__", None), StopSignals):
            outer.__self__.signum = outer.__self__.signum or self.signum  # the outer run stops too

    def check(self, message) -> None:
        """Raise :class:`Interrupted` with ``message`` (a string, or a function of the signal name giving one)
        when a signal was recorded."""
        if self.signum is None:
            return
        name = signal_name(self.signum)
        raise Interrupted(message(name) if callable(message) else f"interrupted by {name}: {message}", self.signum)
