// float32 convolution through oneDNN's C API, opened with dlopen (see onednn.h).
//
// Each pass is one oneDNN primitive created for the shape with memory formats left to oneDNN ("any"): it picks
// its blocked layouts (nChw16c on AVX-512), and our NCHW / OIHW tensors are reordered into and out of them around
// the primitive, as PyTorch does for plain tensors. Primitives and reorders are created once per (pass, shapes,
// geometry, thread count) and reused: creating a primitive costs a JIT compilation. The blocked copies live in one
// workspace shared by every plan (calls are serialized), so they cost the largest single call's bytes, not the sum
// over a model's layers and passes (that sum was ~90 MiB for ResNet-18: docs/benchmarks/memory.md).
#include "cpu/onednn.h"

#include <dlfcn.h>
#include <omp.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/errors.h"
#include "cpu/loop.h"
#include "cpu/onednn_api.h"


namespace sl::cpu::onednn {
namespace {

using namespace api;

struct Library {
  std::mutex mu;  // one oneDNN call at a time: every plan's blocked copies share one workspace
  std::string path, version;
  Functions f{};
  engine_t engine = nullptr;
  stream_t stream = nullptr;
  bool enabled = true;
  // The OpenMP runtime libdnnl runs on, as libdnnl resolves it. In a build whose kernels use another runtime
  // (the portable wheel: LLVM's libomp) set_num_threads reaches only ours, so each call passes the count on.
  int (*omp_get_max_threads)() = nullptr;
  void (*omp_set_num_threads)(int) = nullptr;
};

Library& lib() {
  static Library* l = new Library;  // never destroyed: primitives may outlive static destructors' order
  return *l;
}

void check(status_t s, const char* what) {
  SL_CHECK(s == kSuccess, Error, "oneDNN: ", what, " failed (dnnl_status_t ", s, ")");
}

// Owners of oneDNN handles.
struct Md {
  memory_desc_t h = nullptr;
  Md() = default;
  Md(const Shape& dims, int tag) { make(dims, tag); }
  void make(const Shape& dims, int tag) {
    dims_t d{};
    for (size_t i = 0; i < dims.size(); ++i) d[i] = dims[i];
    check(lib().f.memory_desc_create_with_tag(&h, int(dims.size()), d, kF32, tag), "memory_desc_create");
  }
  Md(const Md&) = delete;
  Md& operator=(const Md&) = delete;
  ~Md() {
    if (h) lib().f.memory_desc_destroy(h);
  }
};

struct Pd {
  primitive_desc_t h = nullptr;
  Pd() = default;
  Pd(const Pd&) = delete;
  Pd& operator=(const Pd&) = delete;
  ~Pd() {
    if (h) lib().f.pd_destroy(h);
  }
};

struct Prim {
  primitive_t h = nullptr;
  Prim() = default;
  Prim(const Prim&) = delete;
  Prim& operator=(const Prim&) = delete;
  ~Prim() {
    if (h) lib().f.primitive_destroy(h);
  }
  void make(const Pd& pd) { check(lib().f.primitive_create(&h, pd.h), "primitive_create"); }
};

struct Mem {
  memory_t h = nullptr;
  Mem() = default;
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  ~Mem() {
    if (h) lib().f.memory_destroy(h);
  }
  void make(const_memory_desc_t md, void* handle) {
    check(lib().f.memory_create(&h, md, lib().engine, handle), "memory_create");
  }
};

// One argument of a primitive: our tensor's plain memory, and, when the primitive chose another layout, a blocked
// memory (its bytes at `offset` in the shared workspace) plus the reorder between the two.
struct Arg {
  int id = 0;
  bool input = true;
  Md plain_md;
  Mem plain, blocked;
  size_t blocked_bytes = 0, offset = 0;
  Pd reorder_pd;
  Prim reorder;

