// The cuBLAS loader (see cublas.h): its entry points (cuda/runtime_library.h opens it on first use), per-device
// handles, checked statuses.
#include "cuda/cublas.h"

#include <cuda_runtime_api.h>  // CUDART_VERSION
#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "core/errors.h"
#include "cuda/context.h"
#include "cuda/runtime_library.h"

namespace sl::cuda {
namespace {

constexpr int kCudaMajor = CUDART_VERSION / 1000;

std::string soname() { return str("libcublas.so.", kCudaMajor); }
std::string lt_soname() { return str("libcublasLt.so.", kCudaMajor); }

std::string install_hint() {
  if (kCudaMajor == 13 || kCudaMajor == 12)
    return str("install it with: pip install nvidia-cublas", kCudaMajor == 12 ? "-cu12" : "",
               " (what the singa-lite-cuda", kCudaMajor, "x wheel and a clone's '.[cuda", kCudaMajor,
               "]' extra pull in), or put the lib folder of a CUDA ", kCudaMajor, ".x toolkit on LD_LIBRARY_PATH");
  return str("install cuBLAS for CUDA ", kCudaMajor, ".x and put its lib folder on LD_LIBRARY_PATH");
}

// The library and the entry points bound from it. bind() runs once, under the loader's lock; once loaded(),
// api and version never change.
class Cublas final : public RuntimeLibrary {
 public:
  Cublas() : RuntimeLibrary(soname(), "cublasCreate_v2") {}
  CublasApi api{};
  int version = 0;
  using RuntimeLibrary::loaded;

 private:
  // Fills api from an opened library; on a missing required symbol returns false and says which in *why.
  bool bind(void* lib, const std::string& path, std::string* why) override {
    CublasApi a{};
    const char* missing = nullptr;
    if (!resolve(lib, "cublasCreate_v2", a.cublasCreate_v2)) missing = "cublasCreate_v2";
    else if (!resolve(lib, "cublasDestroy_v2", a.cublasDestroy_v2)) missing = "cublasDestroy_v2";
    else if (!resolve(lib, "cublasSetStream_v2", a.cublasSetStream_v2)) missing = "cublasSetStream_v2";
    else if (!resolve(lib, "cublasGetVersion_v2", a.cublasGetVersion_v2)) missing = "cublasGetVersion_v2";
    else if (!resolve(lib, "cublasSgemmStridedBatched", a.cublasSgemmStridedBatched))
      missing = "cublasSgemmStridedBatched";
    else if (!resolve(lib, "cublasDgemmStridedBatched", a.cublasDgemmStridedBatched))
      missing = "cublasDgemmStridedBatched";
    else if (!resolve(lib, "cublasGemmStridedBatchedEx", a.cublasGemmStridedBatchedEx))
      missing = "cublasGemmStridedBatchedEx";
    if (missing) {
      *why = str(path, " has no ", missing, " (", dl_error(), ")");
      return false;
    }
    resolve(lib, "cublasSetMathMode", a.cublasSetMathMode);          // optional
    resolve(lib, "cublasGetStatusString", a.cublasGetStatusString);  // optional
    api = a;
    // The version query needs neither a GPU nor a handle (cuBLAS ignores the handle argument); should a
    // release insist on one, cublasGetProperty gives the same number.
    int v = 0;
    if (a.cublasGetVersion_v2(nullptr, &v) == CUBLAS_STATUS_SUCCESS && v > 0) {
      version = v;
    } else {
      cublasStatus_t (*get_property)(libraryPropertyType, int*) = nullptr;
      int major = 0, minor = 0, patch = 0;
      if (resolve(lib, "cublasGetProperty", get_property) && get_property(MAJOR_VERSION, &major) == 0 &&
          get_property(MINOR_VERSION, &minor) == 0 && get_property(PATCH_LEVEL, &patch) == 0)
        version = major * 10000 + minor * 100 + patch;
    }
    return true;
  }

