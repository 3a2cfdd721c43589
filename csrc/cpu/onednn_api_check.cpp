// Compiled only when a oneDNN 3.x header is found (CMakeLists.txt): our declarations of oneDNN's values and structs
// (cpu/onednn_api.h) checked against the real ones, so a mistyped constant fails the build rather than a run.
#include <oneapi/dnnl/dnnl.h>

#include "cpu/onednn_api.h"

namespace a = sl::cpu::onednn::api;

static_assert(DNNL_VERSION_MAJOR == 3, "cpu/onednn_api.h declares oneDNN 3.x");
static_assert(a::kSuccess == dnnl_success);
static_assert(a::kF32 == dnnl_f32);
static_assert(a::kFormatAny == dnnl_format_tag_any);
static_assert(a::kTagA == dnnl_a && a::kTagA == dnnl_x);
static_assert(a::kTagAbcd == dnnl_nchw && a::kTagAbcd == dnnl_oihw);
static_assert(a::kTagAbcde == dnnl_goihw);
static_assert(a::kEngineCpu == dnnl_cpu);
static_assert(a::kStreamDefault == dnnl_stream_default_flags);
static_assert(a::kForwardTraining == dnnl_forward_training);
static_assert(a::kConvolutionDirect == dnnl_convolution_direct);
static_assert(a::kQuerySrc == dnnl_query_src_md && a::kQueryDiffSrc == dnnl_query_diff_src_md);
static_assert(a::kQueryWeights == dnnl_query_weights_md && a::kQueryDiffWeights == dnnl_query_diff_weights_md);
static_assert(a::kQueryDst == dnnl_query_dst_md && a::kQueryDiffDst == dnnl_query_diff_dst_md);
static_assert(a::kArgSrc == DNNL_ARG_SRC && a::kArgDst == DNNL_ARG_DST && a::kArgWeights == DNNL_ARG_WEIGHTS);
static_assert(a::kArgBias == DNNL_ARG_BIAS && a::kArgDiffSrc == DNNL_ARG_DIFF_SRC);
static_assert(a::kArgDiffDst == DNNL_ARG_DIFF_DST && a::kArgDiffWeights == DNNL_ARG_DIFF_WEIGHTS);
static_assert(a::kArgDiffBias == DNNL_ARG_DIFF_BIAS && a::kArgFrom == DNNL_ARG_FROM && a::kArgTo == DNNL_ARG_TO);
static_assert(sizeof(a::dims_t) == sizeof(dnnl_dims_t) && sizeof(a::dim_t) == sizeof(dnnl_dim_t));
static_assert(sizeof(a::exec_arg_t) == sizeof(dnnl_exec_arg_t));
static_assert(offsetof(a::exec_arg_t, memory) == offsetof(dnnl_exec_arg_t, memory));
static_assert(sizeof(a::version_t) == sizeof(dnnl_version_t));
static_assert(offsetof(a::version_t, patch) == offsetof(dnnl_version_t, patch));
static_assert(sizeof(a::status_t) == sizeof(dnnl_status_t));
