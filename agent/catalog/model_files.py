"""Files a model's config names beside its graph (initial states, warm-up data, class
labels): a plain name inside one of the model's folders, read whole under a cap. The
one place where a config's file name becomes a path: nothing outside the folder is
read, through `..`, a separator or a symbolic link."""

from __future__ import annotations

from pathlib import Path


def read_model_file(folder: Path, name: str, cap: int, where: str, place: str) -> bytes:
    """The bytes of the file `name` in `folder` (the model's `place`, as errors name it:
    "initial_state folder"), at most `cap` of them. ValueError starting with `where`
    for a name that is not a plain file name, a file outside the folder or missing,
    one over the cap, or one that cannot be read."""
    path = _inside(folder, name, where, place)
    try:
        with path.open("rb") as file:
            data = file.read(cap + 1)  # never more than the cap, however the file grows
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror}") from None
    if len(data) > cap:
        raise ValueError(f"{where}: more than {cap} bytes")
    return data


def model_file_size(folder: Path, name: str, cap: int, where: str, place: str) -> int:
    """The size of the file `name` in `folder`, checked as read_model_file checks it,
    without reading it (for files read only when they are used)."""
    path = _inside(folder, name, where, place)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror}") from None
    if size > cap:
        raise ValueError(f"{where}: more than {cap} bytes")
    return size


def plain_name(name: str) -> bool:
    """Whether `name` names a file in a folder and nothing else: no separator, no NUL,
    not "", "." or ".."."""
    return name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def _inside(folder: Path, name: str, where: str, place: str) -> Path:
    """`folder / name`, when `name` is a plain file name of a file inside `folder`."""
    if not plain_name(name):
        raise ValueError(f"{where} must name a file in the model's {place}")
    path = folder / name
    try:
        if not path.resolve().is_relative_to(folder.resolve()) or not path.is_file():
            raise ValueError(f"{where}: no such file in the model's {place}")
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror}") from None
    return path
