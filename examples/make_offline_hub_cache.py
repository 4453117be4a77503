"""Publish the project's own Triton kernels as Hub repos in an offline Hugging Face cache.

    python examples/make_offline_hub_cache.py /tmp/twinkle-hf
    HF_HOME=/tmp/twinkle-hf HF_HUB_OFFLINE=1 python examples/eager_layers.py

Writes kernels-community/activation (layers.SiluAndMul, silu_and_mul, ...) from kernels/twinkle_triton,
so the examples' repo_id= kernels load through the real ``kernels.get_kernel`` without a network.
"""

import sys
from pathlib import Path

from twinkle_fx.hub import publish_to_hub_cache

KERNELS = Path(__file__).resolve().parent.parent / "kernels" / "twinkle_triton"

if __name__ == "__main__":
    hf_home = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/twinkle-hf")
    snapshot = publish_to_hub_cache(KERNELS, "kernels-community/activation", hf_home=hf_home)
    print(f"published {KERNELS} as kernels-community/activation at {snapshot}")
    print(f"now run with: HF_HOME={hf_home} HF_HUB_OFFLINE=1")