  void init(int arg_id, bool is_input, const Shape& dims, int tag, const_memory_desc_t chosen) {
    id = arg_id, input = is_input;
    auto& f = lib().f;
    plain_md.make(dims, tag);
    plain.make(plain_md.h, nullptr);
    if (f.memory_desc_equal(plain_md.h, chosen)) return;
    blocked.make(chosen, nullptr);
    blocked_bytes = f.memory_desc_get_size(chosen);
    const_memory_desc_t from = input ? plain_md.h : chosen, to = input ? chosen : plain_md.h;
    check(f.reorder_pd_create(&reorder_pd.h, from, lib().engine, to, lib().engine, nullptr), "reorder_pd_create");
    reorder.make(reorder_pd);
  }
  memory_t for_primitive() const { return blocked.h ? blocked.h : plain.h; }
  void run_reorder() const {
    const exec_arg_t a[2] = {{kArgFrom, input ? plain.h : blocked.h}, {kArgTo, input ? blocked.h : plain.h}};
    check(lib().f.primitive_execute(reorder.h, lib().stream, 2, a), "reorder");
  }
};

enum Pass { kForward = 0, kBackwardData = 1, kBackwardWeights = 2 };

struct Geometry {
  Shape x, w;  // w as oneDNN sees it: (OC, C, kh, kw), or (g, OC/g, C/g, kh, kw)
  Shape y;
  dims_t strides{}, dilates{}, pad_l{}, pad_r{};
};

// A pass's primitive and its arguments (3 or 4: x, w, y, bias), and the workspace bytes its blocked copies need.
struct Plan {
  Pd pd, hint;
  Prim prim;
  Arg args[4];
  int nargs = 0;
  size_t workspace_bytes = 0;
};

// A model has a few dozen plans, but a sweep over shapes must not grow the cache without end.
constexpr size_t kMaxPlans = 512;
constexpr size_t kAlign = 64;  // oneDNN's kernels load whole cache lines

// The blocked copies of the running call: grown to the largest call's need and kept, so that a step's calls
// reuse the same (cache- and TLB-warm) pages.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
  char* reserve(size_t need) {
    if (need > bytes) {
      std::free(data);
      data = nullptr, bytes = 0;
      const size_t rounded = (need + kAlign - 1) / kAlign * kAlign;
      data = std::aligned_alloc(kAlign, rounded);
      SL_CHECK(data, Error, "oneDNN: cannot allocate a ", rounded, "-byte workspace for the blocked copies");
      bytes = rounded;
    }
    return static_cast<char*>(data);
  }
};

Workspace& workspace() {
  static auto* w = new Workspace;
  return *w;
}

using Key = std::tuple<int, Shape, Shape, std::array<int64_t, 6>, int64_t, bool, int>;

std::map<Key, std::unique_ptr<Plan>>& plans() {
  static auto* m = new std::map<Key, std::unique_ptr<Plan>>;
  return *m;
}

Geometry geometry(const Shape& x, const Shape& w_ocikk, Pair stride, Pair padding, Pair dilation, int64_t groups) {
  Geometry g;
  g.x = x;
  const int64_t OC = w_ocikk[0], kh = w_ocikk[2], kw = w_ocikk[3];
  if (groups == 1)
    g.w = w_ocikk;
  else
    g.w = {groups, OC / groups, w_ocikk[1], kh, kw};
  const int64_t oh = (x[2] + 2 * padding[0] - dilation[0] * (kh - 1) - 1) / stride[0] + 1;
  const int64_t ow = (x[3] + 2 * padding[1] - dilation[1] * (kw - 1) - 1) / stride[1] + 1;
  g.y = {x[0], OC, oh, ow};
  for (int i = 0; i < 2; ++i) {
    g.strides[i] = stride[size_t(i)];
    g.dilates[i] = dilation[size_t(i)] - 1;  // oneDNN counts the gaps between kernel taps
    g.pad_l[i] = g.pad_r[i] = padding[size_t(i)];
  }
  return g;
}

// The cached plan of a pass, created on first use.
Plan& plan_for(Pass pass, const Geometry& g, Pair stride, Pair padding, Pair dilation, int64_t groups, bool bias) {
  // A primitive is tuned for, and must run with, one thread count: ours, passed on to libdnnl's runtime.
  const int nt = max_threads();
  if (lib().omp_get_max_threads() != nt) lib().omp_set_num_threads(nt);
  Key key{pass, g.x, g.w, {stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1]}, groups, bias, nt};
  auto& cache = plans();
  if (auto it = cache.find(key); it != cache.end()) return *it->second;
  if (cache.size() >= kMaxPlans) cache.clear();
  auto& f = lib().f;
  auto p = std::make_unique<Plan>();
  const int wtag = g.w.size() == 4 ? kTagAbcd : kTagAbcde;
  Md x_any(g.x, kFormatAny), w_any(g.w, kFormatAny), y_any(g.y, kFormatAny), b_md({g.y[1]}, kTagA);
  // The forward primitive; for a backward pass only the hint oneDNN wants (the forward's chosen layouts).
  Pd& fwd = pass == kForward ? p->pd : p->hint;
  check(f.conv_fwd_pd_create(&fwd.h, lib().engine, kForwardTraining, kConvolutionDirect, x_any.h, w_any.h,
                             bias ? b_md.h : nullptr, y_any.h, g.strides, g.dilates, g.pad_l, g.pad_r, nullptr),
        "convolution forward primitive_desc_create");
  if (pass == kForward) {
    p->args[0].init(kArgSrc, true, g.x, kTagAbcd, f.pd_query_md(p->pd.h, kQuerySrc, 0));
    p->args[1].init(kArgWeights, true, g.w, wtag, f.pd_query_md(p->pd.h, kQueryWeights, 0));
    p->args[2].init(kArgDst, false, g.y, kTagAbcd, f.pd_query_md(p->pd.h, kQueryDst, 0));
    p->nargs = 3;
    if (bias) p->args[p->nargs++].init(kArgBias, true, {g.y[1]}, kTagA, b_md.h);
  } else if (pass == kBackwardData) {
    check(f.conv_bwd_data_pd_create(&p->pd.h, lib().engine, kConvolutionDirect, x_any.h, w_any.h, y_any.h,
                                    g.strides, g.dilates, g.pad_l, g.pad_r, p->hint.h, nullptr),
          "convolution backward-data primitive_desc_create");
    p->args[0].init(kArgDiffDst, true, g.y, kTagAbcd, f.pd_query_md(p->pd.h, kQueryDiffDst, 0));
    p->args[1].init(kArgWeights, true, g.w, wtag, f.pd_query_md(p->pd.h, kQueryWeights, 0));
    p->args[2].init(kArgDiffSrc, false, g.x, kTagAbcd, f.pd_query_md(p->pd.h, kQueryDiffSrc, 0));
    p->nargs = 3;
  } else {
    check(f.conv_bwd_weights_pd_create(&p->pd.h, lib().engine, kConvolutionDirect, x_any.h, w_any.h,
                                       bias ? b_md.h : nullptr, y_any.h, g.strides, g.dilates, g.pad_l, g.pad_r,
                                       p->hint.h, nullptr),
          "convolution backward-weights primitive_desc_create");
    p->args[0].init(kArgSrc, true, g.x, kTagAbcd, f.pd_query_md(p->pd.h, kQuerySrc, 0));
    p->args[1].init(kArgDiffDst, true, g.y, kTagAbcd, f.pd_query_md(p->pd.h, kQueryDiffDst, 0));
    p->args[2].init(kArgDiffWeights, false, g.w, wtag, f.pd_query_md(p->pd.h, kQueryDiffWeights, 0));
    p->nargs = 3;
    if (bias) p->args[p->nargs++].init(kArgDiffBias, false, {g.y[1]}, kTagA, b_md.h);
  }
  p->prim.make(p->pd);
  for (Arg& a : p->args) {
    a.offset = p->workspace_bytes;
    p->workspace_bytes += (a.blocked_bytes + kAlign - 1) / kAlign * kAlign;
  }
  return *cache.emplace(std::move(key), std::move(p)).first->second;
}

