"""The time limit on one call of a learner's function: `TimeLimit` stops the call once its seconds have passed.

A SIGALRM timer in the main thread (a Jupyter kernel runs cells there), a trace function elsewhere, and only an
after-the-fact `overran` where neither can act (`helpers.course.check` says which in its documentation).
`CaseTimeout` is what the limit raises inside the learner's code.
"""
from __future__ import annotations

import signal
import sys
import threading
import time


class CaseTimeout(BaseException):
    """Raised inside a learner's function when its case's time is up. A BaseException, so that a learner's
    `except Exception:` inside a loop does not swallow it."""


class TimeLimit:
    """`with TimeLimit(seconds): ...` raises CaseTimeout in the block once `seconds` have passed.

    In the main thread where `signal.setitimer` exists: a SIGALRM timer (`how == "signal"`), which stops
    Python code whatever it does, repeated every 0.5 s until the block ends, so a learner's `except:` that
    catches it once does not end the limit; an outer SIGALRM handler and timer are put back afterwards, the timer with
    its remaining time (fired at once if it fell due meanwhile). Elsewhere, unless a debugger already traces
    this thread: a trace function (`how == "trace"`) that raises at the first Python line run after the
    deadline. Otherwise (`how == "clock"`) nothing can stop the block and only `overran` tells afterwards.
    `overran` is True when the block took longer than `seconds`, however it ended.
    """

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.how = "clock"
        self.active = False
        self._start = 0.0
        self._outer: tuple = ()
        self._tracing = False

    @property
    def overran(self) -> bool:
        return time.monotonic() - self._start > self.seconds

    def _alarm(self, signum, frame):
        if self.active:
            raise CaseTimeout()

    def _trace(self, frame, event, arg):
        if self.active and time.monotonic() - self._start > self.seconds:
            self.active = False  # raised once: an exception from a trace function also ends the tracing
            raise CaseTimeout()
        return self._trace

    def __enter__(self) -> "TimeLimit":
        self._start = time.monotonic()
        main = threading.current_thread() is threading.main_thread()
        if main and hasattr(signal, "setitimer"):
            handler = signal.signal(signal.SIGALRM, self._alarm)
            self._outer = (handler, signal.getitimer(signal.ITIMER_REAL), self._start)
            self.how, self.active = "signal", True
            signal.setitimer(signal.ITIMER_REAL, self.seconds, 0.5)
        elif sys.gettrace() is None:
            self.how, self.active, self._tracing = "trace", True, True
            sys.settrace(self._trace)
        return self

    def __exit__(self, *exc) -> None:
        self.disarm()

    def disarm(self) -> None:
        """Stop the timer or the tracing and put back what was there before (safe to call twice)."""
        self.active = False
        if self.how == "signal" and self._outer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            handler, (remaining, interval), start = self._outer
            self._outer = ()
            signal.signal(signal.SIGALRM, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
            if remaining > 0:  # an outer timer was running: give it the time it had left
                left = remaining - (time.monotonic() - start)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), interval)
        elif self._tracing:
            self._tracing = False
            sys.settrace(None)
