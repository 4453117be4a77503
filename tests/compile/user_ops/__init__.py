"""A user's package with a function worth a kernel (tests register kernels for it)."""
