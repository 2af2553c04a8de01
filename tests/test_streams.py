"""CUDA's stream-capture rules held across a simulated capture's streams and events
(``serving/replay/release/streams``), each rule seen broken and kept on plain CPU streams."""

from __future__ import annotations

import pytest
import torch

from fp4lab.serving.replay.release.streams import Streams


def _streams() -> tuple[Streams, list[str]]:
    flagged: list[str] = []
    return Streams(flagged.append, lambda: "here.py:1:f"), flagged


def _work(streams: Streams, stream: torch.cpu.Stream) -> None:
    with torch.cpu.stream(stream):
        streams.issued()


@pytest.mark.parametrize("joined_after_work", [True, False])
def test_a_fork_is_joined_only_by_a_wait_on_its_last_work(joined_after_work):
    streams, flagged = _streams()
    side = torch.cpu.Stream()
    with streams.installed():
        streams.begin()
        origin = torch.cpu.current_stream()
        side.wait_stream(origin)
        assert streams.capturing(side) and streams.capturing(origin)
        if not joined_after_work:
            origin.wait_stream(side)
        _work(streams, side)
        if joined_after_work:
            origin.wait_stream(side)
        streams.end()
        assert not streams.capturing(side)
    if joined_after_work:
        assert flagged == [] and streams.seen == {"forks": 1, "joins": 1, "side_work": 1}
    else:
        assert len(flagged) == 1 and "never joined back" in flagged[0], flagged


def test_a_fork_never_joined_is_flagged_at_capture_end_with_where_it_forked():
    streams, flagged = _streams()
    side = torch.cpu.Stream()
    with streams.installed():
        streams.begin()
        side.wait_event(torch.cpu.current_stream().record_event())
        _work(streams, side)
        streams.end()
    assert flagged == ["a side stream forked into the capture at here.py:1:f never joined back "
                       "(cudaErrorStreamCaptureUnjoined at capture end)"]  # fmt: skip


def test_an_event_from_another_capture_and_work_on_a_stream_not_capturing_are_flagged():
    streams, flagged = _streams()
    with streams.installed():
        streams.begin()
        event = torch.cuda.Event()
        event.record()
        streams.end()
        streams.begin()
        torch.cpu.current_stream().wait_event(event)
        _work(streams, torch.cpu.Stream())
        streams.end()
        torch.cpu.current_stream().wait_event(event)  # no capture open: nothing to refuse
    assert flagged == [
        "a capturing stream waits on an event recorded outside this capture "
        "(cudaErrorStreamCaptureIsolation)",
        "work on a stream outside the capture (it runs once, at capture, and is in no replay)",
    ]


def test_a_host_sync_on_a_stream_or_event_is_flagged_only_inside_a_capture():
    streams, flagged = _streams()
    with streams.installed():
        torch.cpu.current_stream().synchronize()
        streams.begin()
        torch.cuda.Event().synchronize()
        torch.cpu.current_stream().synchronize()
        streams.end()
    assert flagged == ["host sync Event.synchronize", "host sync Stream.synchronize"]
