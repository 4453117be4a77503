"""The Hugging Face neighbours: the ``kernels`` package and the Hub.

- :mod:`.hub` loads ``repo_id=`` kernels and local repos in the Hugging Face layout
  (``kernels.get_kernel``, ``kernels.get_local_kernel``); the only module that calls ``kernels``;
- :mod:`.kernels_mapping` reads the layer mapping of ``kernels.use_kernel_mapping``, so a user's
  mapping serves ``kernelize_model`` and the compile backend alike;
- :mod:`.kernels_api` is the ``kernels`` layer API of the hf-kernels-layers document, over
  twinkle_fx's registry.

Core reaches the first two only through :mod:`twinkle_fx.core.plugins`: importing this package plugs
them in (importing ``twinkle_fx`` does), and each is imported when core first needs it.
"""

from ..core.plugins import plug_hub_loader, plug_layer_mapping

plug_hub_loader(f"{__name__}.hub")
plug_layer_mapping(f"{__name__}.kernels_mapping")
