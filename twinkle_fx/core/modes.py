"""Kernel modes: what a kernel is used for (training, inference, under torch.compile).

A mode is a :class:`Mode` flag. Users may write it as a string (``"train"``, ``"inference"``,
``"compile"``, ``"train+compile"``), as a :class:`Mode`, or as a Hugging Face ``kernels.Mode``.
``"compile"`` alone means inference under ``torch.compile``.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["Mode", "parse_mode", "mode_fallback_order", "format_mode"]


class Mode(enum.Flag):
    """What a kernel registration is for, or what a swap asks for.

    ``ANY`` marks a registration that serves any mode (the default when none is given); a swap
    never asks for it. ``FALLBACK`` is the same member under Hugging Face ``kernels``' name for it
    (``kernels.Mode.FALLBACK`` converts to it), kept so code written against either name works.

    Examples:
        >>> Mode.FALLBACK is Mode.ANY
        True
        >>> parse_mode("train+compile")
        <Mode.TRAINING|TORCH_COMPILE: 10>
    """

    ANY = enum.auto()
    FALLBACK = ANY  # kernels.Mode's name; see the docstring
    TRAINING = enum.auto()
    INFERENCE = enum.auto()
    TORCH_COMPILE = enum.auto()


_WORDS = {
    "train": Mode.TRAINING,
    "training": Mode.TRAINING,
    "inference": Mode.INFERENCE,
    "infer": Mode.INFERENCE,
    "eval": Mode.INFERENCE,
    "compile": Mode.TORCH_COMPILE,
    "torch_compile": Mode.TORCH_COMPILE,
    "any": Mode.ANY,
    "fallback": Mode.ANY,
}

VALID_MODE_STRINGS = ("train", "inference", "compile", "train+compile", "inference+compile")


def parse_mode(mode: Any, *, allow_fallback: bool = False) -> Mode:
    """Turn a user's mode (string, :class:`Mode` or ``kernels.Mode``) into a validated :class:`Mode`.

    Args:
        mode: ``"train"``, ``"inference"``, ``"compile"``, ``"train+compile"`` (``|`` works too),
            a :class:`Mode`, or a ``kernels.Mode``.
        allow_fallback: accept ``Mode.ANY`` (``"any"``; registrations only).

    Returns:
        The mode, always with exactly one of TRAINING / INFERENCE set (or ANY alone).

    Raises:
        ValueError: unknown words, or a contradictory combination such as ``"train+inference"``.

    Examples:
        >>> parse_mode("compile")
        <Mode.INFERENCE|TORCH_COMPILE: 12>
    """
    if isinstance(mode, Mode):
        flag = mode
    elif isinstance(mode, enum.Flag) and type(mode).__module__.startswith("kernels"):
        flag = Mode(0)
        for member in type(mode):
            if member.name in Mode.__members__ and member.value and (mode & member) == member:
                flag |= Mode[member.name]
    elif isinstance(mode, str):
        flag = Mode(0)
        words = [w.strip().lower() for w in mode.replace("|", "+").split("+")]
        for word in words:
            if word not in _WORDS:
                raise ValueError(
                    f"Unknown kernel mode {mode!r} (word {word!r}); valid modes: "
                    f"{', '.join(repr(m) for m in VALID_MODE_STRINGS)}."
                )
            flag |= _WORDS[word]
    else:
        raise ValueError(
            f"Kernel mode must be a string, twinkle_fx.Mode or kernels.Mode, got {type(mode).__name__} "
            f"{mode!r}; valid modes: {', '.join(repr(m) for m in VALID_MODE_STRINGS)}."
        )
    return _validated(flag, mode, allow_fallback)


def _validated(flag: Mode, original: Any, allow_fallback: bool) -> Mode:
    if flag == Mode.ANY:
        if not allow_fallback:
            raise ValueError(f"Mode {original!r} (ANY, 'any mode') is only valid for registrations, not for a swap.")
        return flag
    if Mode.ANY in flag:
        raise ValueError(f"Mode {original!r}: ANY ('any mode') cannot be combined with other modes.")
    if Mode.TRAINING in flag and Mode.INFERENCE in flag:
        raise ValueError(f"Mode {original!r}: a kernel mode is either training or inference, not both.")
    if flag == Mode.TORCH_COMPILE:
        flag = Mode.INFERENCE | Mode.TORCH_COMPILE
    if not (Mode.TRAINING in flag or Mode.INFERENCE in flag):
        raise ValueError(f"Mode {original!r} is empty; valid modes: {', '.join(VALID_MODE_STRINGS)}.")
    return flag


# Which registrations serve a requested mode, best first (the Hugging Face kernels order): an
# inference request may use a training kernel (it also has a forward), a training request never
# uses an inference-only one, and a compile request only uses registrations made for compile.
_FALLBACK_ORDER = {
    Mode.INFERENCE: (
        Mode.INFERENCE,
        Mode.INFERENCE | Mode.TORCH_COMPILE,
        Mode.TRAINING,
        Mode.TRAINING | Mode.TORCH_COMPILE,
        Mode.ANY,
    ),
    Mode.TRAINING: (Mode.TRAINING, Mode.TRAINING | Mode.TORCH_COMPILE, Mode.ANY),
    Mode.INFERENCE | Mode.TORCH_COMPILE: (
        Mode.INFERENCE | Mode.TORCH_COMPILE,
        Mode.TRAINING | Mode.TORCH_COMPILE,
        Mode.ANY,
    ),
    Mode.TRAINING | Mode.TORCH_COMPILE: (Mode.TRAINING | Mode.TORCH_COMPILE, Mode.ANY),
}


def mode_fallback_order(mode: Mode) -> tuple[Mode, ...]:
    """Registration modes that may serve ``mode``, best first."""
    return _FALLBACK_ORDER[mode]


def format_mode(mode: Mode) -> str:
    """The user-facing spelling: ``"train+compile"``, ``"inference"``, ``"any"``."""
    if mode == Mode.ANY:
        return "any"
    words = ["train" if Mode.TRAINING in mode else "inference"]
    if Mode.TORCH_COMPILE in mode:
        words.append("compile")
    return "+".join(words)
