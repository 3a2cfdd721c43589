"""Import: an ONNX model run with singa_lite's operators (SINGA's ``SingaBackend`` / ``SingaRep``).

``prepare(model, device="CPU")`` checks the model and returns a :class:`SingaRep`; ``rep.run(inputs)`` runs
the graph node by node through the import table (import_ops.py). Because every node is one of our autograd
operators, the result can be trained: with ``autograd.training = True`` the run records the graph and
``autograd.backward(loss)`` reaches the model's weights.

Weights. Every floating-point initializer that a node reads as a tensor becomes a parameter (a Tensor with
``stores_grad=True``, named after the initializer) the first time it is read, and stays the same Tensor for
later runs, so an optimizer's updates carry over: ``rep.params`` holds them. Initializers read as values (a
Reshape's shape, a Slice's bounds) and integer initializers stay constants. The running statistics of
BatchNormalization are state, not parameters (``rep.aux``), updated in place while training, as our
``BatchNorm2d`` does. ``rep.states`` is SINGA's dict of every initializer as a numpy array, as loaded.

Running part of a graph: ``run(x, last_layers=i)`` runs the nodes up to index i and returns the outputs of
node i (SINGA's transfer-learning idiom: drop the classifier, add your own). A negative i follows SINGA's
arithmetic, index (i + 1) mod n: -2 runs every node, -3 all but the last (SINGA's examples cut ResNet's
classifier this way), -k all but the last k - 2, and -1 only the first. ``aux_output=names`` returns those
intermediate values too.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict, namedtuple

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep

from .. import device as device_mod, tensor
from .common import MAX_IMPORT_OPSET, MIN_IMPORT_OPSET, OnnxNode, SonnxError, host_array, np_dtype_of
from .import_ops import IMPORTERS, SINGA_NAMES, NodeContext
from .import_values import NarrowCast  # noqa: F401 - registers the converters of the values beyond tensors

__all__ = ["SingaBackend", "SingaRep", "prepare", "run_node"]

ValueInfo = namedtuple("ValueInfo", ["name", "dtype", "shape"])
OperatorTuple = namedtuple("OperatorTuple", ["node", "operator"])


def as_singa_device(dev):
    """A singa_lite Device from SINGA's spellings: "CPU", "CUDA" / "CUDA:i", a Device, or None (default)."""
    if dev is None or (isinstance(dev, str) and dev.upper() == "CPU"):
        return device_mod.get_default_device() if dev is None else device_mod.create_cpu_device()
    if isinstance(dev, str):
        upper = dev.upper()
        if upper.startswith("CUDA"):
            if device_mod.get_num_gpus() == 0:
                raise SonnxError(f"device {dev!r}: this machine / build has no CUDA GPU; use 'CPU'")
            return device_mod.create_cuda_gpu_on(int(upper.split(":")[1]) if ":" in upper else 0)
        raise SonnxError(f"device must be 'CPU', 'CUDA', 'CUDA:<id>' or a singa_lite Device, got {dev!r}")
    return device_mod.as_device(dev)


