// cuDNN, loaded at run time with dlopen, like cuBLAS (cuda/cublas.h) and for the same reasons: a CUDA build of
// singa_lite must compile without cuDNN's headers (they ship only in the large nvidia-cudnn wheel) and must import
// and run its CPU paths on machines without a GPU, a driver or cuDNN. The small subset of cuDNN 9's legacy API that
// singa_lite uses (convolution, pooling, batch normalisation, and the RNN API of cudnn_rnn.h; cudnn_graph.h,
// cudnn_ops.h, cudnn_cnn.h, cudnn_adv.h) is declared below with NVIDIA's numeric values. When CMake finds the real
// cudnn.h, cudnn_api_check.cpp compares every value, struct layout and function type below with it at compile time.
//
// cuDNN 9's libcudnn.so.9 is a small shim that still exports this legacy API and loads its sub-libraries
// (libcudnn_ops.so.9, libcudnn_cnn.so.9, ...) from its own folder. Status codes changed in cuDNN 9 (2000 = BAD_PARAM,
// ...), so only major version 9 is accepted. The library is looked for in, in order:
//   1. <dir>/libcudnn.so.9, where <dir> was given to set_cudnn_library_dir() (singa_lite passes the nvidia/cudnn/lib
//      or nvidia/cu13/lib folder of the installed nvidia-cudnn-cu13 / -cu12 wheel);
//   2. the plain soname libcudnn.so.9 (LD_LIBRARY_PATH, ld.so.cache, an already loaded copy).
// cuDNN is used only when it loads, a GPU is visible and it is not switched off (SINGA_LITE_CUDNN=0, read once, or
// set_cudnn_enabled(false)); otherwise the ops run on singa_lite's own kernels (im2col + cuBLAS, pooling kernels).
// Every cuDNN call is checked (SL_CUDNN); a failure raises CudaError. Nothing here aborts or exits.
#pragma once
#include <cuda_runtime.h>  // cudaStream_t

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "cuda/allocator.h"

