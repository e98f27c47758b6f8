"""The time limit on one call of a learner's function: `TimeLimit` stops the call once its seconds have passed.

A SIGALRM timer in the main thread (a Jupyter kernel runs cells there), a trace function elsewhere, and only an
after-the-fact `overran` where neither can act (`helpers.course.check` says which in its documentation).
`CaseTimeout` is what the limit raises inside the learner's code.
"""
from __future__ import annotations

import ctypes
import signal
import sys
import threading
import time

GRACE_S = 1.0  # past the limit, the watchdog raises in the thread itself: a learner who silenced SIGALRM is still stopped


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
    Behind the timer or the trace, a watchdog thread raises CaseTimeout in the limited thread itself `GRACE_S`
    after the limit, which code that silences SIGALRM or removes the trace function cannot switch off (a call
    stuck inside one C function still returns first).
    `overran` is True when the block took longer than `seconds`, however it ended.
    """

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.how = "clock"
        self.active = False
        self._start = 0.0
        self._outer: tuple = ()
        self._tracing = False
        self._watchdog: threading.Timer | None = None
        self._lock = threading.Lock()

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
        if self.active:  # a second line of defence that the code under the limit cannot switch off
            self._watchdog = threading.Timer(self.seconds + GRACE_S, self._raise_in, (threading.get_ident(),))
            self._watchdog.daemon = True
            self._watchdog.start()
        return self

    def _raise_in(self, thread_id: int) -> None:
        """The watchdog: CaseTimeout raised in the limited thread at its next bytecode, for a block that is still
        running past the limit and its grace although the alarm was silenced (`signal.signal(SIGALRM, SIG_IGN)`,
        `setitimer(ITIMER_REAL, 0)`) or the trace function removed."""
        with self._lock:
            if self.active:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(CaseTimeout))

    def __exit__(self, *exc) -> None:
        self.disarm()

    def disarm(self) -> None:
        """Stop the timer or the tracing and put back what was there before (safe to call twice)."""
        with self._lock:
            self.active = False
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
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
