"""Contenders that take turns on the CPU, so that the machine's drift falls on all of them alike.

On a shared VM a core's speed drifts by tens of percent over seconds to minutes (other guests, frequency
changes). Contenders run one after another each meet a different machine, and a median over a few repeats
does not remove a drift that lasts as long as a run. So the four contenders of one training setting run as
four processes at once that take turns inside the timed window: a contender runs ``turn_steps`` optimizer
steps, pauses, and the next one runs. Only the running contender uses the CPU, and its clocks count only its
own turns (see ``training.StepClock``). Turns last a fraction of a second, so each contender meets the same
machine as the others to within that.

Outside the window the processes run freely: start-up and warm-up steps may overlap (nothing of them is timed),
and after its last timed step a contender waits until every contender has finished its window, so no process
tears down while another is timed.

Protocol, over two pipes per contender (the driver holds one end of each):

- the contender writes ``p`` when it pauses (first at the window's start) and ``e`` after its last timed step,
  then blocks until it reads a byte from its "go" pipe;
- the driver waits until every contender has paused at the start of its window, then gives each in turn one
  "go" and waits for its next ``p`` / ``e``; a contender that wrote ``e`` (or exited: end of file) leaves the
  rotation. When every contender has left, each waiting one gets its last "go".
"""

from __future__ import annotations

import os
import select

PAUSED, ENDED = b"p", b"e"


class Turns:
    """The contender's side: hand the CPU over and wait for the next turn."""

    def __init__(self, go_fd: int, done_fd: int) -> None:
        self.go_fd, self.done_fd = go_fd, done_fd

    def pause(self) -> None:
        """End this turn; returns when the driver gives the next one."""
        self._signal_and_wait(PAUSED)

    def finish(self) -> None:
        """The last timed step is done; returns once every contender has finished its window."""
        self._signal_and_wait(ENDED)

    def _signal_and_wait(self, message: bytes) -> None:
        os.write(self.done_fd, message)
        if not os.read(self.go_fd, 1):
            raise RuntimeError("the benchmark driver closed the turn pipe (it stopped or timed out)")


class Seat:
    """The driver's side of one contender: its "go" pipe to write, its "done" pipe to read."""

    def __init__(self) -> None:
        self.go_read, self.go_write = os.pipe()
        self.done_read, self.done_write = os.pipe()
        self._open = [self.go_read, self.go_write, self.done_read, self.done_write]

    @property
    def worker_fds(self) -> tuple[int, int]:
        """The ends the contender's process inherits (``pass_fds``), as ``(go, done)``."""
        return self.go_read, self.done_write

    def started(self) -> None:
        """Close the driver's copies of the contender's ends, so its exit shows as end of file."""
        self._close(self.go_read, self.done_write)

    def go(self) -> None:
        try:
            os.write(self.go_write, b"g")
        except BrokenPipeError:  # the contender has exited; its next read shows it
            pass

    def receive(self, timeout: float) -> bytes:
        """The contender's next message: ``p``, ``e``, or ``b""`` once it has exited (or timed out)."""
        ready, _, _ = select.select([self.done_read], [], [], timeout)
        if not ready:
            return b""
        return os.read(self.done_read, 1)

    def close(self) -> None:
        """Close every end still open here (the contender's too, if it never started)."""
        self._close(*self._open)

    def _close(self, *fds: int) -> None:
        for fd in fds:
            if fd in self._open:
                self._open.remove(fd)
                os.close(fd)


def take_turns(seats: list[Seat], timeout: float) -> None:
    """Run the contenders' timed windows in turns (the driver's loop; see the module docstring).

    A contender that exits, or sends nothing for ``timeout`` seconds, leaves the rotation; its process's own
    result (or lack of one) reports the failure.
    """
    waiting: list[Seat] = []
    rotation: list[Seat] = []
    for seat in seats:
        message = seat.receive(timeout)
        if message == PAUSED:
            rotation.append(seat)
        elif message == ENDED:
            waiting.append(seat)
    while rotation:
        for seat in list(rotation):
            seat.go()
            message = seat.receive(timeout)
            if message != PAUSED:
                rotation.remove(seat)
                if message == ENDED:
                    waiting.append(seat)
    for seat in waiting:
        seat.go()
