"""How many threads BLAS may use while the kernels call it.

Some kernel passes call BLAS (numba's three-argument np.dot calls scipy's
OpenBLAS from nopython code). Plain Python, kept out of the compiled modules
so that the executors that import it stay outside the compiled cache's key
(iasgd.compiled).
"""

from __future__ import annotations

from typing import Any


def single_threaded_blas() -> Any:
    """Limit the BLAS libraries to one thread each, for the GEMMs the kernels
    call (numba's np.dot calls scipy's OpenBLAS) from the workers' own
    threads: with its default of one thread per core, every call would start
    a team of OpenBLAS threads and oversubscribe the cores the workers run on.

    A context manager (threadpoolctl's, restoring the previous limits on
    exit; used as a plain call, the limit stays). scipy's BLAS is loaded
    first, so that it is among the libraries limited.
    """
    import scipy.linalg.cython_blas  # noqa: F401 (loads the library np.dot calls)
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1, user_api="blas")
