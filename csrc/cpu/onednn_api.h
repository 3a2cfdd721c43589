// The part of oneDNN's C API that cpu/onednn.cpp uses, declared here so that no oneDNN header is needed to build.
// Values as in oneapi/dnnl/dnnl_types.h and dnnl_common_types.h of oneDNN 3.x (the ABI of libdnnl.so.3);
// cpu/onednn_api_check.cpp compares them with the header when one is found at build time (CMakeLists.txt).
#pragma once
#include <cstddef>
#include <cstdint>

namespace sl::cpu::onednn::api {

using status_t = int;
using dim_t = int64_t;
using dims_t = dim_t[12];
struct opaque;
using engine_t = opaque*;
using stream_t = opaque*;
using memory_desc_t = opaque*;
using const_memory_desc_t = const opaque*;
using memory_t = opaque*;
using primitive_desc_t = opaque*;
using const_primitive_desc_t = const opaque*;
using primitive_t = opaque*;
using const_primitive_attr_t = const opaque*;
struct exec_arg_t {
  int arg;
  memory_t memory;
};
struct version_t {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};

constexpr status_t kSuccess = 0;
constexpr int kF32 = 3;                        // dnnl_f32
constexpr int kFormatAny = 1;                  // dnnl_format_tag_any
constexpr int kTagA = 2;                       // dnnl_a (= dnnl_x)
constexpr int kTagAbcd = 5;                    // dnnl_abcd (= nchw, oihw)
constexpr int kTagAbcde = 6;                   // dnnl_abcde (= goihw)
constexpr int kEngineCpu = 1;                  // dnnl_cpu
constexpr int kStreamDefault = 1;              // dnnl_stream_default_flags
constexpr int kForwardTraining = 64;           // dnnl_forward_training
constexpr int kConvolutionDirect = 1;          // dnnl_convolution_direct
constexpr int kQuerySrc = 129, kQueryDiffSrc = 130, kQueryWeights = 131, kQueryDiffWeights = 132;
constexpr int kQueryDst = 133, kQueryDiffDst = 134;  // dnnl_query_*_md
constexpr int kArgSrc = 1, kArgDst = 17, kArgWeights = 33, kArgBias = 41;
constexpr int kArgDiffSrc = 129, kArgDiffDst = 145, kArgDiffWeights = 161, kArgDiffBias = 169;
constexpr int kArgFrom = 1, kArgTo = 17;

// The functions, resolved with dlsym; the order of kNames.
struct Functions {
  status_t (*engine_create)(engine_t*, int, size_t);
  status_t (*stream_create)(stream_t*, engine_t, unsigned);
  status_t (*stream_wait)(stream_t);
  status_t (*memory_desc_create_with_tag)(memory_desc_t*, int, const dims_t, int, int);
  status_t (*memory_desc_destroy)(memory_desc_t);
  int (*memory_desc_equal)(const_memory_desc_t, const_memory_desc_t);
  size_t (*memory_desc_get_size)(const_memory_desc_t);
  status_t (*memory_create)(memory_t*, const_memory_desc_t, engine_t, void*);
  status_t (*memory_destroy)(memory_t);
  status_t (*memory_set_data_handle)(memory_t, void*);
  status_t (*conv_fwd_pd_create)(primitive_desc_t*, engine_t, int, int, const_memory_desc_t, const_memory_desc_t,
                                 const_memory_desc_t, const_memory_desc_t, const dims_t, const dims_t, const dims_t,
                                 const dims_t, const_primitive_attr_t);
  status_t (*conv_bwd_data_pd_create)(primitive_desc_t*, engine_t, int, const_memory_desc_t, const_memory_desc_t,
                                      const_memory_desc_t, const dims_t, const dims_t, const dims_t, const dims_t,
                                      const_primitive_desc_t, const_primitive_attr_t);
  status_t (*conv_bwd_weights_pd_create)(primitive_desc_t*, engine_t, int, const_memory_desc_t, const_memory_desc_t,
                                         const_memory_desc_t, const_memory_desc_t, const dims_t, const dims_t,
                                         const dims_t, const dims_t, const_primitive_desc_t, const_primitive_attr_t);
  status_t (*reorder_pd_create)(primitive_desc_t*, const_memory_desc_t, engine_t, const_memory_desc_t, engine_t,
                                const_primitive_attr_t);
  const_memory_desc_t (*pd_query_md)(const_primitive_desc_t, int, int);
  status_t (*pd_destroy)(primitive_desc_t);
  status_t (*primitive_create)(primitive_t*, const_primitive_desc_t);
  status_t (*primitive_destroy)(primitive_t);
  status_t (*primitive_execute)(primitive_t, stream_t, int, const exec_arg_t*);
  const version_t* (*version)();
};
constexpr const char* kNames[] = {
    "dnnl_engine_create", "dnnl_stream_create", "dnnl_stream_wait", "dnnl_memory_desc_create_with_tag",
    "dnnl_memory_desc_destroy", "dnnl_memory_desc_equal", "dnnl_memory_desc_get_size", "dnnl_memory_create",
    "dnnl_memory_destroy", "dnnl_memory_set_data_handle", "dnnl_convolution_forward_primitive_desc_create",
    "dnnl_convolution_backward_data_primitive_desc_create",
    "dnnl_convolution_backward_weights_primitive_desc_create", "dnnl_reorder_primitive_desc_create",
    "dnnl_primitive_desc_query_md", "dnnl_primitive_desc_destroy", "dnnl_primitive_create",
    "dnnl_primitive_destroy", "dnnl_primitive_execute", "dnnl_version"};
static_assert(sizeof(Functions) == sizeof(kNames) / sizeof(kNames[0]) * sizeof(void*));

}  // namespace sl::cpu::onednn::api
