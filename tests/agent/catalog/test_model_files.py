"""The files a model's config names (initial states, warm-up data, labels) are read
from inside the model's folder only, and never past their cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeplex.agent.catalog.model_files import read_model_file


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("../secret", "must name a file in the model's warmup folder"),
        ("a/b", "must name a file in the model's warmup folder"),
        ("..", "must name a file in the model's warmup folder"),
        ("", "must name a file in the model's warmup folder"),
        ("link", "no such file in the model's warmup folder"),  # a symbolic link out
        ("missing", "no such file in the model's warmup folder"),
        ("big", "more than 8 bytes"),
    ],
)
def test_only_plain_files_inside_the_folder_under_the_cap(
    tmp_path: Path, name: str, error: str
) -> None:
    folder = tmp_path / "model" / "warmup"
    folder.mkdir(parents=True)
    (tmp_path / "secret").write_bytes(b"key")
    (folder / "link").symlink_to(tmp_path / "secret")
    (folder / "big").write_bytes(bytes(9))
    (folder / "ok").write_bytes(bytes(8))
    assert read_model_file(folder, "ok", 8, "x", "warmup folder") == bytes(8)
    with pytest.raises(ValueError, match=error):
        read_model_file(folder, name, 8, "input_data_file", "warmup folder")
