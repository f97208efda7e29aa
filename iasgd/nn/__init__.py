"""The networks: `kernels` (compiled forward and backward passes, pure
functions on preallocated arrays) and `models` (layers, the flat parameter
layout, the kernels' plan table, initialisation, the Model API and presets)."""