def _value_infos(values, skip) -> list:
    out = []
    for v in values:
        if v.name in skip:
            continue
        tt = v.type.tensor_type
        shape = ([d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
                 if tt.HasField("shape") else None)
        out.append(ValueInfo(v.name, tt.elem_type, shape))
    return out


def _kind(type_proto) -> tuple:
    """(kind, element type) of an ONNX TypeProto: kind "tensor", "sequence" or "optional" (the element type
    is that of the tensors inside), or ("other", 0) for maps and the like."""
    which = type_proto.WhichOneof("value")
    if which == "tensor_type":
        return "tensor", type_proto.tensor_type.elem_type
    if which in ("sequence_type", "optional_type"):
        inner = getattr(type_proto, which).elem_type
        return ("sequence" if which == "sequence_type" else "optional"), _kind(inner)[1]
    return "other", 0


def _types(model) -> dict:
    """value name -> (kind, ONNX element type) for every value whose type the model declares or onnx's shape
    inference finds: the importer holds narrow types (float8, int4, ...) in wider tensors, so what a value
    *is* (CastLike's target, an output's type) is read from here."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - inference is a help only: a model it cannot read still runs
        inferred = model.graph
    types = {}
    for v in list(inferred.value_info) + list(model.graph.input) + list(model.graph.output):
        kind = _kind(v.type)
        if kind[1] or kind[0] != "tensor":
            types[v.name] = kind
    for init in model.graph.initializer:
        types[init.name] = ("tensor", init.data_type)
    for node in model.graph.node:
        if node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), 0)
            types[node.output[0]] = ("tensor", to)
    return types


def _opset_of(model) -> int:
    version = None
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            version = imp.version
        else:
            warnings.warn(f"sonnx: the operator set {imp.domain!r} is not supported; its nodes will fail",
                          stacklevel=3)
    if version is None:
        raise SonnxError("the model imports no default ONNX operator set (opset_import has no '' domain)")
    if version < MIN_IMPORT_OPSET:
        raise SonnxError(f"opset {version} is older than the oldest sonnx reads ({MIN_IMPORT_OPSET}); convert the "
                         f"model with onnx.version_converter.convert_version(model, 13)")
    if version > MAX_IMPORT_OPSET:
        warnings.warn(f"sonnx: opset {version} is newer than the newest checked ({MAX_IMPORT_OPSET}); "
                      f"operators are read in their opset-{MAX_IMPORT_OPSET} form", stacklevel=3)
    return version


class SingaRep(BackendRep):
    """A prepared ONNX graph: ``run(inputs)``. Attributes (SINGA's): ``inputs`` / ``outputs`` (ValueInfo
    name, ONNX elem type, shape), ``states`` (initializers as numpy), ``layers`` (OperatorTuple(node,
    operator) in graph order), ``dev``, ``is_graph`` (True: run returns Tensors, as SINGA's graph mode;
    False: numpy arrays in the outputs' declared types). Ours: ``params``, ``aux``, ``opset``."""

    def __init__(self, model, device=None, opset=None):
        super().__init__()
        graph = model.graph
        self.opset = opset if opset is not None else _opset_of(model)
        self.dev = as_singa_device(device)
        self.states = OrderedDict((init.name, host_array(numpy_helper.to_array(init), f"initializer {init.name}"))
                                  for init in graph.initializer)
        self.inputs = _value_infos(graph.input, self.states)
        self.outputs = _value_infos(graph.output, ())
        self.types = _types(model)  # value name -> (kind, ONNX element type)
        self.layers = []
        for i, proto in enumerate(graph.node):
            node = OnnxNode(proto)
            if not node.name:
                node.name = f"{node.op_type}_{i}"
            if node.domain not in ("", "ai.onnx"):
                raise SonnxError(f"node {node.name!r}: operator {node.domain}.{node.op_type} is outside the "
                                 f"default ONNX domain; sonnx supports: {', '.join(sorted(IMPORTERS))}")
            if node.op_type not in IMPORTERS:
                raise SonnxError(f"node {node.name!r}: ONNX operator {node.op_type} is not supported by sonnx; "
                                 f"supported: {', '.join(sorted(IMPORTERS))}")
            self.layers.append(OperatorTuple(node, IMPORTERS[node.op_type]))
        self.params = OrderedDict()  # initializer name -> trainable Tensor
        self.aux = OrderedDict()  # initializer name -> state Tensor (BatchNormalization's running statistics)
        self._consts = {}
        self.on_new_tensor = None  # called as f(initializer name, Tensor, is_param) when a weight is created
        self.is_graph = False
        self.has_initialized = False

    # ----- values
    def _weight(self, name: str, trainable: bool):
        arr = self.states[name]
        if arr.dtype.kind != "f":
            t = self._consts.get(name)
            if t is None:
                t = self._consts[name] = tensor.from_numpy(arr, self.dev)
            return t
        store = self.params if trainable else self.aux
        t = store.get(name)
        if t is None:
            t = tensor.from_numpy(arr, self.dev)
            t.requires_grad, t.stores_grad, t.name = trainable, trainable, name
            store[name] = t
            if self.on_new_tensor is not None:
                self.on_new_tensor(name, t, trainable)
        return t

    def _fetcher(self, env: dict):
        def fetch(name, as_tensor):
            if name in env:
                v = env[name]
                if as_tensor and not isinstance(v, tensor.Tensor):
                    if v is None or isinstance(v, list):
                        raise SonnxError(f"value {name!r} is {'an empty optional' if v is None else 'a sequence'}"
                                         f", not a tensor; only the sequence operators and Identity read it")
                    v = env[name] = tensor.from_numpy(host_array(v, name), self.dev)
                return v
            if name in self.states:
                if as_tensor == "aux":
                    return self._weight(name, trainable=False)
                if as_tensor:
                    return self._weight(name, trainable=True)
                live = self.params.get(name, self.aux.get(name))
                return tensor.to_numpy(live) if live is not None else self.states[name]
            raise SonnxError(f"no value named {name!r}: not a graph input, an initializer or an earlier node's output")
        return fetch

    def _input_tensors(self, xs) -> dict:
        if isinstance(xs, (np.ndarray, tensor.Tensor)):
            xs = [xs]
        xs = list(xs)
        if len(xs) != len(self.inputs):
            names = [i.name for i in self.inputs]
            raise SonnxError(f"run: the graph has {len(names)} inputs {names}, got {len(xs)} values; pass one "
                             f"array or Tensor per input, in that order")
        return {info.name: self._input_value(x, info) for info, x in zip(self.inputs, xs)}

    def _input_value(self, x, info):
        """A graph input as the importer holds it: a Tensor; a list for a sequence (None or the value for an
        optional); a numpy object array for strings."""
        kind, elem = self.types.get(info.name, ("tensor", info.dtype))
        return self._held(x, info.name, kind, elem)

    def _held(self, x, name, kind, elem):
        if x is None and kind == "optional":
            return None
        if isinstance(x, (list, tuple)) and kind in ("sequence", "optional"):
            return [self._held(v, name, "tensor", elem) for v in x]
        if isinstance(x, tensor.Tensor):
            return x
        x = np.asarray(x)
        if elem == onnx.TensorProto.STRING or x.dtype.kind in "OUS":
            return x.astype(object)
        t = tensor.from_numpy(host_array(x, f"input {name}"), self.dev)
        return t.as_type(tensor.bfloat16) if elem == onnx.TensorProto.BFLOAT16 else t

    def _to_output(self, v, name: str, info):
        if v is None or isinstance(v, list):  # an empty optional, a sequence
            elem = self.types.get(name, (None, 0))[1]
            return v if v is None else [self._to_output(e, name, ValueInfo(name, elem, None)) for e in v]
        if self.is_graph:
            return v if isinstance(v, tensor.Tensor) else tensor.from_numpy(host_array(v, name), self.dev)
        arr = tensor.to_numpy(v) if isinstance(v, tensor.Tensor) else np.asarray(v)
        elem = info.dtype if info is not None and info.dtype else self.types.get(name, (None, 0))[1]
        if elem and elem != onnx.TensorProto.STRING:
            arr = arr.astype(np_dtype_of(elem), copy=False)  # narrow types: exact, the values are the type's
        if info is not None and info.shape is not None and None not in info.shape and \
                int(np.prod(info.shape)) == arr.size:
            arr = arr.reshape(info.shape)  # e.g. a full reduction: our (1,) is ONNX's ()
        return arr

    # ----- running
    def initialize(self):
        """SINGA's hook, called by the first run; nothing is left to prepare here."""
        self.has_initialized = True

    def run(self, inputs, **kwargs):
        """Runs the graph on `inputs` (one numpy array or Tensor per graph input, in order; Tensors stay on
        their device). Keywords: ``last_layers`` (run nodes up to this index; negative: SINGA's arithmetic,
        see the module docstring) and ``aux_output`` (names of intermediate values to return as well).
        Returns a list: the graph's outputs (or the last node's outputs when cut short), then the aux
        outputs."""
        if not self.has_initialized:
            self.initialize()
        n = len(self.layers)
        last = kwargs.get("last_layers")
        if last is None:
            last = n - 1
        elif not isinstance(last, int) or not -n - 1 <= last < n:
            raise SonnxError(f"run: last_layers={last!r} is out of range for a graph of {n} nodes")
        elif last < 0:  # SINGA's arithmetic: -2 runs every node, -3 all but the last, ..., -1 the first only
            last = (last + 1) % n
        first = next((x for x in (inputs if isinstance(inputs, (list, tuple)) else [inputs])
                      if isinstance(x, tensor.Tensor)), None)
        if first is not None:
            self.dev = first.device
        env = self._input_tensors(inputs)
        fetch = self._fetcher(env)
        for node, convert in self.layers[:last + 1]:
            outs = convert(NodeContext(node, fetch, self.opset, self.dev, self.types))
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            if len(outs) < len([o for o in node.outputs if o]):
                raise SonnxError(f"{node.op_type} node {node.name!r}: gave {len(outs)} outputs, the graph wants "
                                 f"{len(node.outputs)}")
            for name, v in zip(node.outputs, outs):
                if name:
                    env[name] = v
        infos = {o.name: o for o in self.outputs}
        wanted = [o.name for o in self.outputs] if last == n - 1 else list(self.layers[last].node.outputs)
        wanted += list(kwargs.get("aux_output", ()))
        missing = [w for w in wanted if w not in env and w not in self.states]
        if missing:
            raise SonnxError(f"run: no value named {missing} was computed")
        return [self._to_output(env[w] if w in env else self.states[w], w, infos.get(w)) for w in wanted]


def _input_info(name: str, value):
    """The ValueInfoProto of a run_node input: a tensor of the array's type, or a sequence (a list of arrays)."""
    h = onnx.helper
    if isinstance(value, (list, tuple)):
        elem = h.np_dtype_to_tensor_dtype(np.asarray(value[0]).dtype) if len(value) else onnx.TensorProto.FLOAT
        return h.make_value_info(name, h.make_sequence_type_proto(h.make_tensor_type_proto(elem, None)))
    return h.make_tensor_value_info(name, h.np_dtype_to_tensor_dtype(np.asarray(value).dtype), None)


class SingaBackend(Backend):
    """ONNX's backend interface for singa_lite (``onnx.backend.test`` drives it): ``prepare``,
    ``run_node``, ``supports_device``. ``_rename_operators`` maps every ONNX operator sonnx reads to the
    singa_lite operator or layer that runs it (SINGA's attribute, which SINGA's backend test reads)."""

    _opset_version = MAX_IMPORT_OPSET
    _rename_operators = dict(SINGA_NAMES)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        if device.upper().startswith("CUDA"):
            return device_mod.get_num_gpus() > 0
        return device.upper() == "CPU"

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        """Checks `model` (a ModelProto, or bytes / a path to one) and returns a :class:`SingaRep` on `device`
        ("CPU", "CUDA", or a singa_lite Device). Keywords SINGA accepts (``init_inputs``) are ignored."""
        if isinstance(model, (bytes, bytearray)):
            model = onnx.load_from_string(bytes(model))
        elif isinstance(model, str):
            model = onnx.load(model)
        if not isinstance(model, onnx.ModelProto):
            raise TypeError(f"prepare: expected an onnx.ModelProto, bytes or a file path, got {type(model).__name__}")
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as e:
            raise SonnxError(f"prepare: the model is not valid ONNX: {e}") from None
        return SingaRep(model, device)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, opset_version=None, **kwargs):
        """Runs one NodeProto on `inputs` (numpy arrays, one per non-empty node input); returns
        ``{output name: numpy array}``."""
        given = [i for i in node.input if i]
        if len(given) != len(inputs):
            raise SonnxError(f"run_node {node.op_type}: the node has {len(given)} inputs, got {len(inputs)} values")
        graph = onnx.helper.make_graph(
            [node], "run_node", [_input_info(n, v) for n, v in zip(given, inputs)],
            [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o])
        opset = opset_version or cls._opset_version
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        rep = SingaRep(model, device, opset)
        outs = rep.run(list(inputs))
        return OrderedDict(zip([o for o in node.output if o], outs))


prepare = SingaBackend.prepare
run_node = SingaBackend.run_node
