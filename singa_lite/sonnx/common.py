"""What export and import share: the opset versions, the element types and SINGA's node / attribute views.

Element types. singa_lite tensors hold float16 / float32 / float64 / bfloat16, int32 / int64 and bool, so
an ONNX tensor of one of those keeps its type in both directions (SINGA narrows everything to float32 and
int32). Other integer types are held in int32 / int64 on import, as ``tensor.from_numpy`` does. The narrow
types onnx reads as ml_dtypes arrays (float8 in its five forms, float4, int4 / uint4, int2 / uint2) are held
in float32 / int32, which hold every value of theirs exactly; a Cast to one of them rounds onto that type's
values (``narrow_cast``), so a held value is always one the narrow type has, and the graph's outputs are
converted back to their declared types. Complex numbers are refused by name; strings are host values
(numpy object arrays) that only ``Equal`` and ``Identity`` read.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from .. import tensor

__all__ = ["EXPORT_OPSET", "MIN_IMPORT_OPSET", "MAX_IMPORT_OPSET", "OnnxAttributes", "OnnxNode",
           "SonnxError", "elem_type_of", "host_array", "is_narrow", "narrow_cast", "np_dtype_of",
           "onnx_type_to_singa_type"]

# The opset to_onnx writes: 13 is the first with single-axis Softmax and the axes of Squeeze / Unsqueeze /
# ReduceSum as inputs, and every onnxruntime release since 1.7 runs it.
EXPORT_OPSET = 13
# What the importer reads: the attribute-versus-input forms of every opset up to 21 are handled per operator
# (Softmax's axis, the axes of Squeeze / Unsqueeze / Reduce*, Split, Pad, Clip, Slice); opsets before 7 add
# only the legacy "broadcast" attribute, which numpy broadcasting makes moot.
MIN_IMPORT_OPSET = 1
MAX_IMPORT_OPSET = 21


class SonnxError(ValueError):
    """A model or graph that sonnx cannot convert: the message names the node, what it expected and how to
    get there."""


_NP_OF_SINGA = {tensor.float16: np.float16, tensor.float32: np.float32, tensor.float64: np.float64,
                tensor.bfloat16: np.float32, tensor.int32: np.int32, tensor.int64: np.int64, tensor.bool_: np.bool_}
_STORED = {np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_)}


def np_dtype_of(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX element type (``TensorProto.FLOAT`` -> float32)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        raise SonnxError(f"unknown ONNX element type {elem_type!r}") from None


def elem_type_of(dtype) -> int:
    """The ONNX element type of a singa_lite dtype or a numpy dtype (bfloat16 as BFLOAT16)."""
    if dtype == tensor.bfloat16:
        return TensorProto.BFLOAT16
    if not isinstance(dtype, np.dtype):
        dtype = np.dtype(_NP_OF_SINGA.get(dtype, dtype))
    return helper.np_dtype_to_tensor_dtype(dtype)


def is_narrow(dt) -> bool:
    """Whether numpy dtype `dt` is one of ml_dtypes' types (onnx's numpy form of bfloat16, float8, float4, int4,
    int2 ...), which singa_lite holds in a wider dtype."""
    return np.dtype(dt).type.__module__ == "ml_dtypes"


def _holder(dt: np.dtype) -> np.dtype | None:
    """The dtype singa_lite keeps numpy dtype `dt` in, or None."""
    if dt in _STORED:
        return dt
    if is_narrow(dt):  # every value of these types is exact in float32 / int32
        import ml_dtypes

        try:
            ml_dtypes.iinfo(dt)
            return np.dtype(np.int32)
        except ValueError:
            return np.dtype(np.float32)
    if dt.kind in "iu":
        return np.dtype(np.int64 if dt.itemsize >= 4 else np.int32)
    return None


_NARROW_TYPES = {getattr(TensorProto, n) for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
                                                   "FLOAT4E2M1", "FLOAT8E8M0", "INT4", "UINT4", "INT2", "UINT2")
                 if hasattr(TensorProto, n)}


def onnx_type_to_singa_type(onnx_type: int):
    """SINGA's helper: the numpy dtype singa_lite keeps a tensor of ONNX type `onnx_type` in, or None when it
    has no such tensors (strings, complex numbers; the narrow types with an onnx that gives them no ml_dtypes
    form, whose arrays would be their raw bytes)."""
    dt = np_dtype_of(onnx_type)
    if onnx_type in _NARROW_TYPES and not is_narrow(dt):
        return None
    return _holder(dt)


def host_array(value: np.ndarray, what: str) -> np.ndarray:
    """value in a dtype singa_lite stores (see onnx_type_to_singa_type); a clear error otherwise."""
    value = np.asarray(value)
    held = _holder(value.dtype)
    if held is None:
        raise SonnxError(f"{what}: numpy dtype {value.dtype} has no singa_lite tensor type (float16/32/64, "
                         f"bfloat16, int32/64, bool, or a narrower type held in one of them); convert it first")
    return value if held == value.dtype else value.astype(held)


_FLOAT8 = {getattr(TensorProto, n) for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")
           if hasattr(TensorProto, n)}


def narrow_cast(values: np.ndarray, elem_type: int, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """ONNX's Cast of `values` to `elem_type`, returned in the dtype singa_lite holds that type in: for the
    narrow types (float8, float4, int4, ...) the values become the narrow type's (numpy's / ml_dtypes' rounding,
    with ONNX's `saturate` for float8, clamping to the largest finite value, and `round_mode` for
    FLOAT8E8M0)."""
    dt = np_dtype_of(elem_type)
    held = onnx_type_to_singa_type(elem_type)
    if held is None:
        raise SonnxError(f"singa_lite has no tensor type for ONNX element type {TensorProto.DataType.Name(elem_type)}")
    values = np.asarray(values)
    if elem_type in _FLOAT8 and saturate:
        import ml_dtypes

        info = ml_dtypes.finfo(dt)  # NaN stays NaN; +-inf and overflow become +-max
        out = np.clip(values, info.min, info.max).astype(dt)
    elif elem_type == getattr(TensorProto, "FLOAT8E8M0", None):
        from onnx import numpy_helper

        out = numpy_helper.to_float8e8m0(values.astype(np.float32), saturate, round_mode).astype(dt)
    else:
        out = values.astype(dt)
    return out.astype(held)


class OnnxAttributes(dict):
    """A node's attributes as a plain dict of Python values (``helper.get_attribute_value``), strings
    decoded."""

    @staticmethod
    def from_onnx(args) -> OnnxAttributes:
        d = OnnxAttributes()
        for arg in args:
            v = helper.get_attribute_value(arg)
            d[arg.name] = v.decode("utf-8") if isinstance(v, bytes) else v
        return d


class OnnxNode:
    """An ONNX NodeProto in the form the importer works with (SINGA's class): ``name`` (dots replaced by
    underscores, so it can be an attribute name), ``op_type``, ``attrs``, ``inputs`` / ``outputs`` (value
    names; an empty string is an absent optional input)."""

    def __init__(self, node):
        self.name = str(node.name).replace(".", "_").replace("/", "_")
        self.op_type = str(node.op_type)
        self.domain = str(node.domain)
        self.attrs = OnnxAttributes.from_onnx(node.attribute)
        self.inputs = list(node.input)
        self.outputs = list(node.output)

    def getattr(self, key, default=None):
        return self.attrs.get(key, default)

    def __repr__(self):
        return f"OnnxNode({self.op_type} {self.name!r}: {self.inputs} -> {self.outputs})"
