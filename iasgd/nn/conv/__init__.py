"""The techniques the conv layer kind (iasgd.nn.layers.conv) runs its passes
with: `direct` (3x3 and 5x5 kernels, hand-unrolled), `gemm` (im2col + BLAS,
any odd k) and `vector` (explicit 16-lane vectors, iasgd.nn.simd). Which
one runs which pass of which conv is the conv kind's choice (its PATH bits);
the measurements behind it are in bench/results/conv-paths.md."""