namespace sl::cuda {

// ----- the subset of cuDNN 9 used by singa_lite (values as NVIDIA documents them)
struct CudnnContext;  // opaque types, never dereferenced
struct CudnnTensorStruct;
struct CudnnFilterStruct;
struct CudnnConvolutionStruct;
struct CudnnPoolingStruct;
using cudnnHandle_t = CudnnContext*;
using cudnnTensorDescriptor_t = CudnnTensorStruct*;
using cudnnFilterDescriptor_t = CudnnFilterStruct*;
using cudnnConvolutionDescriptor_t = CudnnConvolutionStruct*;
using cudnnPoolingDescriptor_t = CudnnPoolingStruct*;
struct CudnnRNNStruct;
struct CudnnRNNDataStruct;
struct CudnnDropoutStruct;
using cudnnRNNDescriptor_t = CudnnRNNStruct*;
using cudnnRNNDataDescriptor_t = CudnnRNNDataStruct*;
using cudnnDropoutDescriptor_t = CudnnDropoutStruct*;

enum cudnnStatus_t : int {  // cuDNN 9 numbering (cuDNN 8 used 0..15)
  CUDNN_STATUS_SUCCESS = 0,
  CUDNN_STATUS_NOT_INITIALIZED = 1001,
  CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH = 1002,
  CUDNN_STATUS_BAD_PARAM = 2000,
  CUDNN_STATUS_NOT_SUPPORTED = 3000,
  CUDNN_STATUS_INTERNAL_ERROR = 4000,
  CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4004,  // cuDNN's own cudaMalloc failed
  CUDNN_STATUS_EXECUTION_FAILED = 5000,
  CUDNN_STATUS_EXECUTION_FAILED_CUDART = 5003,  // a CUDA runtime call inside cuDNN failed (out of memory among others)
};
// The statuses after which a call is repeated once with the caching allocator's free blocks returned to the driver
// (allocator.h, retry_if_out_of_memory): cuDNN's own allocation failed, or a CUDA call inside it did (the execution
// category, which also covers loading a kernel's code on a full GPU). A failure with another cause fails again and
// is reported then.
inline bool cudnn_out_of_memory(cudnnStatus_t s) {
  return s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED || (int(s) >= 5000 && int(s) < 6000);
}
enum cudnnDataType_t : int { CUDNN_DATA_FLOAT = 0, CUDNN_DATA_DOUBLE = 1, CUDNN_DATA_HALF = 2 };
enum cudnnTensorFormat_t : int { CUDNN_TENSOR_NCHW = 0 };
enum cudnnMathType_t : int {
  CUDNN_DEFAULT_MATH = 0,    // may use TF32 for float32 on Ampere and later: used for float64 only
  CUDNN_TENSOR_OP_MATH = 1,  // tensor cores; float16 data with float32 accumulation
  CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,  // tensor cores on float32 data rounded down: never used
  CUDNN_FMA_MATH = 3,        // FMA kernels only: float32 keeps full FP32 precision, as cuBLAS does (cublas.h)
};
enum cudnnNanPropagation_t : int { CUDNN_NOT_PROPAGATE_NAN = 0, CUDNN_PROPAGATE_NAN = 1 };
enum cudnnDeterminism_t : int { CUDNN_NON_DETERMINISTIC = 0, CUDNN_DETERMINISTIC = 1 };
enum cudnnConvolutionMode_t : int { CUDNN_CONVOLUTION = 0, CUDNN_CROSS_CORRELATION = 1 };
enum cudnnConvolutionFwdAlgo_t : int { CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1 };
enum cudnnConvolutionBwdDataAlgo_t : int { CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1 };      // deterministic
enum cudnnConvolutionBwdFilterAlgo_t : int { CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1 };  // deterministic
enum cudnnPoolingMode_t : int {
  CUDNN_POOLING_MAX = 0,
  CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1,
  CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2,
  CUDNN_POOLING_MAX_DETERMINISTIC = 3,
};
enum cudnnBatchNormMode_t : int { CUDNN_BATCHNORM_SPATIAL = 1 };
// The RNN API (cudnn_adv.h), as cuda/cudnn_rnn.cpp uses it.
enum cudnnRNNAlgo_t : int { CUDNN_RNN_ALGO_STANDARD = 0 };
enum cudnnForwardMode_t : int { CUDNN_FWD_MODE_INFERENCE = 0, CUDNN_FWD_MODE_TRAINING = 1 };
enum cudnnRNNMode_t : int { CUDNN_RNN_RELU = 0, CUDNN_RNN_TANH = 1, CUDNN_LSTM = 2, CUDNN_GRU = 3 };
enum cudnnRNNBiasMode_t : int { CUDNN_RNN_DOUBLE_BIAS = 2 };  // an input and a recurrent bias per gate
enum cudnnDirectionMode_t : int { CUDNN_UNIDIRECTIONAL = 0, CUDNN_BIDIRECTIONAL = 1 };
enum cudnnRNNInputMode_t : int { CUDNN_LINEAR_INPUT = 0 };
enum cudnnRNNDataLayout_t : int {
  CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED = 0,    // (seq, batch, vector), padded
  CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED = 2,  // (batch, seq, vector), padded
};
enum cudnnWgradMode_t : int { CUDNN_WGRAD_MODE_ADD = 0 };
// cudnnSetRNNDescriptor_v8's auxFlags bit CUDNN_RNN_PADDED_IO_ENABLED (a macro in cudnn_adv.h, hence another name
// here): the unpacked layouts above need it.
constexpr uint32_t kCudnnRnnPaddedIoEnabled = 1u;

// What cudnnGetConvolution*Algorithm_v7 returns; the three structs share this layout.
template <typename Algo>
struct CudnnAlgoPerf {
  Algo algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t mathType;
  int reserved[3];
};
using cudnnConvolutionFwdAlgoPerf_t = CudnnAlgoPerf<cudnnConvolutionFwdAlgo_t>;
using cudnnConvolutionBwdDataAlgoPerf_t = CudnnAlgoPerf<cudnnConvolutionBwdDataAlgo_t>;
using cudnnConvolutionBwdFilterAlgoPerf_t = CudnnAlgoPerf<cudnnConvolutionBwdFilterAlgo_t>;

// Entry points, resolved with dlsym; all required.
struct CudnnApi {
  size_t (*cudnnGetVersion)();
  const char* (*cudnnGetErrorString)(cudnnStatus_t status);
  void (*cudnnGetLastErrorString)(char* message, size_t max_size);
  cudnnStatus_t (*cudnnCreate)(cudnnHandle_t* handle);
  cudnnStatus_t (*cudnnDestroy)(cudnnHandle_t handle);
  cudnnStatus_t (*cudnnSetStream)(cudnnHandle_t handle, cudaStream_t stream);

