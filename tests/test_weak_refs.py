"""``weak_ref_tensor``'s stand-in and the count after a capture (``release/weak_refs``): a view
whose tensor the release dropped is memory it let go, one whose tensor it keeps is not; the
recorder's own references do not count; a view of the last bucket captured is at no risk."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fp4lab.serving.replay.release import weak_refs


def _captured(bucket: int, watched: weak_refs.Watched, kept: list) -> tuple[list, SimpleNamespace]:
    """One bucket's capture as a release does it: two intermediates made, each taken by weak
    reference; the release keeps the second (``kept``), the recorder holds both."""
    dropped, held = torch.ones(4) * bucket, torch.zeros(4)
    kept.append(held)
    return [weak_refs.weak_ref(dropped), weak_refs.weak_ref(held)], SimpleNamespace(
        ops=[SimpleNamespace(args=(dropped, held), kwargs={}, outputs=[dropped])]
    )


def test_a_view_the_release_alone_holds_is_released_and_one_it_keeps_is_not():
    bucket = {"now": 0}
    watched, kept = weak_refs.Watched(lambda: bucket["now"]), []
    views, recorded = [], []
    with watched.active():
        for size in (16, 4):
            bucket["now"] = size
            taken, graph = _captured(size, watched, kept)
            views += taken
            recorded.append(graph)
    plain = torch.ones(1)
    assert weak_refs.weak_ref(plain) is plain, "outside a watched capture: the tensor itself"
    assert [h.bucket for h in watched.held] == [16, 16, 4, 4]
    assert views[0].data_ptr() != views[2].data_ptr() and views[0][0] == 16  # each its storage
    found = weak_refs.released(watched, recorded, [16, 4])
    assert all(not graph.ops for graph in recorded), "the recorder lets go of its tensors"
    assert (found["held"], found["released"], found["at_risk"]) == (4, 2, 1), found
    [(frame, counts)] = found["frames"].items()
    assert counts == {"held": 4, "released": 2, "at_risk": 1}
    assert frame.startswith("test_weak_refs.py:") and frame.endswith(":_captured"), frame
    assert found["upstream"] == "sglang#37606" and found["capture_order"] == [16, 4]
    kept.clear()  # the release lets go of the rest too: every view is released
    again = weak_refs.released(watched, [], [16, 4])
    assert (again["released"], again["at_risk"]) == (4, 2), again


def test_a_release_that_keeps_cpu_tensors_is_asked_with_a_gpu_tensors_device():
    """0.5.20's rule (its ``_weak_ref_if_tensor``: an empty or CPU tensor is kept as it is) asked
    through ``seen_on_gpu``: a tensor standing for a GPU one is weak-referenced, a host tensor and
    an empty one are kept, as on a GPU."""

    def releases_rule(x):  # the shape of 0.5.20's check, to drive the wrapper
        if x.numel() == 0 or x.device.type == "cpu":
            return x
        return weak_refs.weak_ref(x)

    on_gpu, host, empty = torch.ones(2), torch.ones(2), torch.ones(0)
    asked = weak_refs.seen_on_gpu(releases_rule, lambda t: t is on_gpu or t is empty)
    watched = weak_refs.Watched(lambda: 8)
    with watched.active():
        view = asked(on_gpu)
        assert asked(host) is host and asked(empty) is empty
    assert type(view) is torch.Tensor and view is not on_gpu
    assert view.data_ptr() == on_gpu.data_ptr() and view.device.type == "cpu"
    assert [h.bucket for h in watched.held] == [8]
