"""The network floor's names as the floors above import them (`from iasgd.nn
import kernels as K`: protocol/workers.py, the executors, bench/kernels.py's
runner, which also runs older trees): the bundles of iasgd.nn.plan and the
passes of iasgd.nn.network. New code imports those two modules; this one
goes once protocol/workers.py (frozen in issue 40) imports them itself."""

from iasgd.nn.network import (  # noqa: F401
    affine_copy,
    all_finite,
    argmax_rows,
    gather_images,
    mean_rows,
    network_forward,
    network_loss_and_grad,
    predict_images,
    sgd_momentum_update,
    softmax_cross_entropy,
    train_steps,
)
from iasgd.nn.plan import Buffers, Images, Net, Steps, Weights, copy_values  # noqa: F401