  cudnnStatus_t (*cudnnCreateTensorDescriptor)(cudnnTensorDescriptor_t* desc);
  cudnnStatus_t (*cudnnSetTensor4dDescriptorEx)(cudnnTensorDescriptor_t desc, cudnnDataType_t dataType, int n, int c,
                                                int h, int w, int nStride, int cStride, int hStride, int wStride);
  cudnnStatus_t (*cudnnDestroyTensorDescriptor)(cudnnTensorDescriptor_t desc);
  cudnnStatus_t (*cudnnCreateFilterDescriptor)(cudnnFilterDescriptor_t* desc);
  cudnnStatus_t (*cudnnSetFilter4dDescriptor)(cudnnFilterDescriptor_t desc, cudnnDataType_t dataType,
                                              cudnnTensorFormat_t format, int k, int c, int h, int w);
  cudnnStatus_t (*cudnnDestroyFilterDescriptor)(cudnnFilterDescriptor_t desc);
  cudnnStatus_t (*cudnnCreateConvolutionDescriptor)(cudnnConvolutionDescriptor_t* desc);
  cudnnStatus_t (*cudnnSetConvolution2dDescriptor)(cudnnConvolutionDescriptor_t desc, int pad_h, int pad_w, int u,
                                                   int v, int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                                   cudnnDataType_t computeType);
  cudnnStatus_t (*cudnnSetConvolutionGroupCount)(cudnnConvolutionDescriptor_t desc, int groupCount);
  cudnnStatus_t (*cudnnSetConvolutionMathType)(cudnnConvolutionDescriptor_t desc, cudnnMathType_t mathType);
  cudnnStatus_t (*cudnnDestroyConvolutionDescriptor)(cudnnConvolutionDescriptor_t desc);
  cudnnStatus_t (*cudnnCreatePoolingDescriptor)(cudnnPoolingDescriptor_t* desc);
  cudnnStatus_t (*cudnnSetPooling2dDescriptor)(cudnnPoolingDescriptor_t desc, cudnnPoolingMode_t mode,
                                               cudnnNanPropagation_t maxpoolingNanOpt, int windowHeight,
                                               int windowWidth, int verticalPadding, int horizontalPadding,
                                               int verticalStride, int horizontalStride);
  cudnnStatus_t (*cudnnDestroyPoolingDescriptor)(cudnnPoolingDescriptor_t desc);