// Runs a plan on our tensors' memory (ptrs in the order of plan.args): inputs reordered in, the primitive,
// outputs reordered out.
void execute(const Plan& p, const std::array<void*, 4>& ptrs) {
  auto& f = lib().f;
  char* ws = workspace().reserve(p.workspace_bytes);
  exec_arg_t a[4];
  for (int i = 0; i < p.nargs; ++i) {
    check(f.memory_set_data_handle(p.args[i].plain.h, ptrs[size_t(i)]), "memory_set_data_handle");
    if (p.args[i].blocked.h)
      check(f.memory_set_data_handle(p.args[i].blocked.h, ws + p.args[i].offset), "memory_set_data_handle");
    if (p.args[i].input && p.args[i].blocked.h) p.args[i].run_reorder();
    a[i] = {p.args[i].id, p.args[i].for_primitive()};
  }
  check(f.primitive_execute(p.prim.h, lib().stream, p.nargs, a), "convolution");
  for (int i = 0; i < p.nargs; ++i)
    if (!p.args[i].input && p.args[i].blocked.h) p.args[i].run_reorder();
  check(f.stream_wait(lib().stream), "stream_wait");
}

void check_operand(const Tensor& t, const char* op, const char* name) {
  SL_CHECK(t.defined() && t.device().is_cpu() && t.dtype() == DType::kFloat32, TypeError, op, ": ", name,
           " must be a float32 CPU tensor");
  SL_CHECK(t.ndim() == 4 || std::string(name) == "bias", ValueError, op, ": ", name, " must be 4-D, got shape ",
           shape_str(t.shape()));
}

