"""The differentiable operators and their function forms, gathered in one namespace without the layers:
what layer.py and other library code build on (``from . import functional as F``; ``F.conv2d``, ``F.relu``).
Users find the same names in ``autograd``, which adds the engine's entry points and the layer classes.
Defined in operators.py (element-wise, linear algebra, reductions, activations), ops_math.py, ops_shape.py,
ops_loss.py (losses) and nn_ops.py (convolution, pooling, batch normalisation).
"""
from .nn_ops import *  # noqa: F401,F403
from .operators import *  # noqa: F401,F403
from .ops_loss import *  # noqa: F401,F403
from .ops_math import *  # noqa: F401,F403
from .ops_shape import *  # noqa: F401,F403

from . import nn_ops as _nn_ops, operators as _operators, ops_loss as _ops_loss  # noqa: E402
from . import ops_math as _ops_math, ops_shape as _ops_shape  # noqa: E402

# Everything the five modules export, SINGA's underscore names included (_and, _Conv2d, ...).
__all__ = sorted({name for m in (_nn_ops, _operators, _ops_loss, _ops_math, _ops_shape) for name in m.__all__})
