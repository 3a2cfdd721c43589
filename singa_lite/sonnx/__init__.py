"""SINGA's ONNX module (``singa.sonnx``): export singa_lite models to ONNX, import ONNX models to run and
train them here. Needs the ``onnx`` package: ``pip install singa_lite[onnx]`` (onnx and onnxruntime).

- ``to_onnx(inputs, outputs)``: the recorded autograd graph as an ONNX ModelProto (export.py);
  ``export_model(model, inputs)``: a Layer / Model as it computes in evaluation mode.
- ``prepare(model, device="CPU")`` -> ``SingaRep``; ``rep.run(inputs)``; ``SingaBackend`` is ONNX's backend
  interface (``onnx.backend.test`` runs against it); ``run_node`` runs one node (importer.py).
- ``SONNXModel(onnx_model)``: an imported model as a ``model.Model``, to fine-tune (model.py).
- ``save(model, path)`` / ``load(path)``: onnx's own.

Which operators go each way: ``SingaBackend._rename_operators`` (import) and ``export_ops.EXPORTERS``
(export); docs/onnx.md lists them with the differences from SINGA's module.
"""
try:
    import onnx
except ImportError as e:  # an optional extra: say how to get it
    raise ImportError("singa_lite.sonnx needs the onnx package: pip install 'singa_lite[onnx]' (or pip install "
                      "onnx onnxruntime)") from e

from .common import (EXPORT_OPSET, OnnxAttributes, OnnxNode, SonnxError,  # noqa: F401
                     onnx_type_to_singa_type)
from .export import SingaFrontend, export_model, to_onnx  # noqa: F401
from .importer import SingaBackend, SingaRep, prepare, run_node  # noqa: F401
from .model import SONNXModel  # noqa: F401

save = onnx.save
load = onnx.load

__all__ = ["EXPORT_OPSET", "OnnxAttributes", "OnnxNode", "SONNXModel", "SingaBackend", "SingaFrontend", "SingaRep",
           "SonnxError", "export_model", "load", "onnx_type_to_singa_type", "prepare", "run_node", "save",
           "to_onnx"]
