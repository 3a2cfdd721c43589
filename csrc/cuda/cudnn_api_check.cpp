// Compile-time check of cuda/cudnn.h against NVIDIA's real cudnn.h. Built only when CMake finds a cuDNN 9 header
// (CMakeLists.txt); it emits no code. Every value, struct layout and function type singa_lite declares is compared,
// so a typo in a declaration (which dlsym cannot notice) stops the build instead of corrupting a call at run time.
#include <cudnn.h>

#include <cstddef>
#include <type_traits>

#include "cuda/cudnn.h"

static_assert(CUDNN_MAJOR == 9, "cuda/cudnn.h declares the cuDNN 9 API");

namespace {
namespace o = sl::cuda;

// ----- enum values
#define SL_SAME_VALUE(name) static_assert(int(o::name) == int(::name), "cuda/cudnn.h: wrong value of " #name)
SL_SAME_VALUE(CUDNN_STATUS_SUCCESS);
SL_SAME_VALUE(CUDNN_STATUS_NOT_INITIALIZED);
SL_SAME_VALUE(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH);
SL_SAME_VALUE(CUDNN_STATUS_BAD_PARAM);
SL_SAME_VALUE(CUDNN_STATUS_NOT_SUPPORTED);
SL_SAME_VALUE(CUDNN_STATUS_INTERNAL_ERROR);
SL_SAME_VALUE(CUDNN_STATUS_EXECUTION_FAILED);
SL_SAME_VALUE(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED);
SL_SAME_VALUE(CUDNN_STATUS_EXECUTION_FAILED_CUDART);
SL_SAME_VALUE(CUDNN_DATA_FLOAT);
SL_SAME_VALUE(CUDNN_DATA_DOUBLE);
SL_SAME_VALUE(CUDNN_DATA_HALF);
SL_SAME_VALUE(CUDNN_TENSOR_NCHW);
SL_SAME_VALUE(CUDNN_DEFAULT_MATH);
SL_SAME_VALUE(CUDNN_TENSOR_OP_MATH);
SL_SAME_VALUE(CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
SL_SAME_VALUE(CUDNN_FMA_MATH);
SL_SAME_VALUE(CUDNN_NOT_PROPAGATE_NAN);
SL_SAME_VALUE(CUDNN_PROPAGATE_NAN);
SL_SAME_VALUE(CUDNN_NON_DETERMINISTIC);
SL_SAME_VALUE(CUDNN_DETERMINISTIC);
SL_SAME_VALUE(CUDNN_CONVOLUTION);
SL_SAME_VALUE(CUDNN_CROSS_CORRELATION);
SL_SAME_VALUE(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
SL_SAME_VALUE(CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
SL_SAME_VALUE(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
SL_SAME_VALUE(CUDNN_POOLING_MAX);
SL_SAME_VALUE(CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING);
SL_SAME_VALUE(CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING);
SL_SAME_VALUE(CUDNN_POOLING_MAX_DETERMINISTIC);
SL_SAME_VALUE(CUDNN_BATCHNORM_SPATIAL);
SL_SAME_VALUE(CUDNN_RNN_ALGO_STANDARD);
SL_SAME_VALUE(CUDNN_FWD_MODE_INFERENCE);
SL_SAME_VALUE(CUDNN_FWD_MODE_TRAINING);
SL_SAME_VALUE(CUDNN_RNN_RELU);
SL_SAME_VALUE(CUDNN_RNN_TANH);
SL_SAME_VALUE(CUDNN_LSTM);
SL_SAME_VALUE(CUDNN_GRU);
SL_SAME_VALUE(CUDNN_RNN_DOUBLE_BIAS);
SL_SAME_VALUE(CUDNN_UNIDIRECTIONAL);
SL_SAME_VALUE(CUDNN_BIDIRECTIONAL);
SL_SAME_VALUE(CUDNN_LINEAR_INPUT);
SL_SAME_VALUE(CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED);
SL_SAME_VALUE(CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED);
SL_SAME_VALUE(CUDNN_WGRAD_MODE_ADD);
#undef SL_SAME_VALUE
static_assert(o::kCudnnRnnPaddedIoEnabled == CUDNN_RNN_PADDED_IO_ENABLED,
              "cuda/cudnn.h: wrong value of CUDNN_RNN_PADDED_IO_ENABLED");
// Our enums are passed where cuDNN's are expected: they must have the same size.
static_assert(sizeof(o::cudnnStatus_t) == sizeof(::cudnnStatus_t) &&
                  sizeof(o::cudnnDataType_t) == sizeof(::cudnnDataType_t),
              "cuda/cudnn.h: enum size differs");
static_assert(sizeof(o::cudnnRNNMode_t) == sizeof(::cudnnRNNMode_t) &&
                  sizeof(o::cudnnRNNDataLayout_t) == sizeof(::cudnnRNNDataLayout_t) &&
                  sizeof(o::cudnnForwardMode_t) == sizeof(::cudnnForwardMode_t),
              "cuda/cudnn.h: RNN enum size differs");

// ----- struct layout of the algorithm search results
#define SL_SAME_LAYOUT(ours, real)                                                                                \
  static_assert(sizeof(o::ours) == sizeof(::real) && offsetof(o::ours, algo) == offsetof(::real, algo) &&         \
                    offsetof(o::ours, status) == offsetof(::real, status) &&                                      \
                    offsetof(o::ours, memory) == offsetof(::real, memory) &&                                      \
                    offsetof(o::ours, determinism) == offsetof(::real, determinism) &&                            \
                    offsetof(o::ours, mathType) == offsetof(::real, mathType),                                    \
                "cuda/cudnn.h: layout of " #ours " differs")
SL_SAME_LAYOUT(cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgoPerf_t);
SL_SAME_LAYOUT(cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgoPerf_t);
SL_SAME_LAYOUT(cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgoPerf_t);
#undef SL_SAME_LAYOUT

// ----- function types: the real declaration with each cuDNN type replaced by ours must equal our pointer type
template <typename T> struct Ours { using type = T; };
template <typename T> struct Ours<T*> { using type = typename Ours<T>::type*; };
template <typename T> struct Ours<const T> { using type = const typename Ours<T>::type; };
template <typename R, typename... A> struct Ours<R(A...)> {
  using type = typename Ours<R>::type (*)(typename Ours<A>::type...);
};
#define SL_MAP(real, ours) \
  template <> struct Ours<::real> { using type = o::ours; }
SL_MAP(cudnnContext, CudnnContext);
SL_MAP(cudnnTensorStruct, CudnnTensorStruct);
SL_MAP(cudnnFilterStruct, CudnnFilterStruct);
SL_MAP(cudnnConvolutionStruct, CudnnConvolutionStruct);
SL_MAP(cudnnPoolingStruct, CudnnPoolingStruct);
SL_MAP(cudnnRNNStruct, CudnnRNNStruct);
SL_MAP(cudnnRNNDataStruct, CudnnRNNDataStruct);
SL_MAP(cudnnDropoutStruct, CudnnDropoutStruct);
SL_MAP(cudnnStatus_t, cudnnStatus_t);
SL_MAP(cudnnDataType_t, cudnnDataType_t);
SL_MAP(cudnnTensorFormat_t, cudnnTensorFormat_t);
SL_MAP(cudnnMathType_t, cudnnMathType_t);
SL_MAP(cudnnNanPropagation_t, cudnnNanPropagation_t);
SL_MAP(cudnnConvolutionMode_t, cudnnConvolutionMode_t);
SL_MAP(cudnnConvolutionFwdAlgo_t, cudnnConvolutionFwdAlgo_t);
SL_MAP(cudnnConvolutionBwdDataAlgo_t, cudnnConvolutionBwdDataAlgo_t);
SL_MAP(cudnnConvolutionBwdFilterAlgo_t, cudnnConvolutionBwdFilterAlgo_t);
SL_MAP(cudnnPoolingMode_t, cudnnPoolingMode_t);
SL_MAP(cudnnBatchNormMode_t, cudnnBatchNormMode_t);
SL_MAP(cudnnRNNAlgo_t, cudnnRNNAlgo_t);
SL_MAP(cudnnForwardMode_t, cudnnForwardMode_t);
SL_MAP(cudnnRNNMode_t, cudnnRNNMode_t);
SL_MAP(cudnnRNNBiasMode_t, cudnnRNNBiasMode_t);
SL_MAP(cudnnDirectionMode_t, cudnnDirectionMode_t);
SL_MAP(cudnnRNNInputMode_t, cudnnRNNInputMode_t);
SL_MAP(cudnnRNNDataLayout_t, cudnnRNNDataLayout_t);
SL_MAP(cudnnWgradMode_t, cudnnWgradMode_t);
SL_MAP(cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgoPerf_t);
SL_MAP(cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgoPerf_t);
SL_MAP(cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgoPerf_t);
#undef SL_MAP

#define SL_SAME_TYPE(fn)                                                                                   \
  static_assert(std::is_same_v<Ours<decltype(::fn)>::type, decltype(o::CudnnApi::fn)>,                   \
                "cuda/cudnn.h: the declaration of " #fn " differs from cudnn.h")
SL_SAME_TYPE(cudnnGetVersion);
SL_SAME_TYPE(cudnnGetErrorString);
SL_SAME_TYPE(cudnnGetLastErrorString);
SL_SAME_TYPE(cudnnCreate);
SL_SAME_TYPE(cudnnDestroy);
SL_SAME_TYPE(cudnnSetStream);
SL_SAME_TYPE(cudnnCreateTensorDescriptor);
SL_SAME_TYPE(cudnnSetTensor4dDescriptorEx);
SL_SAME_TYPE(cudnnDestroyTensorDescriptor);
SL_SAME_TYPE(cudnnCreateFilterDescriptor);
SL_SAME_TYPE(cudnnSetFilter4dDescriptor);
SL_SAME_TYPE(cudnnDestroyFilterDescriptor);
SL_SAME_TYPE(cudnnCreateConvolutionDescriptor);
SL_SAME_TYPE(cudnnSetConvolution2dDescriptor);
SL_SAME_TYPE(cudnnSetConvolutionGroupCount);
SL_SAME_TYPE(cudnnSetConvolutionMathType);
SL_SAME_TYPE(cudnnDestroyConvolutionDescriptor);
SL_SAME_TYPE(cudnnCreatePoolingDescriptor);
SL_SAME_TYPE(cudnnSetPooling2dDescriptor);
SL_SAME_TYPE(cudnnDestroyPoolingDescriptor);
SL_SAME_TYPE(cudnnGetConvolutionForwardAlgorithm_v7);
SL_SAME_TYPE(cudnnGetConvolutionForwardWorkspaceSize);
SL_SAME_TYPE(cudnnConvolutionForward);
SL_SAME_TYPE(cudnnGetConvolutionBackwardDataAlgorithm_v7);
SL_SAME_TYPE(cudnnGetConvolutionBackwardDataWorkspaceSize);
SL_SAME_TYPE(cudnnConvolutionBackwardData);
SL_SAME_TYPE(cudnnGetConvolutionBackwardFilterAlgorithm_v7);
SL_SAME_TYPE(cudnnGetConvolutionBackwardFilterWorkspaceSize);
SL_SAME_TYPE(cudnnConvolutionBackwardFilter);
SL_SAME_TYPE(cudnnPoolingForward);
SL_SAME_TYPE(cudnnPoolingBackward);
SL_SAME_TYPE(cudnnBatchNormalizationForwardTraining);
SL_SAME_TYPE(cudnnBatchNormalizationForwardInference);
SL_SAME_TYPE(cudnnBatchNormalizationBackward);
SL_SAME_TYPE(cudnnSetTensorNdDescriptor);
SL_SAME_TYPE(cudnnGetTensorNdDescriptor);
SL_SAME_TYPE(cudnnCreateDropoutDescriptor);
SL_SAME_TYPE(cudnnDestroyDropoutDescriptor);
SL_SAME_TYPE(cudnnSetDropoutDescriptor);
SL_SAME_TYPE(cudnnCreateRNNDescriptor);
SL_SAME_TYPE(cudnnDestroyRNNDescriptor);
SL_SAME_TYPE(cudnnSetRNNDescriptor_v8);
SL_SAME_TYPE(cudnnGetRNNWeightSpaceSize);
SL_SAME_TYPE(cudnnGetRNNWeightParams);
SL_SAME_TYPE(cudnnGetRNNTempSpaceSizes);
SL_SAME_TYPE(cudnnCreateRNNDataDescriptor);
SL_SAME_TYPE(cudnnDestroyRNNDataDescriptor);
SL_SAME_TYPE(cudnnSetRNNDataDescriptor);
SL_SAME_TYPE(cudnnRNNForward);
SL_SAME_TYPE(cudnnRNNBackwardData_v8);
SL_SAME_TYPE(cudnnRNNBackwardWeights_v8);
#undef SL_SAME_TYPE

}  // namespace
