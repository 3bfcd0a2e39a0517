"""Runner helpers that need no process."""

from __future__ import annotations

from edgeplex.agent.runners.sessions import scrub


def test_scrub_keeps_only_what_lies_below_the_repository_and_staging_roots():
    message = (
        "Load model from /srv/models/repo/resnet/3/model.onnx failed; also read "
        "/dev/shm/edgeplex-staged-x1/resnet/3/weights.bin"
    )
    clean = scrub(
        message, "/srv/models/repo/resnet/3/model.onnx", "/dev/shm/edgeplex-staged-x1/resnet/3"
    )
    assert "/srv" not in clean and "/dev/shm" not in clean
    assert "resnet/3/model.onnx" in clean and "resnet/3/weights.bin" in clean
    assert scrub("nothing to hide", "/a/b/c/model.onnx", "/d/e/f") == "nothing to hide"
