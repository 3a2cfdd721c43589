// cuDNN: whether it can be used (and why not), where it was loaded from, and the ops singa_lite/ops/nn.py calls on
// CUDA tensors when it can. In a CPU-only build only the questions exist, and they say so.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "bindings/binders.h"
#include "core/errors.h"
#include "cuda/conv_plan.h"  // plain C++: the plan cache is bound in every build, for its CPU tests
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/cudnn.h"
#include "cuda/cudnn_ops.h"
#include "cuda/cudnn_rnn.h"
#endif

namespace py = pybind11;

namespace sl::bindings {

namespace {

// (device, dtype, direction, x[4], w[4], stride[2], padding[2], dilation[2], groups), as the tests spell a key.
cuda::ConvKey conv_key_of(const py::tuple& t) {
  SL_CHECK(t.size() == 9, ValueError, "_ConvPlanCache: a key is (device, dtype, direction, x, w, stride, padding, "
           "dilation, groups), got ", t.size(), " items");
  cuda::ConvKey k;
  k.device = t[0].cast<int>();
  k.dtype = t[1].cast<int>();
  k.direction = cuda::ConvDirection(t[2].cast<int>());
  k.x = t[3].cast<std::array<int64_t, 4>>();
  k.w = t[4].cast<std::array<int64_t, 4>>();
  k.stride = t[5].cast<std::array<int64_t, 2>>();
  k.padding = t[6].cast<std::array<int64_t, 2>>();
  k.dilation = t[7].cast<std::array<int64_t, 2>>();
  k.groups = t[8].cast<int64_t>();
  return k;
}

py::list choices_list(const std::vector<cuda::AlgoChoice>& cs) {
  py::list out;
  for (const auto& c : cs) out.append(py::make_tuple(c.algo, c.workspace));
  return out;
}

std::vector<cuda::AlgoChoice> choices_of(const py::iterable& items) {
  std::vector<cuda::AlgoChoice> out;
  for (const py::handle& h : items) {
    const auto pair = h.cast<std::pair<int, size_t>>();
    out.push_back({pair.first, pair.second});
  }
  return out;
}

py::dict stats_dict(const cuda::ConvPlanCache::Stats& s) {
  py::dict d;
  d["entries"] = s.entries;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  return d;
}

// The plan cache and the candidate walk of cuDNN convolutions (cuda/conv_plan.h) on their own, for CPU tests: the
// same code as on a GPU, with Python standing in for cuDNN's heuristic and for the attempt to run a candidate.
void bind_conv_plan_for_tests(py::module_& m) {
  py::class_<cuda::ConvPlanCache>(m, "_ConvPlanCache", "Tests only: cuda/conv_plan.h's cache.")
      .def(py::init<size_t>(), py::arg("capacity") = 4096)
      .def("get", [](cuda::ConvPlanCache& c, const py::tuple& key, const py::function& make) {
        return choices_list(c.get(conv_key_of(key), [&] { return choices_of(make()); }));
      }, py::arg("key"), py::arg("make"))
      .def("stats", [](const cuda::ConvPlanCache& c) { return stats_dict(c.stats()); })
      .def("clear", &cuda::ConvPlanCache::clear);
  m.def("_conv_run_first_fitting", [](const py::iterable& candidates, const py::function& attempt) {
    return cuda::run_first_fitting(choices_of(candidates), [&](const cuda::AlgoChoice& c) {
      return attempt(c.algo, c.workspace).cast<bool>();
    }, "conv (test)", 0);
  }, py::arg("candidates"), py::arg("attempt"),
        "Tests only: the index of the first candidate for which attempt(algo, bytes) is True; MemoryError when none.");
}

#ifdef SINGA_LITE_WITH_CUDA
cuda::PoolMode pool_mode(const std::string& mode) {
  if (mode == "max") return cuda::PoolMode::kMax;
  if (mode == "avg_include_pad") return cuda::PoolMode::kAvgIncludePad;
  if (mode == "avg_exclude_pad") return cuda::PoolMode::kAvgExcludePad;
  throw ValueError(str("cudnn pooling: mode must be 'max', 'avg_include_pad' or 'avg_exclude_pad', got '", mode, "'"));
}

// layer.CudnnRNN's arguments as cuda::RnnSpec; mode as SINGA names it ("vanilla" is "tanh").
cuda::RnnSpec rnn_spec(const std::string& mode, int64_t hidden_size, int64_t num_layers, bool bidirectional,
                       bool batch_first) {
  cuda::RnnSpec s;
  if (mode == "lstm") s.mode = cuda::RnnMode::kLstm;
  else if (mode == "gru") s.mode = cuda::RnnMode::kGru;
  else if (mode == "tanh" || mode == "vanilla") s.mode = cuda::RnnMode::kTanh;
  else if (mode == "relu") s.mode = cuda::RnnMode::kRelu;
  else throw ValueError(str("cudnn rnn: mode must be 'lstm', 'gru', 'tanh' (or 'vanilla') or 'relu', got '", mode,
                            "'"));
  s.hidden_size = hidden_size;
  s.num_layers = num_layers;
  s.bidirectional = bidirectional;
  s.batch_first = batch_first;
  return s;
}

Tensor or_undefined(const std::optional<Tensor>& t) { return t ? *t : Tensor(); }
py::object or_none(const Tensor& t) { return t.defined() ? py::cast(t) : py::none(); }

void bind_cudnn_rnn(py::module_& m) {
  m.def("cudnn_rnn_forward", [](const Tensor& x, const Tensor& w, const std::optional<Tensor>& hx,
                                const std::optional<Tensor>& cx, const std::string& mode, int64_t hidden_size,
                                int64_t num_layers, bool bidirectional, bool batch_first,
                                const std::vector<int32_t>& seq_lengths, bool training) {
    const cuda::RnnSpec s = rnn_spec(mode, hidden_size, num_layers, bidirectional, batch_first);
    cuda::RnnForwardResult r;
    {
      py::gil_scoped_release unlocked;
      r = cuda::cudnn_rnn_forward(s, x, w, or_undefined(hx), or_undefined(cx), seq_lengths, training);
    }
    return py::make_tuple(r.y, r.hy, or_none(r.cy), or_none(r.reserve));
  }, py::arg("x"), py::arg("w"), py::arg("hx"), py::arg("cx"), py::arg("mode"), py::arg("hidden_size"),
        py::arg("num_layers"), py::arg("bidirectional"), py::arg("batch_first"), py::arg("seq_lengths"),
        py::arg("training"),
        "(y, hy, cy, reserve): cuDNN's RNN over x with the flat weight w (cuda/cudnn_rnn.h); cy is None but for "
        "LSTM, reserve None unless training. seq_lengths: [] or one length per sequence.");
  m.def("cudnn_rnn_backward", [](const Tensor& x, const Tensor& w, const std::optional<Tensor>& hx,
                                 const std::optional<Tensor>& cx, const Tensor& y, const Tensor& dy,
                                 const Tensor& reserve, const std::string& mode, int64_t hidden_size,
                                 int64_t num_layers, bool bidirectional, bool batch_first,
                                 const std::vector<int32_t>& seq_lengths, bool need_dw) {
    const cuda::RnnSpec s = rnn_spec(mode, hidden_size, num_layers, bidirectional, batch_first);
    cuda::RnnGrads g;
    {
      py::gil_scoped_release unlocked;
      g = cuda::cudnn_rnn_backward(s, x, w, or_undefined(hx), or_undefined(cx), y, dy, reserve, seq_lengths,
                                   need_dw);
    }
    return py::make_tuple(g.dx, or_none(g.dhx), or_none(g.dcx), or_none(g.dw));
  }, py::arg("x"), py::arg("w"), py::arg("hx"), py::arg("cx"), py::arg("y"), py::arg("dy"), py::arg("reserve"),
        py::arg("mode"), py::arg("hidden_size"), py::arg("num_layers"), py::arg("bidirectional"),
        py::arg("batch_first"), py::arg("seq_lengths"), py::arg("need_dw"),
        "(dx, dhx, dcx, dw) of a training cudnn_rnn_forward's y; dhx / dcx None when hx / cx were, dw None unless "
        "need_dw.");
  m.def("cudnn_rnn_weight_layout", [](const std::string& mode, int64_t hidden_size, int64_t num_layers,
                                      bool bidirectional, int64_t input_size, DType dtype, const Device& device) {
    const cuda::RnnSpec s = rnn_spec(mode, hidden_size, num_layers, bidirectional, true);
    cuda::RnnWeightLayout l;
    {
      py::gil_scoped_release unlocked;
      l = cuda::cudnn_rnn_weight_layout(s, input_size, dtype, device);
    }
    py::list blocks;
    for (const auto& b : l.blocks) {
      py::dict e;
      e["pseudo_layer"] = b.pseudo_layer;
      e["lin_id"] = b.lin_id;
      e["cudnn_matrix"] = b.cudnn_matrix;
      e["ours_matrix"] = b.ours_matrix;
      e["matrix_numel"] = b.matrix_numel;
      e["cudnn_bias"] = b.cudnn_bias;
      e["ours_bias"] = b.ours_bias;
      e["bias_numel"] = b.bias_numel;
      blocks.append(e);
    }
    py::dict d;
    d["cudnn_numel"] = l.cudnn_numel;
    d["ours_numel"] = l.ours_numel;
    d["same"] = l.same;
    d["blocks"] = blocks;
    return d;
  }, py::arg("mode"), py::arg("hidden_size"), py::arg("num_layers"), py::arg("bidirectional"), py::arg("input_size"),
        py::arg("dtype"), py::arg("device"),
        "Where cuDNN keeps each RNN weight (cudnnGetRNNWeightParams) next to singa_lite's flat layout: "
        "{cudnn_numel, ours_numel, same, blocks}; same: W goes to cuDNN without a copy.");
}
#endif

}  // namespace

void bind_cudnn(py::module_& m) {
  bind_conv_plan_for_tests(m);
#ifdef SINGA_LITE_WITH_CUDA
  const auto release = py::call_guard<py::gil_scoped_release>();
  m.def("cudnn_available", &cuda::cudnn_available, release,
        "True when the ops of CUDA tensors run through cuDNN now (loaded, a GPU visible, not switched off).");
  m.def("cudnn_unavailable_reason", &cuda::cudnn_unavailable_reason, release,
        "Why cuDNN is not used, or '' when it is.");
  m.def("cudnn_status", &cuda::cudnn_status, release, "Where cuDNN was loaded from, or why it cannot be.");
  m.def("cudnn_version", &cuda::cudnn_version, release, "cudnnGetVersion() (e.g. 92800), or 0 when not loadable.");
  m.def("set_cudnn_dir", &cuda::set_cudnn_library_dir, py::arg("dir"),
        "Folder to load cuDNN from first (the nvidia-cudnn wheel's lib folder; singa_lite sets it on import).");
  m.def("set_cudnn_enabled", &cuda::set_cudnn_enabled, py::arg("enabled"),
        "Switches cuDNN off (the own kernels run) or back on; starts as SINGA_LITE_CUDNN says. For tests and "
        "benchmarks.");
  m.def("cudnn_enabled", &cuda::cudnn_enabled);
  m.def("cudnn_conv_plan_stats", [] { return stats_dict(cuda::conv_plan_stats()); },
        "The cuDNN convolution plan cache: entries, hits (calls that skipped cuDNN's heuristic), misses.");
  m.def("cudnn_conv2d_plans", [](const std::string& direction, const Shape& x_shape, const Shape& w_shape, Pair stride,
                                 Pair padding, Pair dilation, int64_t groups, DType dtype, const Device& device) {
    const cuda::ConvDirection d = direction == "forward"         ? cuda::ConvDirection::kForward
                                  : direction == "backward_data" ? cuda::ConvDirection::kBackwardData
                                  : direction == "backward_filter"
                                      ? cuda::ConvDirection::kBackwardFilter
                                      : throw ValueError(str("cudnn_conv2d_plans: direction must be 'forward', "
                                                             "'backward_data' or 'backward_filter', got '", direction,
                                                             "'"));
    std::vector<cuda::AlgoChoice> plans;
    {
      py::gil_scoped_release unlocked;
      plans = cuda::cudnn_conv2d_plans(d, x_shape, w_shape, stride, padding, dilation, groups, dtype, device);
    }
    return choices_list(plans);
  }, py::arg("direction"), py::arg("x_shape"), py::arg("w_shape"), py::arg("stride"), py::arg("padding"),
        py::arg("dilation"), py::arg("groups"), py::arg("dtype"), py::arg("device"),
        "[(algorithm, workspace bytes)] a convolution of these shapes tries, best first (cached as the ops do).");
  m.def("_cudnn_provoke_error", &cuda::cudnn_provoke_error,
        "Tests only: one invalid cuDNN call, which raises CudaError (or CudaError saying why cuDNN cannot load).");

  m.def("cudnn_conv2d_forward", &cuda::cudnn_conv2d_forward, py::arg("x"), py::arg("w"), py::arg("stride"),
        py::arg("padding"), py::arg("dilation"), py::arg("groups"), release,
        "x [N,C,H,W], w [OC,C/groups,kh,kw] -> y [N,OC,OH,OW] (no bias).");
  m.def("cudnn_conv2d_backward_data", &cuda::cudnn_conv2d_backward_data, py::arg("w"), py::arg("dy"),
        py::arg("x_shape"), py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("groups"), release);
  m.def("cudnn_conv2d_backward_filter", &cuda::cudnn_conv2d_backward_filter, py::arg("x"), py::arg("dy"),
        py::arg("w_shape"), py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("groups"), release);
  m.def("cudnn_pool2d_forward", [](const Tensor& x, const std::string& mode, Pair k, Pair s, Pair p) {
    const cuda::PoolMode pm = pool_mode(mode);
    py::gil_scoped_release unlocked;
    return cuda::cudnn_pool2d_forward(x, pm, k, s, p);
  }, py::arg("x"), py::arg("mode"), py::arg("kernel"), py::arg("stride"), py::arg("padding"),
        "mode: 'max', 'avg_include_pad' or 'avg_exclude_pad'.");
  m.def("cudnn_pool2d_backward", [](const Tensor& x, const Tensor& y, const Tensor& dy, const std::string& mode,
                                    Pair k, Pair s, Pair p) {
    const cuda::PoolMode pm = pool_mode(mode);
    py::gil_scoped_release unlocked;
    return cuda::cudnn_pool2d_backward(x, y, dy, pm, k, s, p);
  }, py::arg("x"), py::arg("y"), py::arg("dy"), py::arg("mode"), py::arg("kernel"), py::arg("stride"),
        py::arg("padding"));
  m.def("cudnn_batch_norm_forward_training", &cuda::cudnn_batch_norm_forward_training, py::arg("x"),
        py::arg("scale"), py::arg("bias"), py::arg("running_mean"), py::arg("running_var"), py::arg("momentum"),
        py::arg("eps"), release, "Returns (y, saved_mean, saved_inv_std); updates the running statistics in place.");
  m.def("cudnn_batch_norm_forward_inference", &cuda::cudnn_batch_norm_forward_inference, py::arg("x"),
        py::arg("scale"), py::arg("bias"), py::arg("running_mean"), py::arg("running_var"), py::arg("eps"), release);
  m.def("cudnn_batch_norm_backward", &cuda::cudnn_batch_norm_backward, py::arg("x"), py::arg("dy"), py::arg("scale"),
        py::arg("saved_mean"), py::arg("saved_inv_std"), py::arg("eps"), release, "Returns (dx, dscale, dbias).");
  bind_cudnn_rnn(m);
#else
  m.def("cudnn_available", [] { return false; });
  m.def("cudnn_unavailable_reason", [] { return std::string(kCpuOnly); });
  m.def("cudnn_status", [] { return std::string(kCpuOnly); });
  m.def("cudnn_version", [] { return 0; });
  m.def("set_cudnn_enabled", [](bool) {}, py::arg("enabled"));
  m.def("cudnn_enabled", [] { return false; });
  m.def("cudnn_conv_plan_stats", [] { return stats_dict(cuda::ConvPlanCache::Stats{}); });
#endif
}

}  // namespace sl::bindings
