// Loading NCCL and the library functions of nccl.h (set_library_dir, available, unavailable_reason, version,
// get_unique_id). libnccl is opened at run time with dlopen, never linked (see nccl.h for why and where it is
// looked for); its functions are resolved with dlsym into the Api table of nccl_api.h, which the
// communicator (nccl.cpp) reaches through api().
#include "comm/nccl_api.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "core/errors.h"
#include "comm/nccl.h"

namespace sl::cuda::nccl {
namespace detail {
namespace {

// ---------------------------------------------------------------- loading
const char* install_hint() {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 13000
  return "install it with: pip install 'singa_lite[cuda13]' (the nvidia-nccl-cu13 wheel), or put libnccl.so.2 "
         "on LD_LIBRARY_PATH";
#else
  return "install it with: pip install 'singa_lite[cuda12]' (the nvidia-nccl-cu12 wheel), or put libnccl.so.2 "
         "on LD_LIBRARY_PATH";
#endif
}

struct Library {
  std::mutex mutex;
  std::string dir;     // from set_library_dir
  void* handle = nullptr;
  Api api{};
  int version = 0;
  std::string reason;  // why the last load attempt failed
};

Library& library() {
  static Library* lib = new Library();  // never destroyed: communicators may be closed during exit
  return *lib;
}

template <typename F>
bool resolve(void* handle, const char* name, F& fn, bool required, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (fn == nullptr && required) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

// Fills lib.api from an opened library; "" when everything needed is there, else what is missing.
std::string bind_symbols(Library& lib, void* h) {
  Api& a = lib.api;
  std::string missing;
  resolve(h, "ncclGetVersion", a.GetVersion, true, missing);
  resolve(h, "ncclGetUniqueId", a.GetUniqueId, true, missing);
  resolve(h, "ncclCommInitRankConfig", a.CommInitRankConfig, true, missing);
  resolve(h, "ncclCommFinalize", a.CommFinalize, true, missing);
  resolve(h, "ncclCommDestroy", a.CommDestroy, true, missing);
  resolve(h, "ncclCommAbort", a.CommAbort, true, missing);
  resolve(h, "ncclCommGetAsyncError", a.CommGetAsyncError, true, missing);
  resolve(h, "ncclGetErrorString", a.GetErrorString, true, missing);
  resolve(h, "ncclGetLastError", a.GetLastError, false, missing);
  resolve(h, "ncclAllReduce", a.AllReduce, true, missing);
  resolve(h, "ncclBroadcast", a.Broadcast, true, missing);
  resolve(h, "ncclReduce", a.Reduce, true, missing);
  resolve(h, "ncclAllGather", a.AllGather, true, missing);
  resolve(h, "ncclReduceScatter", a.ReduceScatter, true, missing);
  resolve(h, "ncclSend", a.Send, true, missing);
  resolve(h, "ncclRecv", a.Recv, true, missing);
  resolve(h, "ncclGroupStart", a.GroupStart, true, missing);
  resolve(h, "ncclGroupEnd", a.GroupEnd, true, missing);
  return missing;
}

std::string version_str(int v) { return str(v / 10000, ".", v / 100 % 100, ".", v % 100); }

// Opens NCCL once (lib.mutex held); later attempts retry only while it is not loaded (a directory may
// have been set since).
bool load(Library& lib) {
  if (lib.handle != nullptr) return true;
  std::vector<std::string> candidates;
  if (!lib.dir.empty()) candidates.push_back(lib.dir + "/libnccl.so.2");
  candidates.push_back("libnccl.so.2");
  std::string tried;
  for (const std::string& path : candidates) {
    // RTLD_LOCAL: NCCL's symbols stay out of the global namespace (another copy, e.g. PyTorch's, may be loaded).
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* err = dlerror();  // names the path itself
      tried += str("\n  ", err ? std::string(err) : path + ": not found");
      continue;
    }
    std::string missing = bind_symbols(lib, h);
    int v = 0;
    if (missing.empty() && lib.api.GetVersion(&v) != ncclSuccess) missing = "a working ncclGetVersion";
    if (!missing.empty() || v < kMinVersion) {
      tried += str("\n  ", path, ": ", !missing.empty() ? "lacks " + missing : "NCCL " + version_str(v),
                   " (singa_lite needs NCCL ", version_str(kMinVersion), " or newer)");
      lib.api = Api{};
      dlclose(h);
      continue;
    }
    lib.handle = h;
    lib.version = v;
    lib.reason.clear();
    return true;
  }
  lib.reason = str("NCCL could not be loaded; ", install_hint(), ". Tried:", tried);
  return false;
}

// Why there is certainly no usable GPU, or "" when there may be one; decided WITHOUT initialising CUDA.
// NcclIdHolder asks in the parent of multiprocessing workers, and a process that has initialised CUDA
// cannot fork children that use it ("initialization error" in every child): so no CUDA call here, only
// the environment and the driver's device files. Unsure means "" (the ranks then report precisely).
std::string no_gpu_reason() {
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    const std::string visible(v);
    if (visible.empty() || visible.rfind("-1", 0) == 0)
      return str("CUDA_VISIBLE_DEVICES='", visible, "' hides every GPU");
  }
  struct stat st;
  for (const char* path : {"/dev/nvidia0", "/dev/dxg", "/proc/driver/nvidia/gpus"})  // dxg: WSL 2
    if (stat(path, &st) == 0) return "";
  for (int i = 1; i < 64; ++i)  // a container may expose only some GPUs, e.g. /dev/nvidia3
    if (stat(str("/dev/nvidia", i).c_str(), &st) == 0) return "";
  return "no NVIDIA GPU or driver is visible (no /dev/nvidia* device)";
}

}  // namespace

// The loaded API; throws CommError saying how to install NCCL when it cannot be loaded.
const Api& api() {
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  if (!load(lib)) throw CommError(str("the nccl backend needs the NCCL library: ", lib.reason));
  return lib.api;
}

const char* error_string(ncclResult_t r) {
  const char* s = api().GetErrorString ? api().GetErrorString(r) : nullptr;
  return s ? s : "unknown NCCL error";
}

}  // namespace detail

using namespace detail;

// ---------------------------------------------------------------- the library, public
void set_library_dir(const std::string& dir) {
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  lib.dir = dir;
}

bool available() {
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  return load(lib);
}

std::string unavailable_reason() {
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  return load(lib) ? std::string() : lib.reason;
}

int version() {
  api();
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  return lib.version;
}

std::string get_unique_id() {
  const Api& a = api();
  // NCCL itself hands out an id without a GPU; refuse here when there clearly is none, so that a CPU-only
  // job never starts NCCL's bootstrap listener (NcclIdHolder calls this in every parent process).
  const std::string no_gpu = no_gpu_reason();
  if (!no_gpu.empty()) throw CudaError(str("NCCL needs a GPU: ", no_gpu));
  ncclUniqueId id;
  ncclResult_t r = a.GetUniqueId(&id);
  if (r != ncclSuccess) throw CommError(str("ncclGetUniqueId failed: ", error_string(r), " (NCCL_DEBUG=WARN shows why; "
                                            "NCCL_SOCKET_IFNAME picks the network interface)"));
  return std::string(id.internal, sizeof(id.internal));
}

}  // namespace sl::cuda::nccl