  cudnnStatus_t (*cudnnGetConvolutionForwardAlgorithm_v7)(cudnnHandle_t handle, cudnnTensorDescriptor_t srcDesc,
                                                          cudnnFilterDescriptor_t filterDesc,
                                                          cudnnConvolutionDescriptor_t convDesc,
                                                          cudnnTensorDescriptor_t destDesc, int requestedAlgoCount,
                                                          int* returnedAlgoCount,
                                                          cudnnConvolutionFwdAlgoPerf_t* perfResults);
  cudnnStatus_t (*cudnnGetConvolutionForwardWorkspaceSize)(cudnnHandle_t handle, cudnnTensorDescriptor_t xDesc,
                                                           cudnnFilterDescriptor_t wDesc,
                                                           cudnnConvolutionDescriptor_t convDesc,
                                                           cudnnTensorDescriptor_t yDesc,
                                                           cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes);
  cudnnStatus_t (*cudnnConvolutionForward)(cudnnHandle_t handle, const void* alpha, cudnnTensorDescriptor_t xDesc,
                                           const void* x, cudnnFilterDescriptor_t wDesc, const void* w,
                                           cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                           void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                                           cudnnTensorDescriptor_t yDesc, void* y);
  cudnnStatus_t (*cudnnGetConvolutionBackwardDataAlgorithm_v7)(
      cudnnHandle_t handle, cudnnFilterDescriptor_t filterDesc, cudnnTensorDescriptor_t diffDesc,
      cudnnConvolutionDescriptor_t convDesc, cudnnTensorDescriptor_t gradDesc, int requestedAlgoCount,
      int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults);
  cudnnStatus_t (*cudnnGetConvolutionBackwardDataWorkspaceSize)(cudnnHandle_t handle, cudnnFilterDescriptor_t wDesc,
                                                                cudnnTensorDescriptor_t dyDesc,
                                                                cudnnConvolutionDescriptor_t convDesc,
                                                                cudnnTensorDescriptor_t dxDesc,
                                                                cudnnConvolutionBwdDataAlgo_t algo,
                                                                size_t* sizeInBytes);
  cudnnStatus_t (*cudnnConvolutionBackwardData)(cudnnHandle_t handle, const void* alpha, cudnnFilterDescriptor_t wDesc,
                                                const void* w, cudnnTensorDescriptor_t dyDesc, const void* dy,
                                                cudnnConvolutionDescriptor_t convDesc,
                                                cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                                size_t workSpaceSizeInBytes, const void* beta,
                                                cudnnTensorDescriptor_t dxDesc, void* dx);
  cudnnStatus_t (*cudnnGetConvolutionBackwardFilterAlgorithm_v7)(
      cudnnHandle_t handle, cudnnTensorDescriptor_t srcDesc, cudnnTensorDescriptor_t diffDesc,
      cudnnConvolutionDescriptor_t convDesc, cudnnFilterDescriptor_t gradDesc, int requestedAlgoCount,
      int* returnedAlgoCount, cudnnConvolutionBwdFilterAlgoPerf_t* perfResults);
  cudnnStatus_t (*cudnnGetConvolutionBackwardFilterWorkspaceSize)(cudnnHandle_t handle, cudnnTensorDescriptor_t xDesc,
                                                                  cudnnTensorDescriptor_t dyDesc,
                                                                  cudnnConvolutionDescriptor_t convDesc,
                                                                  cudnnFilterDescriptor_t gradDesc,
                                                                  cudnnConvolutionBwdFilterAlgo_t algo,
                                                                  size_t* sizeInBytes);
  cudnnStatus_t (*cudnnConvolutionBackwardFilter)(cudnnHandle_t handle, const void* alpha,
                                                  cudnnTensorDescriptor_t xDesc, const void* x,
                                                  cudnnTensorDescriptor_t dyDesc, const void* dy,
                                                  cudnnConvolutionDescriptor_t convDesc,
                                                  cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace,
                                                  size_t workSpaceSizeInBytes, const void* beta,
                                                  cudnnFilterDescriptor_t dwDesc, void* dw);

  cudnnStatus_t (*cudnnPoolingForward)(cudnnHandle_t handle, cudnnPoolingDescriptor_t poolingDesc, const void* alpha,
                                       cudnnTensorDescriptor_t xDesc, const void* x, const void* beta,
                                       cudnnTensorDescriptor_t yDesc, void* y);
  cudnnStatus_t (*cudnnPoolingBackward)(cudnnHandle_t handle, cudnnPoolingDescriptor_t poolingDesc, const void* alpha,
                                        cudnnTensorDescriptor_t yDesc, const void* y, cudnnTensorDescriptor_t dyDesc,
                                        const void* dy, cudnnTensorDescriptor_t xDesc, const void* x,
                                        const void* beta, cudnnTensorDescriptor_t dxDesc, void* dx);

  cudnnStatus_t (*cudnnBatchNormalizationForwardTraining)(
      cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
      cudnnTensorDescriptor_t xDesc, const void* x, cudnnTensorDescriptor_t yDesc, void* y,
      cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void* bnScale, const void* bnBias,
      double exponentialAverageFactor, void* resultRunningMean, void* resultRunningVariance, double epsilon,
      void* resultSaveMean, void* resultSaveInvVariance);
  cudnnStatus_t (*cudnnBatchNormalizationForwardInference)(
      cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
      cudnnTensorDescriptor_t xDesc, const void* x, cudnnTensorDescriptor_t yDesc, void* y,
      cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void* bnScale, const void* bnBias,
      const void* estimatedMean, const void* estimatedVariance, double epsilon);
  cudnnStatus_t (*cudnnBatchNormalizationBackward)(
      cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alphaDataDiff, const void* betaDataDiff,
      const void* alphaParamDiff, const void* betaParamDiff, cudnnTensorDescriptor_t xDesc, const void* x,
      cudnnTensorDescriptor_t dyDesc, const void* dy, cudnnTensorDescriptor_t dxDesc, void* dx,
      cudnnTensorDescriptor_t dBnScaleBiasDesc, const void* bnScale, void* dBnScaleResult, void* dBnBiasResult,
      double epsilon, const void* savedMean, const void* savedInvVariance);

