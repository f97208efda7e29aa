"""iasgd: fast parallel SGD on the cores of one machine (Interval-Asynchrony
and its baselines), with numba-compiled kernels.

The numba settings (jit flags, on-disk cache directory) are in iasgd.compiled."""
