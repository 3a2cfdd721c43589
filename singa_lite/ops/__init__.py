"""The differentiable operators and their function forms, in one namespace without the layers: what layer.py
and other library code build on (``from . import ops as F``; ``F.conv2d``, ``F.relu``). Users find the same
names in ``autograd``, which adds the engine's entry points and the layer classes.

Where an operator goes: by what it computes, one module per kind.

- ``elementwise.py``: arithmetic (numpy broadcasting), exp / log / powers, trigonometry, rounding, clip and cast,
  comparisons and logic, and the element-wise sum / mean / max / min of several tensors, ``where``;
- ``activation.py``: activation functions (the ReLU family, sigmoid, tanh, GELU, ...) and softmax;
- ``reduce.py``: reductions over axes of one tensor (``reduce_sum``, ``reduce_mean``);
- ``shapes.py``: shapes and indexing (reshape, transpose, squeeze, concat, split, slice, pad, gather, onehot,
  ...): operators that move or pick values without computing new ones (not ``shape.py``: ``ops.shape`` is
  SINGA's shape operator);
- ``linalg.py``: matrix products (matmul, gemm), add_bias, cossim;
- ``transformer.py``: layer normalisation and scaled dot-product attention (multi-head, masks, dropout), each one
  operator with its own backward;
- ``nn.py``: the layers' operators with their own algorithms or state: convolution, pooling, batch
  normalisation, dropout, embedding;
- ``loss.py``: losses (a tensor of shape (1,), as SINGA's);
- ``common.py``: helpers they share on raw tensors (``reduce_to``, ``norm_axis``, ``raw_softmax``,
  ``operand``, the :class:`common.Unary` base) and SINGA's public helpers ``axis_helper``, ``back_broadcast``,
  ``ctensor2numpy``.

How an operator is written (one way for all of them): a subclass of :class:`engine.Operator` whose
``forward(*xs)`` and ``backward(*dys)`` compute on raw ``_core.Tensor``s (see engine.py's contract: which
gradients ``needs_grad`` asks for, ``aliased_grads``, never modifying ``dys`` in place), and its function form
next to it, taking and returning ``tensor.Tensor``s: ``relu = ReLU.apply`` when every argument is an input
tensor, otherwise a function that builds the operator from its parameters and calls it
(``def leakyrelu(x, a=0.01): return LeakyRelu(a)(x)[0]``). An element-wise operator of one input may subclass
:class:`common.Unary` instead and give the two formulas ``f(x)`` and ``grad(dy)``; a module's private bases
(``_Reshaping``, ``_IndexMap``, ``_Constant`` in shapes.py; ``_NoGrad``, ``_Flat`` in elementwise.py) work the
same way for their kind. Add the class and its function to the module's ``__all__``: this package, ``autograd``
and SINGA's names follow from it.

Adding an operator touches the C++ list (csrc/ops/elementwise_ops.h, or its op file csrc/ops/<kind>.cpp) when
it needs a new kernel, its kernels (csrc/cpu/, csrc/cuda/), one Python file here, and its test (a case in
tests/unit/autograd_cases.py: the function, its numpy reference and input shapes; the gradient is checked
against finite differences).
"""
from .activation import *  # noqa: F401,F403
from .common import *  # noqa: F401,F403
from .elementwise import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .nn import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from .shapes import *  # noqa: F401,F403
from .transformer import *  # noqa: F401,F403

from . import activation as _activation, common as _common, elementwise as _elementwise  # noqa: E402
from . import linalg as _linalg, loss as _loss, nn as _nn, reduce as _reduce, shapes as _shapes  # noqa: E402
from . import transformer as _transformer  # noqa: E402

# Everything the modules export, SINGA's underscore names included (_and, _Conv2d, ...).
__all__ = sorted({name for m in (_activation, _common, _elementwise, _linalg, _loss, _nn, _reduce, _shapes,
                                _transformer)
                  for name in m.__all__})
