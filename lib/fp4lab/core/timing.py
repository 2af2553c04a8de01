"""Wall-clock timing of a callable, eager or replayed from a CUDA graph.

Times are medians over ``iters`` calls after ``warmup`` calls; on CUDA every call is
bracketed by synchronisation so the time covers the kernels, not just their launch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    fn: Callable, *args: Any, warmup: int = 3, iters: int = 20, device: torch.device | str = "cpu"
) -> dict:
    """Median, 10th and 90th percentile milliseconds per call of ``fn(*args)``."""
    device = torch.device(device)
    for _ in range(warmup):
        fn(*args)
    sync(device)
    samples = []
    for _ in range(iters):
        started = time.perf_counter()
        fn(*args)
        sync(device)
        samples.append((time.perf_counter() - started) * 1e3)
    return summarize(samples)


def summarize(samples_ms: list[float]) -> dict:
    """Median and spread of a list of millisecond samples."""
    ordered = sorted(samples_ms)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "median_ms": statistics.median(ordered),
        "p10_ms": pick(0.1),
        "p90_ms": pick(0.9),
        "iters": len(ordered),
    }


def device_ms(fn: Callable, *args: Any, warmup: int = 3, iters: int = 20) -> dict:
    """Like ``measure`` for a CUDA kernel's own time: calls enqueued back to back, each bracketed
    by CUDA events, one synchronisation at the end; the host's launch cost shows only where the
    GPU waits for it."""
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return summarize([start.elapsed_time(end) for start, end in events])


def cuda_graph_replay(fn: Callable, *args: Any, warmup: int = 3, iters: int = 20) -> dict:
    """Capture ``fn(*args)`` into one CUDA graph and time its replay. Needs a CUDA device."""
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA graph capture needs a CUDA GPU; none is visible to torch")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*args)
    return measure(graph.replay, warmup=warmup, iters=iters, device="cuda")
