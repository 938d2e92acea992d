"""One cancellation scheme per visitor: every piece of work a session starts gets a ticket.

A ticket is taken when the work is asked for: before the queue, by a `queue=False` step of the same
click, so a Stop pressed while the work still waits in the queue is not lost. Work ends (the engine
checks between rounds, a sweep between settings, a route search between steps) when

- Stop was pressed after its ticket was taken (`stopped`): Stop ends all of this session's work
  asked for so far: a queued run, a running run, a sweep, a route search; or
- a newer ticket of the same kind was taken (`superseded`): a new Run (or a released slider that
  re-runs) replaces this session's run, a new sweep its sweep.

Another session's Stop or Run never touches it. What follows a run (figures, fidelity) checks
`is_latest` with the run's ticket and is skipped once a newer run was asked for.

An API client calls the queued handler directly, with no ticket step before the queue: its work takes
a ticket when it starts, and a Stop pressed while the client's call still waited in the queue (and that no
running work of the session took up) ends the session's next ticketless work before it starts. A Stop with
nothing of the session queued or running stops nothing, now or later: it is never a switch left on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

KINDS = ("run", "sweep", "bench", "route")


class Session:
    """One visitor's tickets. The lock guards every field."""

    def __init__(self):
        self._lock = threading.Lock()
        self._issued = 0  # tickets handed out, of every kind
        self._stopped_at = 0  # the last ticket issued when Stop was pressed
        self._latest: dict[str, int] = {}  # kind -> its newest ticket
        self._unclaimed_stop = False  # a Stop no running work has seen yet: meant for work still queued

    def ticket(self, kind: str) -> int:
        if kind not in KINDS:
            raise ValueError(f"unknown kind of work {kind!r}")
        with self._lock:
            self._issued += 1
            self._latest[kind] = self._issued
            return self._issued

    def stop(self, queued: bool = True) -> None:
        """Stop everything asked for so far; `queued`: work of this session waits in the queue (or has just
        left it) and may not hold a ticket yet, so the Stop is kept for the next ticketless work."""
        with self._lock:
            self._stopped_at = self._issued
            self._unclaimed_stop = queued

    def claim_stop(self) -> bool:
        """Running work saw the Stop (it was for that work); True if nobody had claimed it yet."""
        with self._lock:
            unclaimed, self._unclaimed_stop = self._unclaimed_stop, False
            return unclaimed

    def job(self, kind: str, ticket: int | None = None) -> "Job":
        """The stop switch of work with `ticket` (a fresh ticket when None: work not asked for through the
        page, e.g. an API call or a test; a Stop counts from now)."""
        with self._lock:
            ok = isinstance(ticket, int) and not isinstance(ticket, bool) and 0 < ticket <= self._issued
        if ok:
            return Job(self, kind, ticket)
        return Job(self, kind, self.ticket(kind), before_start=self.claim_stop())

    def stopped(self, ticket: int) -> bool:
        with self._lock:
            return ticket <= self._stopped_at

    def is_latest(self, kind: str, ticket) -> bool:
        with self._lock:
            return ticket is None or self._latest.get(kind, 0) <= ticket


@dataclass(frozen=True)
class Job:
    """What the engine polls between rounds (`is_set`)."""

    session: Session
    kind: str
    ticket: int
    before_start: bool = False  # ticketless work a Stop reached while it waited in the queue

    @property
    def stopped(self) -> bool:
        if self.before_start:
            return True
        if self.session.stopped(self.ticket):
            self.session.claim_stop()
            return True
        return False

    @property
    def superseded(self) -> bool:
        return not self.session.is_latest(self.kind, self.ticket)

    def is_set(self) -> bool:
        return self.stopped or self.superseded


class Sessions:
    """Every visitor's Session, by Gradio's session hash (one "local" session for direct calls)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_id: dict[str, Session] = {}

    @staticmethod
    def key(request) -> str:
        return getattr(request, "session_hash", None) or "local"

    def get(self, request=None) -> Session:
        with self._lock:
            return self._by_id.setdefault(self.key(request), Session())

    def forget(self, request=None) -> None:
        with self._lock:
            self._by_id.pop(self.key(request), None)

    def __len__(self) -> int:
        return len(self._by_id)


SESSIONS = Sessions()  # the one registry; its lock is its own
