// Loading NCCL and the library functions of nccl.h (set_library_dir, available, unavailable_reason, version,
// get_unique_id). libnccl is opened at run time with dlopen (cuda/runtime_library.h), never linked (see nccl.h for
// why and where it is looked for); its functions are resolved with dlsym into the Api table of nccl_api.h, which
// the communicator (nccl.cpp) reaches through api().
#include "comm/nccl_api.h"

#include <string>
#include <vector>

#include "core/device.h"
#include "core/errors.h"
#include "comm/nccl.h"
#include "cuda/runtime_library.h"

namespace sl::cuda::nccl {
namespace detail {
namespace {

// ---------------------------------------------------------------- loading
const char* install_hint() {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 13000
  return "install it with: pip install nvidia-nccl-cu13 (what the singa-lite-cuda13x wheel and a clone's "
         "'.[cuda13]' extra pull in), or put libnccl.so.2 on LD_LIBRARY_PATH";
#else
  return "install it with: pip install nvidia-nccl-cu12 (what the singa-lite-cuda12x wheel and a clone's "
         "'.[cuda12]' extra pull in), or put libnccl.so.2 on LD_LIBRARY_PATH";
#endif
}

std::string version_str(int v) { return str(v / 10000, ".", v / 100 % 100, ".", v % 100); }

// The library and the entry points bound from it. bind() runs once, under the loader's lock; once loaded(),
// api and version never change.
class Nccl final : public RuntimeLibrary {
 public:
  Nccl() : RuntimeLibrary("libnccl.so.2", nullptr) {}  // nullptr: messages name the file as given to dlopen
  Api api{};
  int version = 0;

 private:
  bool bind(void* h, const std::string& path, std::string* why) override {
    Api a{};
    std::string missing;
    auto need = [&](const char* name, auto& fn) {
      if (!resolve(h, name, fn)) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    need("ncclGetVersion", a.GetVersion);
    need("ncclGetUniqueId", a.GetUniqueId);
    need("ncclCommInitRankConfig", a.CommInitRankConfig);
    need("ncclCommFinalize", a.CommFinalize);
    need("ncclCommDestroy", a.CommDestroy);
    need("ncclCommAbort", a.CommAbort);
    need("ncclCommGetAsyncError", a.CommGetAsyncError);
    need("ncclGetErrorString", a.GetErrorString);
    resolve(h, "ncclGetLastError", a.GetLastError);  // optional
    need("ncclAllReduce", a.AllReduce);
    need("ncclBroadcast", a.Broadcast);
    need("ncclReduce", a.Reduce);
    need("ncclAllGather", a.AllGather);
    need("ncclReduceScatter", a.ReduceScatter);
    need("ncclSend", a.Send);
    need("ncclRecv", a.Recv);
    need("ncclGroupStart", a.GroupStart);
    need("ncclGroupEnd", a.GroupEnd);
    int v = 0;
    if (missing.empty() && a.GetVersion(&v) != ncclSuccess) missing = "a working ncclGetVersion";
    if (!missing.empty() || v < kMinVersion) {
      *why = str(path, ": ", !missing.empty() ? "lacks " + missing : "NCCL " + version_str(v),
                 " (singa_lite needs NCCL ", version_str(kMinVersion), " or newer)");
      return false;
    }
    api = a;
    version = v;
    return true;
  }

  std::string describe_failure(bool, const std::vector<std::string>& tried) const override {
    std::string lines;
    for (const auto& t : tried) lines += str("\n  ", t);
    return str("NCCL could not be loaded; ", install_hint(), ". Tried:", lines);
  }
};

Nccl& nccl() {
  static Nccl* lib = new Nccl();  // never destroyed: communicators may be closed during exit
  return *lib;
}

}  // namespace

// The loaded API; throws CommError saying how to install NCCL when it cannot be loaded.
const Api& api() {
  const std::string failure = nccl().ensure_loaded();
  if (!failure.empty()) throw CommError(str("the nccl backend needs the NCCL library: ", failure));
  return nccl().api;  // immutable once loaded
}

const char* error_string(ncclResult_t r) {
  const char* s = api().GetErrorString ? api().GetErrorString(r) : nullptr;
  return s ? s : "unknown NCCL error";
}

}  // namespace detail

using namespace detail;

// ---------------------------------------------------------------- the library, public
void set_library_dir(const std::string& dir) { nccl().set_dir(dir); }

bool available() { return nccl().ensure_loaded().empty(); }

std::string unavailable_reason() { return nccl().ensure_loaded(); }

int version() {
  api();  // throws when NCCL cannot be loaded
  return nccl().version;
}

std::string get_unique_id() {
  const Api& a = api();
  // NCCL itself hands out an id without a GPU; refuse here when there clearly is none, so that a CPU-only
  // job never starts NCCL's bootstrap listener (NcclIdHolder calls this in every parent process).
  // cuda_absent_reason() does not initialise CUDA: NcclIdHolder asks in the parent of forked ranks.
  const std::string no_gpu = cuda_absent_reason();
  if (!no_gpu.empty()) throw CudaError(str("NCCL needs a GPU: ", no_gpu));
  ncclUniqueId id;
  ncclResult_t r = a.GetUniqueId(&id);
  if (r != ncclSuccess) throw CommError(str("ncclGetUniqueId failed: ", error_string(r), " (NCCL_DEBUG=WARN shows why; "
                                            "NCCL_SOCKET_IFNAME picks the network interface)"));
  return std::string(id.internal, sizeof(id.internal));
}

}  // namespace sl::cuda::nccl
