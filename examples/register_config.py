"""One config for layers, bindings and functions: ``register_kernels``.

    python examples/register_config.py
"""

import torch
from _common import DEVICE, LOCAL_REPO, report_close, tiny_qwen2

from twinkle_fx import kernelize_model, register_kernels, undo_kernelize
from my_pkg.fast_ops import fast_add

register_kernels({
    "layers": {
        "MyAwesomeMLP": {"repo_path": str(LOCAL_REPO), "package_name": "my_kernels",
                         "layer_name": "Qwen2MLPTrainingKernel", "device": DEVICE, "mode": "train"},
        "RMSNorm": [
            {"repo_path": str(LOCAL_REPO), "package_name": "my_kernels", "layer_name": "RMSNormKernel",
             "device": DEVICE, "mode": "train"},
            {"repo_path": str(LOCAL_REPO), "package_name": "my_kernels", "layer_name": "RMSNormInferenceOnly",
             "device": DEVICE, "mode": "inference"},
        ],
    },
    # Qwen2RMSNorm is bound explicitly: transformers tags it with kernel_layer_name = "RMSNorm" only
    # when its hub decorators are active (5.18-5.22 with kernels 0.17; 5.23 needs kernels >= 0.18.2)
    "external_layers": {"transformers.models.qwen2.modeling_qwen2.Qwen2MLP": "MyAwesomeMLP",
                        "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm": "RMSNorm"},
    "functions": {"my_pkg.math_ops.add": {"func_impl": fast_add, "device": DEVICE, "mode": "inference"}},
})

model = tiny_qwen2().eval()
input_ids = torch.randint(0, model.config.vocab_size, (2, 16), device=DEVICE)
with torch.no_grad():
    reference = model(input_ids).logits
    kernelize_model(model, mode="inference")   # RMSNormInferenceOnly; inference may also use the MLP training kernel
    report_close("logits", model(input_ids).logits, reference)
undo_kernelize(model)
