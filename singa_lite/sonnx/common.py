"""What export and import share: the opset versions, the element types and SINGA's node / attribute views.

Element types. singa_lite tensors hold float16 / float32 / float64 / bfloat16, int32 / int64 and bool, so
an ONNX tensor of one of those keeps its type in both directions (SINGA narrows everything to float32 and
int32). Other integer types become int32 / int64 on import, as ``tensor.from_numpy`` does; strings and
complex numbers are refused by name.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from .. import tensor

__all__ = ["EXPORT_OPSET", "MIN_IMPORT_OPSET", "MAX_IMPORT_OPSET", "OnnxAttributes", "OnnxNode",
           "SonnxError", "elem_type_of", "np_dtype_of", "onnx_type_to_singa_type"]

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


def onnx_type_to_singa_type(onnx_type: int):
    """SINGA's helper: the numpy dtype singa_lite keeps a tensor of ONNX type `onnx_type` in, or None when it
    has no such tensors (strings, complex numbers, 8-bit floats)."""
    dt = np_dtype_of(onnx_type)
    if dt in _STORED:
        return dt
    if dt.kind in "iu":
        return np.dtype(np.int64 if dt.itemsize >= 4 else np.int32)
    return None


def host_array(value: np.ndarray, what: str) -> np.ndarray:
    """value in a dtype singa_lite stores (see onnx_type_to_singa_type); a clear error otherwise."""
    value = np.asarray(value)
    if value.dtype in _STORED:
        return value
    if value.dtype.name == "bfloat16":  # ml_dtypes' type (onnx's numpy_helper): the value is exact in float32
        return value.astype(np.float32)
    if value.dtype.kind in "iu":
        return value.astype(np.int64 if value.dtype.itemsize >= 4 else np.int32)
    raise SonnxError(f"{what}: numpy dtype {value.dtype} has no singa_lite tensor type (float16/32/64, "
                     f"int32/64, bool); convert it first")


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
