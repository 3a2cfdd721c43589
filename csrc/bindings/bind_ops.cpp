// Ops as module functions. Every op releases the GIL while it runs, so Python threads (and, later,
// DistOpt's communication) proceed during long kernels.
#include <pybind11/stl.h>

#include "bindings/binders.h"
#include "ops/ops.h"

namespace py = pybind11;

namespace sl::bindings {
namespace {

using OptTensor = std::optional<Tensor>;
Tensor or_empty(const OptTensor& t) { return t ? *t : Tensor(); }
const auto release = py::call_guard<py::gil_scoped_release>();

}  // namespace

void bind_ops(py::module_& m) {
  for (int i = 0; i < kNumBinaryOps; ++i) {
    const BinaryOp op = BinaryOp(i);
    const std::string name = op_name(op);
    m.def(name.c_str(),
          [op](const Tensor& a, const Tensor& b, const OptTensor& out) { return binary(op, a, b, or_empty(out)); },
          py::arg("a"), py::arg("b"), py::arg("out") = py::none(), release);
    m.def((name + "_scalar").c_str(),
          [op](const Tensor& a, double s, bool scalar_first, const OptTensor& out) {
            return binary_scalar(op, a, s, scalar_first, or_empty(out));
          },
          py::arg("a"), py::arg("s"), py::arg("scalar_first") = false, py::arg("out") = py::none(), release);
  }
  // The op lists (ops/elementwise_ops.h), so Python builds its functions from them instead of keeping a copy.
  m.def("binary_ops", [] {
    std::vector<std::string> names;
    for (int i = 0; i < kNumBinaryOps; ++i) names.emplace_back(op_name(BinaryOp(i)));
    return names;
  }, "Names of the element-wise binary ops, each bound as NAME(a, b) and NAME_scalar(a, s).");
  m.def("unary_ops", [] {
    std::vector<std::pair<std::string, std::string>> ops;
    for (int i = 0; i < kNumUnaryOps; ++i)
      ops.emplace_back(op_name(UnaryOp(i)), unary_domain(UnaryOp(i)) == UnaryDomain::Numeric ? "numeric" : "floating");
    return ops;
  }, "(name, domain) of the element-wise unary ops; domain 'numeric' (any dtype but bool) or 'floating'.");
  for (int i = 0; i < kNumUnaryOps; ++i) {
    const UnaryOp op = UnaryOp(i);
    m.def(op_name(op), [op](const Tensor& x, const OptTensor& out) { return unary(op, x, or_empty(out)); },
          py::arg("x"), py::arg("out") = py::none(), release);
  }
  m.def("clip", [](const Tensor& x, std::optional<double> lo, std::optional<double> hi, const OptTensor& out) {
    return clip(x, lo, hi, or_empty(out));
  }, py::arg("x"), py::arg("min") = py::none(), py::arg("max") = py::none(), py::arg("out") = py::none(), release);
  m.def("axpy_", &axpy_, py::arg("alpha"), py::arg("x"), py::arg("y"), release, "y += alpha * x, in place.");
  m.def("sgd_update_", [](const Tensor& param, const Tensor& grad, const OptTensor& buf, double lr, double momentum,
                          double dampening, double weight_decay, bool nesterov, bool first) {
    sgd_update_(param, grad, or_empty(buf), SgdStep{lr, momentum, dampening, weight_decay, nesterov, first});
  }, py::arg("param"), py::arg("grad"), py::arg("buf"), py::arg("lr"), py::arg("momentum") = 0.0,
        py::arg("dampening") = 0.0, py::arg("weight_decay") = 0.0, py::arg("nesterov") = false,
        py::arg("first") = false, release,
        "One SGD step in place, in one pass: d = grad + weight_decay * param; buf = d if first else "
        "momentum * buf + (1 - dampening) * d; param -= lr * (d + momentum * buf if nesterov else buf). "
        "buf=None: param -= lr * d.");
  m.def("fill_", &fill_, py::arg("t"), py::arg("value"), release);
  m.def("arange", &arange, py::arg("start"), py::arg("stop"), py::arg("step"), py::arg("dtype"), py::arg("device"),
        release);
  m.def("copy_", &copy_, py::arg("dst"), py::arg("src"), release,
        "Copies src into dst (broadcasting and casting; across devices).");

  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin}) {
    m.def(op_name(op), [op](const Tensor& x, std::optional<std::vector<int64_t>> axes, bool keepdims) {
      return reduce(op, x, axes, keepdims);
    }, py::arg("x"), py::arg("axes") = py::none(), py::arg("keepdims") = false, release);
  }
  m.def("argmax", &argmax, py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false, release);
  m.def("argmin", &argmin, py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false, release);

  m.def("matmul", [](const Tensor& a, const Tensor& b, const OptTensor& out) { return matmul(a, b, or_empty(out)); },
        py::arg("a"), py::arg("b"), py::arg("out") = py::none(), release);

  m.def("concat", &concat, py::arg("xs"), py::arg("axis") = 0, release);
  m.def("stack", &stack, py::arg("xs"), py::arg("axis") = 0, release);
  m.def("split", &split, py::arg("x"), py::arg("sizes"), py::arg("axis") = 0);
  m.def("split_sections", &split_sections, py::arg("x"), py::arg("sections"), py::arg("axis") = 0);
  m.def("one_hot", &one_hot, py::arg("indices"), py::arg("depth"), py::arg("dtype") = DType::kFloat32, release);

  m.def("select_significant", &select_significant, py::arg("x"), py::arg("spars"), py::arg("top_k"), release,
        "Ascending int64 indices of 1-D x's entries with |x| >= spars, or (top_k) of its ceil(spars * n) largest "
        "magnitudes.");
  m.def("take", &take, py::arg("x"), py::arg("indices"), release, "x[indices] for 1-D x and int64 indices.");
  m.def("index_add_", &index_add_, py::arg("dense"), py::arg("indices"), py::arg("values"), release,
        "dense[indices[i]] += values[i] in place; the indices must be distinct.");
  m.def("uniform_", &uniform_, py::arg("t"), py::arg("low") = 0.0, py::arg("high") = 1.0, release);
  m.def("gaussian_", &gaussian_, py::arg("t"), py::arg("mean") = 0.0, py::arg("std") = 1.0, release);
  m.def("bernoulli_", &bernoulli_, py::arg("t"), py::arg("p") = 0.5, release);
}

}  // namespace sl::bindings