void check_usable(const char* op) {
  SL_CHECK(available(), Error, op, ": oneDNN is not usable: ", unavailable_reason());
  max_threads();  // marks our OpenMP pool as used, so a child forked after this call stays off oneDNN
}

void* ptr(const Tensor& t) { return t.data<float>(); }

}  // namespace

std::string load(const std::string& path) {
  Library& l = lib();
  std::lock_guard<std::mutex> g(l.mu);
  if (l.engine) {
    SL_CHECK(path == l.path, ValueError, "oneDNN: already loaded from ", l.path, "; cannot load ", path, " too");
    return l.version;
  }
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  SL_CHECK(h, Error, "oneDNN: cannot open ", path, ": ", dlerror());
  Functions f{};
  void** slots = reinterpret_cast<void**>(&f);
  for (size_t i = 0; i < sizeof(kNames) / sizeof(kNames[0]); ++i) {
    slots[i] = dlsym(h, kNames[i]);
    if (!slots[i]) {
      dlclose(h);
      throw Error(str("oneDNN: ", path, " has no ", kNames[i], " (need oneDNN 3.x)"));
    }
  }
  auto* get_threads = reinterpret_cast<int (*)()>(dlsym(h, "omp_get_max_threads"));
  auto* set_threads = reinterpret_cast<void (*)(int)>(dlsym(h, "omp_set_num_threads"));
  if (!get_threads || !set_threads) {
    dlclose(h);
    throw Error(str("oneDNN: ", path, " runs on no OpenMP runtime (need the onednn-cpu-gomp build)"));
  }
  const version_t* v = f.version();
  if (v->major != 3) {
    dlclose(h);
    throw Error(str("oneDNN: ", path, " is version ", v->major, ".", v->minor, "; need 3.x"));
  }
  l.f = f;
  l.omp_get_max_threads = get_threads, l.omp_set_num_threads = set_threads;
  check(f.engine_create(&l.engine, kEngineCpu, 0), "engine_create");
  check(f.stream_create(&l.stream, l.engine, kStreamDefault), "stream_create");
  l.path = path;
  l.version = str(v->major, ".", v->minor, ".", v->patch);
  return l.version;
}