  // ----- RNN (cudnn_adv.h) and what it needs of cudnn_ops.h: N-d tensor descriptors for the hidden states and the
  // weight matrices, a dropout descriptor (with dropout 0)
  cudnnStatus_t (*cudnnSetTensorNdDescriptor)(cudnnTensorDescriptor_t desc, cudnnDataType_t dataType, int nbDims,
                                              const int dimA[], const int strideA[]);
  cudnnStatus_t (*cudnnGetTensorNdDescriptor)(cudnnTensorDescriptor_t desc, int nbDimsRequested,
                                              cudnnDataType_t* dataType, int* nbDims, int dimA[], int strideA[]);
  cudnnStatus_t (*cudnnCreateDropoutDescriptor)(cudnnDropoutDescriptor_t* desc);
  cudnnStatus_t (*cudnnDestroyDropoutDescriptor)(cudnnDropoutDescriptor_t desc);
  cudnnStatus_t (*cudnnSetDropoutDescriptor)(cudnnDropoutDescriptor_t desc, cudnnHandle_t handle, float dropout,
                                             void* states, size_t stateSizeInBytes, unsigned long long seed);
  cudnnStatus_t (*cudnnCreateRNNDescriptor)(cudnnRNNDescriptor_t* desc);
  cudnnStatus_t (*cudnnDestroyRNNDescriptor)(cudnnRNNDescriptor_t desc);
  cudnnStatus_t (*cudnnSetRNNDescriptor_v8)(cudnnRNNDescriptor_t desc, cudnnRNNAlgo_t algo, cudnnRNNMode_t cellMode,
                                            cudnnRNNBiasMode_t biasMode, cudnnDirectionMode_t dirMode,
                                            cudnnRNNInputMode_t inputMode, cudnnDataType_t dataType,
                                            cudnnDataType_t mathPrec, cudnnMathType_t mathType, int32_t inputSize,
                                            int32_t hiddenSize, int32_t projSize, int32_t numLayers,
                                            cudnnDropoutDescriptor_t dropoutDesc, uint32_t auxFlags);
  cudnnStatus_t (*cudnnGetRNNWeightSpaceSize)(cudnnHandle_t handle, cudnnRNNDescriptor_t desc,
                                              size_t* weightSpaceSize);
  cudnnStatus_t (*cudnnGetRNNWeightParams)(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, int32_t pseudoLayer,
                                           size_t weightSpaceSize, const void* weightSpace, int32_t linLayerID,
                                           cudnnTensorDescriptor_t mDesc, void** mAddr, cudnnTensorDescriptor_t bDesc,
                                           void** bAddr);
  cudnnStatus_t (*cudnnGetRNNTempSpaceSizes)(cudnnHandle_t handle, cudnnRNNDescriptor_t desc,
                                             cudnnForwardMode_t fwdMode, cudnnRNNDataDescriptor_t xDesc,
                                             size_t* workSpaceSize, size_t* reserveSpaceSize);
  cudnnStatus_t (*cudnnCreateRNNDataDescriptor)(cudnnRNNDataDescriptor_t* desc);
  cudnnStatus_t (*cudnnDestroyRNNDataDescriptor)(cudnnRNNDataDescriptor_t desc);
  cudnnStatus_t (*cudnnSetRNNDataDescriptor)(cudnnRNNDataDescriptor_t desc, cudnnDataType_t dataType,
                                             cudnnRNNDataLayout_t layout, int maxSeqLength, int batchSize,
                                             int vectorSize, const int seqLengthArray[], void* paddingFill);
  cudnnStatus_t (*cudnnRNNForward)(cudnnHandle_t handle, cudnnRNNDescriptor_t desc, cudnnForwardMode_t fwdMode,
                                   const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t xDesc, const void* x,
                                   cudnnRNNDataDescriptor_t yDesc, void* y, cudnnTensorDescriptor_t hDesc,
                                   const void* hx, void* hy, cudnnTensorDescriptor_t cDesc, const void* cx, void* cy,
                                   size_t weightSpaceSize, const void* weightSpace, size_t workSpaceSize,
                                   void* workSpace, size_t reserveSpaceSize, void* reserveSpace);
  cudnnStatus_t (*cudnnRNNBackwardData_v8)(cudnnHandle_t handle, cudnnRNNDescriptor_t desc,
                                           const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t yDesc,
                                           const void* y, const void* dy, cudnnRNNDataDescriptor_t xDesc, void* dx,
                                           cudnnTensorDescriptor_t hDesc, const void* hx, const void* dhy, void* dhx,
                                           cudnnTensorDescriptor_t cDesc, const void* cx, const void* dcy, void* dcx,
                                           size_t weightSpaceSize, const void* weightSpace, size_t workSpaceSize,
                                           void* workSpace, size_t reserveSpaceSize, void* reserveSpace);
  cudnnStatus_t (*cudnnRNNBackwardWeights_v8)(cudnnHandle_t handle, cudnnRNNDescriptor_t desc,
                                              cudnnWgradMode_t addGrad, const int32_t devSeqLengths[],
                                              cudnnRNNDataDescriptor_t xDesc, const void* x,
                                              cudnnTensorDescriptor_t hDesc, const void* hx,
                                              cudnnRNNDataDescriptor_t yDesc, const void* y, size_t weightSpaceSize,
                                              void* dweightSpace, size_t workSpaceSize, void* workSpace,
                                              size_t reserveSpaceSize, void* reserveSpace);
};

// ----- loading and availability
// The folder holding libcudnn.so.9, tried before the plain soname; takes effect at the next load attempt.
void set_cudnn_library_dir(const std::string& dir);
// Loads cuDNN on first use (thread-safe) and returns its entry points; throws CudaError when it cannot.
const CudnnApi& cudnn_api();
// "" when the ops may use cuDNN now, else why not (switched off, no GPU, not found / unusable). Cheap once loaded.
std::string cudnn_unavailable_reason();
inline bool cudnn_available() { return cudnn_unavailable_reason().empty(); }
// Switches cuDNN off (the own kernels run) or back on; starts as SINGA_LITE_CUDNN says (anything but "0" is on).
void set_cudnn_enabled(bool enabled);
bool cudnn_enabled();
// For build info; never throw. cudnn_version(): cudnnGetVersion() (major * 10000 + minor * 100 + patch) or 0 when it
// cannot be loaded. cudnn_status(): "loaded <path>" or "not found: <why>" / "unusable: <why>" (attempts the load).
int cudnn_version();
std::string cudnn_status();

// The device's cuDNN handle: created on first use with the device current and bound to the device's compute stream
// (cuda/context.h), so cuDNN's kernels are ordered with ours and the caching allocator may reuse workspaces at once.
// Held exclusively while the returned lease lives: cuDNN forbids two threads using one handle at once, and the
// bindings release the GIL, so two Python threads may run cuDNN ops on one device together. Converts to the handle.
class CudnnHandle {
 public:
  CudnnHandle(cudnnHandle_t h, std::unique_lock<std::mutex> lock) : h_(h), lock_(std::move(lock)) {}
  operator cudnnHandle_t() const { return h_; }