  // libcublas needs libcublasLt of the same release; the wheel's copy carries $ORIGIN, but load it from the same
  // folder first so that no other libcublasLt on the search path is picked up instead.
  void before_open_in_dir(const std::string& dir) override {
    const std::string lt = dir + "/" + lt_soname();
    if (is_file(lt)) dlopen(lt.c_str(), RTLD_NOW | RTLD_LOCAL);  // a failure shows in the next dlopen
  }

  std::string describe_failure(bool opened_any, const std::vector<std::string>& tried) const override {
    std::string why;
    for (const auto& t : tried) why += (why.empty() ? "" : "; ") + t;
    if (opened_any)
      return str("unusable: GPU matmul needs cuBLAS ", kCudaMajor, ".x (", soname(), ") with the entry points ",
                 "singa_lite uses; ", install_hint(), ". Tried: ", why);
    return str("not found: GPU matmul needs cuBLAS (", soname(), "); ", install_hint(), ". Tried: ", why);
  }
};

Cublas& cublas() {
  static Cublas* l = new Cublas();  // never destroyed: used while tensors are freed at interpreter exit
  return *l;
}

struct Handles {
  std::mutex mutex;
  std::vector<cublasHandle_t> by_device;  // nullptr until first use
};

Handles& handles() {
  static Handles* h = new Handles();  // never destroyed, like the streams they are bound to
  return *h;
}

}  // namespace

void set_library_dir(const std::string& dir) { cublas().set_dir(dir); }

const CublasApi& cublas_api() {
  const std::string failure = cublas().ensure_loaded();
  if (!failure.empty()) throw CudaError(str("cuBLAS ", failure));
  return cublas().api;  // immutable once loaded
}

int cublas_version() {
  return cublas().ensure_loaded().empty() ? cublas().version : 0;
}

std::string cublas_status() {
  const std::string failure = cublas().ensure_loaded();
  return failure.empty() ? str("loaded ", cublas().path()) : failure;
}

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::string detail;
  const Cublas& l = cublas();
  if (l.loaded() && l.api.cublasGetStatusString) {  // api immutable once loaded
    const char* s = l.api.cublasGetStatusString(status);
    if (s && s[0]) detail = str(": ", s);
  }
  std::string hint;
  if (status == CUBLAS_STATUS_NOT_INITIALIZED)
    hint = " (no usable GPU or driver, or the driver is older than this cuBLAS needs)";
  else if (status == CUBLAS_STATUS_ARCH_MISMATCH)
    hint = " (this GPU's architecture is not supported by this cuBLAS or operation)";
  throw CudaError(str(call, " failed: ", cublas_status_name(status), " (", int(status), ")", detail, hint, " (",
                      file, ":", line, ")"));
}

cublasHandle_t cublas_handle(int device) {
  SL_ASSERT(device >= 0);
  const CublasApi& api = cublas_api();  // throws first when cuBLAS cannot be loaded
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  if (int(h.by_device.size()) <= device) h.by_device.resize(size_t(device) + 1, nullptr);
  if (h.by_device[size_t(device)]) return h.by_device[size_t(device)];
  cudaStream_t st = stream(device);  // the device's compute stream (created on first use)
  DeviceGuard guard(device);
  cublasHandle_t handle = nullptr;
  // Creating a handle allocates device memory, which the cache may be holding: one more try with it emptied.
  cublas_check(retry_if_out_of_memory(device, [&] { return api.cublasCreate_v2(&handle); },
                                      [](cublasStatus_t s) { return s != CUBLAS_STATUS_SUCCESS; }),
               "cublasCreate_v2", __FILE__, __LINE__);
  try {
    cublas_check(api.cublasSetStream_v2(handle, st), "cublasSetStream_v2", __FILE__, __LINE__);
    // Full-precision math: no TF32 for float32; float16 reductions stay in float32.
    if (api.cublasSetMathMode)
      cublas_check(api.cublasSetMathMode(
                       handle, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                   "cublasSetMathMode", __FILE__, __LINE__);
  } catch (...) {
    api.cublasDestroy_v2(handle);
    throw;
  }
  h.by_device[size_t(device)] = handle;
  return handle;
}

}  // namespace sl::cuda