std::string unavailable_reason() {
  Library& l = lib();
  if (!l.engine) return "not loaded (pip install onednn-cpu-gomp; x86-64 Linux)";
  if (!l.enabled) return "switched off (SINGA_LITE_ONEDNN=0 or set_onednn_enabled(False))";
  if (max_threads() == 1 && omp_get_max_threads() > 1)
    return "this process was forked after its OpenMP threads ran (their pool does not survive fork)";
  return "";
}

bool available() { return unavailable_reason().empty(); }
void set_enabled(bool on) { lib().enabled = on; }
std::string version() { return lib().version; }

size_t cached_primitives() {
  std::lock_guard<std::mutex> g(lib().mu);
  return plans().size();
}

size_t workspace_bytes() {
  std::lock_guard<std::mutex> g(lib().mu);
  return workspace().bytes;
}

Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Pair stride, Pair padding, Pair dilation,
                      int64_t groups) {
  const char* op = "onednn_conv2d_forward";
  check_usable(op);
  check_operand(x, op, "x");
  check_operand(w, op, "w");
  if (bias.defined()) check_operand(bias, op, "bias");
  const Tensor xc = x.contiguous(), wc = w.contiguous();
  const Geometry g = geometry(x.shape(), w.shape(), stride, padding, dilation, groups);
  Tensor y = Tensor::empty(g.y, DType::kFloat32, x.device());
  const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  std::lock_guard<std::mutex> lock(lib().mu);
  const Plan& p = plan_for(kForward, g, stride, padding, dilation, groups, bias.defined());
  execute(p, {ptr(xc), ptr(wc), ptr(y), bias.defined() ? ptr(bc) : nullptr});
  return y;
}

Tensor conv2d_backward_data(const Tensor& w, const Tensor& dy, const Shape& x_shape, Pair stride, Pair padding,
                            Pair dilation, int64_t groups) {
  const char* op = "onednn_conv2d_backward_data";
  check_usable(op);
  check_operand(w, op, "w");
  check_operand(dy, op, "dy");
  const Geometry g = geometry(x_shape, w.shape(), stride, padding, dilation, groups);
  SL_CHECK(dy.shape() == g.y, ValueError, op, ": dy has shape ", shape_str(dy.shape()), ", the convolution's output ",
           shape_str(g.y));
  const Tensor wc = w.contiguous(), dyc = dy.contiguous();
  Tensor dx = Tensor::empty(x_shape, DType::kFloat32, dy.device());
  std::lock_guard<std::mutex> lock(lib().mu);
  const Plan& p = plan_for(kBackwardData, g, stride, padding, dilation, groups, false);
  execute(p, {ptr(dyc), ptr(wc), ptr(dx), nullptr});
  return dx;
}

std::pair<Tensor, Tensor> conv2d_backward_weights(const Tensor& x, const Tensor& dy, const Shape& w_shape,
                                                  bool with_bias, Pair stride, Pair padding, Pair dilation,
                                                  int64_t groups) {
  const char* op = "onednn_conv2d_backward_weights";
  check_usable(op);
  check_operand(x, op, "x");
  check_operand(dy, op, "dy");
  const Geometry g = geometry(x.shape(), w_shape, stride, padding, dilation, groups);
  SL_CHECK(dy.shape() == g.y, ValueError, op, ": dy has shape ", shape_str(dy.shape()), ", the convolution's output ",
           shape_str(g.y));
  const Tensor xc = x.contiguous(), dyc = dy.contiguous();
  Tensor dw = Tensor::empty(w_shape, DType::kFloat32, x.device());
  Tensor db = with_bias ? Tensor::empty({w_shape[0]}, DType::kFloat32, x.device()) : Tensor();
  std::lock_guard<std::mutex> lock(lib().mu);
  const Plan& p = plan_for(kBackwardWeights, g, stride, padding, dilation, groups, with_bias);
  execute(p, {ptr(xc), ptr(dyc), ptr(dw), with_bias ? ptr(db) : nullptr});
  return {dw, db};
}

}  // namespace sl::cpu::onednn