 private:
  cudnnHandle_t h_;
  std::unique_lock<std::mutex> lock_;
};
CudnnHandle cudnn_handle(int device);

// Throws CudaError naming the call, the status (name, number, cudnnGetErrorString, cudnnGetLastErrorString's detail)
// and file:line.
void cudnn_check(cudnnStatus_t status, const char* call, const char* file, int line);
const char* cudnn_status_name(cudnnStatus_t status);

}  // namespace sl::cuda

// SL_CUDNN(cudnnXxx, args...): calls the loaded entry point and checks its status.
#define SL_CUDNN(fn, ...) \
  ::sl::cuda::cudnn_check(::sl::cuda::cudnn_api().fn(__VA_ARGS__), #fn, __FILE__, __LINE__)
// SL_CUDNN_ON(device, cudnnXxx, args...): the same for a call that only writes its output (beta = 0): when cuDNN's own
// allocation fails, the device's cached blocks go back to the driver and the call is made once more (allocator.h).
#define SL_CUDNN_ON(device, fn, ...)                                                                             \
  ::sl::cuda::cudnn_check(::sl::cuda::retry_if_out_of_memory(                                                    \
                              device, [&] { return ::sl::cuda::cudnn_api().fn(__VA_ARGS__); },                  \
                              ::sl::cuda::cudnn_out_of_memory),                                                  \
                          #fn, __FILE__, __LINE__)
