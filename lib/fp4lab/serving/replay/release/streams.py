"""Inside one SGLang environment: the streams and events of a simulated capture, held to CUDA's
stream-capture rules, so that what a real capture refuses across streams is flagged.

A capture begins on its origin stream; another stream joins it by waiting on work the capture
holds (``wait_stream``, or ``wait_event`` on an event recorded inside it), and every joined
stream's work must be waited on by the origin before the capture ends. So, inside an open
capture:

* a joined stream whose last work the origin never waited on: ``cudaStreamEndCapture`` fails
  (cudaErrorStreamCaptureUnjoined);
* a capturing stream waiting on an event recorded outside this capture, in another segment or
  eagerly: cudaErrorStreamCaptureIsolation;
* work issued on a stream that is not capturing: it runs once, now, and is in no replay.

``Streams.capturing`` answers what cuda-python's ``cudaStreamGetCaptureInfo`` would: whether a
stream is the origin of the open capture or joined it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from fp4lab.compile import target


class Event:
    """``torch.cuda.Event`` of a simulated capture: recording and waiting go to ``Streams``."""

    streams: Streams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        self.streams.record(self, stream or torch.cpu.current_stream())

    def wait(self, stream: Any = None) -> None:
        self.streams.wait(stream or torch.cpu.current_stream(), self)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.streams.host_sync("Event.synchronize")


class Streams:
    """The open capture's origin, the streams joined to it and their work; ``flag`` is called
    with what a real capture refuses, ``where`` names the release's line that forked a stream."""

    def __init__(self, flag: Callable[[str], None], where: Callable[[], str]) -> None:
        self.flag, self.where = flag, where
        self.seen = {"forks": 0, "joins": 0, "side_work": 0}  # over every capture
        self.forked_at: dict[int, str] = {}
        self.capture = 0  # the open capture's number; 0: none is open
        self.opened = 0
        self.origin: int | None = None
        self.work: dict[int, int] = {}  # work issued on each capturing stream in this capture
        self.joined: dict[int, int] = {}  # each side stream's work the origin has waited on
        self.events = WeakIdKeyDictionary()  # event -> (capture, stream, its work then)

    def begin(self) -> None:
        self.opened += 1
        self.capture, self.origin = self.opened, id(torch.cpu.current_stream())
        self.work, self.joined = {self.origin: 0}, {}

    def end(self) -> None:
        unjoined = [
            s for s, n in self.work.items() if s != self.origin and n > self.joined.get(s, 0)
        ]
        if unjoined:
            forks = ", ".join(sorted({self.forked_at[s] for s in unjoined}))
            self.flag(f"a side stream forked into the capture at {forks} never joined back "
                      "(cudaErrorStreamCaptureUnjoined at capture end)")  # fmt: skip
        self.capture, self.origin, self.work = 0, None, {}

    def capturing(self, stream: Any) -> bool:
        return self.capture != 0 and id(stream) in self.work

    def issued(self) -> None:
        """An operator dispatched inside the open capture, on the current stream."""
        current = id(torch.cpu.current_stream())
        if current in self.work:
            self.work[current] += 1
            self.seen["side_work"] += current != self.origin
        else:
            self.flag("work on a stream outside the capture (it runs once, at capture, and is in "
                      "no replay)")  # fmt: skip

    def record(self, event: Any, stream: Any) -> None:
        held = self.capturing(stream)
        self.events[event] = (self.capture if held else 0, id(stream),
                              self.work[id(stream)] if held else 0)  # fmt: skip

    def wait(self, waiter: Any, event: Any) -> None:
        """``waiter`` waits on ``event``: a join, a fork, or a dependency a capture refuses."""
        if self.capture == 0 or event not in self.events:  # no capture, or nothing recorded
            return
        capture, stream, work = self.events[event]
        if capture != self.capture:
            if self.capturing(waiter):
                self.flag("a capturing stream waits on an event recorded outside this capture "
                          "(cudaErrorStreamCaptureIsolation)")  # fmt: skip
            return
        if id(waiter) not in self.work:  # a fork: the waiter joins the capture
            self.work[id(waiter)], self.forked_at[id(waiter)] = 0, self.where()
            self.seen["forks"] += 1
        elif id(waiter) == self.origin and stream != self.origin:
            self.joined[stream] = max(self.joined.get(stream, 0), work)
            self.seen["joins"] += 1

    def wait_stream(self, waiter: Any, other: Any) -> None:
        event = Event()
        self.record(event, other)
        self.wait(waiter, event)

    def host_sync(self, name: str) -> None:
        if self.capture:
            self.flag(f"host sync {name}")

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """``torch.cuda.Event`` and the CPU streams that stand for CUDA streams (``torch.cpu.Stream``
        and its subclasses) going through this record."""
        streams = self

        def record_event(stream: Any, event: Any = None) -> Any:
            event = event or Event()
            event.record(stream)
            return event

        methods = {
            "wait_stream": lambda stream, other: streams.wait_stream(stream, other),
            "wait_event": lambda stream, event: streams.wait(stream, event),
            "record_event": record_event,
            "synchronize": lambda stream: streams.host_sync("Stream.synchronize"),
        }
        with contextlib.ExitStack() as stack:
            stack.enter_context(target.attribute_replaced(Event, "streams", self))
            stack.enter_context(target.attribute_replaced(torch.cuda, "Event", Event))
            for name, method in methods.items():
                stack.enter_context(target.attribute_replaced(torch.cpu.Stream, name, method))
            yield
