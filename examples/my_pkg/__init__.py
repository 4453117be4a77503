"""A user package whose functions the examples replace with kernels."""
