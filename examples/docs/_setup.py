"""Shared by the documentation scripts: makes ``examples/`` importable and provides what the
documents leave to the reader: ``DEVICE`` (the machine's device, for the documents' ``device="cuda"``
and ``device="cpu"``: CUDA when a GPU is present, else the CPU through the Triton interpreter) and
``LOCAL_REPO`` (for ``"/path/to/local/repo"``).

Each script holds one code block of a document in ``docs/seeds/`` as written, with only the
substitutions listed in ``tests/docs/test_seeds.py`` (which checks the blocks against the documents
and runs every script). Hub ids need the offline cache:

    python examples/make_offline_hub_cache.py /tmp/twinkle-hf
    HF_HOME=/tmp/twinkle-hf HF_HUB_OFFLINE=1 python examples/docs/user_scenarios_1.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import DEVICE, EXAMPLES, LOCAL_REPO  # noqa: E402  (sets TRITON_INTERPRET on the CPU, logging)

__all__ = ["DEVICE", "EXAMPLES", "LOCAL_REPO"]
