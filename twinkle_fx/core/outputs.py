"""Where a command writes its results, checked before it runs: a benchmark of minutes must not end in a
traceback because ``--out`` names a directory, a folder that does not exist, or a place no file can be made.

Every command of the package and of ``tools/`` that writes a file or a folder it is given checks it here,
so they all refuse alike (``tests/cli/test_outputs.py``): :func:`check_output_path` where the command
checks its arguments itself, :func:`output_file` and :func:`output_dir` as argparse types. Importing this
module imports nothing heavy: the command line calls it before torch.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

__all__ = ["check_output_path", "output_file", "output_dir"]


def check_output_path(option: str, path: str | os.PathLike | None, *, directory: bool = False,
                      parents: bool = False, file_name: str | None = None) -> None:
    """Refuse, before a run, a path the run could not write at its end. Nothing is left behind: whether a
    folder takes new files is tried with a temporary file (or folder), removed at once.

    Args:
        option: the option that named ``path`` (``"--out"``), for the message.
        path: the file to write, or with ``directory`` the folder to write into; None passes.
        directory: ``path`` is a folder, created with its parents when missing (an existing one is fine).
        parents: ``path`` is a file whose missing parent folders the command creates.
        file_name: when ``path`` is a folder but a file is wanted, the name to suggest inside it.

    Raises:
        ValueError: one line: ``option``, ``path``, what is wrong and what to give instead.

    Examples:
        >>> check_output_path("--out", "results", directory=True)   # a folder the run will create
        >>> check_output_path("--out", ".", file_name="check.json")
        Traceback (most recent call last):
        ...
        ValueError: --out .: is a directory; give the file to write (e.g. check.json)
    """
    if path is None:
        return
    problem = _problem(os.fspath(path), directory=directory, parents=parents, file_name=file_name)
    if problem is not None:
        raise ValueError(f"{option} {os.fspath(path)}: {problem}")


def output_file(text: str) -> Path:
    """argparse type: a file to write whose folder exists and takes new files."""
    return _argument(text, directory=False)


def output_dir(text: str) -> Path:
    """argparse type: a folder to write into, existing or to be created."""
    return _argument(text, directory=True)


def _argument(text: str, *, directory: bool) -> Path:
    problem = _problem(text, directory=directory, parents=False, file_name=None)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return Path(text)


def _problem(said: str, *, directory: bool, parents: bool, file_name: str | None) -> str | None:
    """What stops a file (``directory``: a folder) from being written at ``said``, or None."""
    path = Path(said)
    try:
        if directory:
            if path.exists() and not path.is_dir():
                return "is a file, and the results go into a directory; give a directory (existing or new)"
            _can_create_in(path if path.exists() else _existing_ancestor(path), folder=True)
            return None
        if path.is_dir() or said.endswith(("/", os.sep)):
            example = f" (e.g. {path / file_name})" if file_name else ""
            what = "is a directory" if path.is_dir() else "ends in a slash, as a directory does"
            return f"{what}; give the file to write{example}"
        parent = path.parent
        if not parent.exists():
            if not parents:
                return f"the folder {parent} does not exist; create it first, or give a file in an existing folder"
            _can_create_in(_existing_ancestor(parent), folder=True)  # the command creates the missing folders
            return None
        if not parent.is_dir():
            return f"{parent} is a file, not a folder; give a path in a folder"
        if path.exists():
            try:
                with open(path, "a"):  # opened to append and closed unwritten: the file is as it was
                    pass
            except OSError as e:
                return f"cannot write it ({e.strerror}); give another file"
            return None
        _can_create_in(parent, folder=False)
    except _Refused as refused:
        return str(refused)
    return None


class _Refused(Exception):
    """Why a folder on the way cannot take what the command writes."""


def _existing_ancestor(path: Path) -> Path:
    """The nearest folder above ``path`` that exists: where the missing ones would be created."""
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise _Refused(f"{parent} is a file, so no folder can be made in it; give another path")
            return parent
    return Path(path.absolute().anchor)


def _can_create_in(place: Path, *, folder: bool) -> None:
    """Whether a file (``folder``: a folder) can be made in the existing folder ``place``: tried, since the
    permission bits do not tell (root passes them all, and /proc takes no file whatever they say)."""
    try:
        if folder:
            os.rmdir(tempfile.mkdtemp(prefix=".twinkle-fx-probe-", dir=place))
        else:
            with tempfile.TemporaryFile(prefix=".twinkle-fx-probe-", dir=place):
                pass
    except OSError as e:
        raise _Refused(f"cannot create {'folders' if folder else 'files'} in {place} ({e.strerror}); give a path "
                       "you can write") from None
