"""Publish the Hub repos the examples use into an offline Hugging Face cache.

    python examples/make_offline_hub_cache.py /tmp/twinkle-hf
    HF_HOME=/tmp/twinkle-hf HF_HUB_OFFLINE=1 python examples/eager_layers.py

Writes kernels-community/activation (layers.SiluAndMul, silu_and_mul, ...) from kernels/twinkle_triton
and kernels-community/linear (layers.Linear on a Triton matmul) from examples/hub_repos/linear, so
the examples' repo_id= kernels load through the real ``kernels.get_kernel`` without a network.
"""

import sys
from pathlib import Path

from twinkle_fx.integrations.hub import publish_to_hub_cache

ROOT = Path(__file__).resolve().parent.parent
REPOS = {
    "kernels-community/activation": ROOT / "kernels" / "twinkle_triton",
    "kernels-community/linear": ROOT / "examples" / "hub_repos" / "linear",
}


def publish_examples(hf_home: Path) -> dict[str, Path]:
    """Publish every repo of REPOS into ``hf_home``; returns repo id -> snapshot folder."""
    snapshots = {repo_id: publish_to_hub_cache(path, repo_id, hf_home=hf_home) for repo_id, path in REPOS.items()}
    # hf-kernels-layers.md loads kernels-community/activation at revision="layers" (a branch there)
    activation = snapshots["kernels-community/activation"]
    (activation.parent.parent / "refs" / "layers").write_text(activation.name)
    return snapshots


if __name__ == "__main__":
    hf_home = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/twinkle-hf")
    for repo_id, snapshot in publish_examples(hf_home).items():
        print(f"published {REPOS[repo_id]} as {repo_id} at {snapshot}")
    print(f"now run with: HF_HOME={hf_home} HF_HUB_OFFLINE=1")
