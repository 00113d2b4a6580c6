"""posenc.runtime.interrupt.StopSignals: a signal is recorded and honoured at the next check, or, with ``now``, stops
the run at once with the run's own message; the exit status is 128 + the signal; the handlers come back."""

import os
import signal

import pytest

from posenc.runtime.interrupt import Interrupted, StopSignals


def test_a_signal_is_recorded_and_raised_at_the_next_check():
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM
        with pytest.raises(Interrupted, match="interrupted by SIGTERM: saved") as exc:
            stop.check("saved")
    assert exc.value.exit_status == 143


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_now_stops_at_the_first_signal_with_the_runs_message(sig, status):
    before = signal.getsignal(sig)
    with pytest.raises(Interrupted) as exc:
        with StopSignals(now=lambda name: f"interrupted by {name}: cells kept in /c"):
            os.kill(os.getpid(), sig)
            pytest.fail("the signal did not stop the block")  # pragma: no cover
    assert str(exc.value) == f"interrupted by {signal.Signals(sig).name}: cells kept in /c"
    assert exc.value.exit_status == status and isinstance(exc.value, KeyboardInterrupt)
    assert signal.getsignal(sig) is before
