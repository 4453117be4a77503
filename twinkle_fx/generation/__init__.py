"""``generate()`` at the speed of the device: a decode loop that graphs the whole decode step.

:func:`decode` is a ``custom_generate`` callable for transformers' ``generate``;
:func:`use_decode_loop` makes it the model's default. See :mod:`twinkle_fx.generation.loop`.
"""

from .loop import decode, release_decode_state, use_decode_loop

__all__ = ["decode", "release_decode_state", "use_decode_loop"]
