"""The parts of SINGA's ``Tensor`` API that exist for compatibility with SINGA scripts and tests.

:class:`SingaTensorMethods` is a base class of :class:`singa_lite.tensor.Tensor`; its methods are SINGA's
names and behaviour (see each docstring), kept apart from ``core.py`` so that the core class stays short.
They only use the tensor's own methods and the C++ core, so this module imports nothing of the package.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import _core


class SingaTensorMethods:
    """SINGA's Tensor methods that singa_lite's own code does not need (mixed into ``Tensor``)."""

    # ----- what it is
    def is_transpose(self) -> bool:
        """True when the elements are not laid out in row-major order of the shape (e.g. a transposed
        view), as SINGA's ``Tensor.transpose()`` flag. Axes of size 1 do not count: their stride is never
        used to address an element."""
        strides = [s for s, n in zip(self.data.strides, self.data.shape) if n != 1]
        return any(later > earlier for earlier, later in zip(strides, strides[1:]))

    def is_empty(self) -> bool:
        """True for a tensor with no shape (``Tensor()``, 0 dimensions), as SINGA defines it."""
        return self.data.ndim == 0

    def is_dummy(self) -> bool:
        """True for a tensor created without a name (SINGA names those ``Dummy#N``)."""
        return self.name is None

    # ----- copies
    def copy(self):
        """A shallow copy: a new tensor over the same memory (SINGA's C++ copy constructor), so in-place
        changes to either are seen by both. Use :meth:`clone` / ``deepcopy`` for an independent copy."""
        # An identity permutation is a view with this tensor's own strides, for any layout.
        return self._derive(self.data.transpose(list(range(self.data.ndim))))

    def copy_from(self, t, offset: int = 0) -> None:
        """Copies values from a Tensor (:meth:`copy_data`) or a numpy array (:meth:`copy_from_numpy`,
        starting at element `offset` of this tensor)."""
        if isinstance(t, SingaTensorMethods):
            if offset:
                raise ValueError("copy_from: an offset is supported for numpy sources only; "
                                 "use tensor.copy_data_to_from(dst, src, size, dst_offset) for tensors")
            self.copy_data(t)
        elif isinstance(t, np.ndarray):
            self.copy_from_numpy(t, offset)
        else:
            raise ValueError(f"copy_from: expected a Tensor or a numpy array, got {type(t).__name__}")

    # ----- SINGA's deprecated in-place row / column updates (broadcasting does the same)
    def _vector_as(self, v, axis: int, what: str):
        if self.data.ndim != 2:
            raise ValueError(f"{what}: expected a 2-D tensor, got shape {self.shape}")
        n = self.shape[axis]
        if v.size() != n:
            raise ValueError(f"{what}: v has {v.size()} elements, expected {n} (the tensor has shape "
                             f"{self.shape})")
        return v.reshape((n, 1) if axis == 0 else (1, n))

    def add_column(self, v):
        """Adds v (one value per row) to every column, in place."""
        self += self._vector_as(v, 0, "add_column")
        return self

    def add_row(self, v):
        """Adds v (one value per column) to every row, in place."""
        self += self._vector_as(v, 1, "add_row")
        return self

    def mult_column(self, v):
        """Multiplies every column by v (one value per row), element-wise, in place."""
        self *= self._vector_as(v, 0, "mult_column")
        return self

    def mult_row(self, v):
        """Multiplies every row by v (one value per column), element-wise, in place."""
        self *= self._vector_as(v, 1, "mult_row")
        return self

    def div_column(self, v):
        """Divides every column by v (one value per row), element-wise, in place."""
        self /= self._vector_as(v, 0, "div_column")
        return self

    def div_row(self, v):
        """Divides every row by v (one value per column), element-wise, in place."""
        self /= self._vector_as(v, 1, "div_row")
        return self

    # ----- operators SINGA defines beyond ours
    def __floordiv__(self, x):
        """floor(self / x) (SINGA). Integer tensors divided by integers already round down."""
        q = self / x
        return q if q is NotImplemented or not q.dtype.is_floating else q._derive(_core.floor(q.data))

    def __rfloordiv__(self, x):
        q = self.__rtruediv__(x)
        return q if q is NotImplemented or not q.dtype.is_floating else q._derive(_core.floor(q.data))

    def __round__(self, ndigits=None):
        """``round(t)`` / ``round(t, n)``: a new tensor rounded element-wise, half to even, as numpy arrays
        (SINGA tensors have no ``__round__``; tests call ``round`` on values they expect to be numbers)."""
        if not self.dtype.is_floating:
            if ndigits is None or ndigits >= 0:
                return self._derive(self.data.clone())
            scale = 10.0 ** -ndigits  # round(1234, -2) == 1200: go through float64 and back
            f = self.data.cast(_core.DType.float64)
            return self._derive(_core.mul_scalar(_core.round(_core.div_scalar(f, scale)), scale).cast(self.dtype))
        if ndigits is None or ndigits == 0:
            return self._derive(_core.round(self.data))
        if not isinstance(ndigits, numbers.Integral):
            raise TypeError(f"round: ndigits must be an int, got {type(ndigits).__name__}")
        scale = 10.0 ** ndigits
        return self._derive(_core.div_scalar(_core.round(_core.mul_scalar(self.data, scale)), scale))

    # Python 2 names SINGA still defines.
    def __div__(self, x):
        return self.__truediv__(x)

    def __rdiv__(self, x):
        return self.__rtruediv__(x)
