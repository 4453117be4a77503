"""``python -m twinkle_fx``: the ``twinkle-fx`` command (:mod:`twinkle_fx.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
