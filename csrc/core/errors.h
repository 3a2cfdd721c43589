// Typed errors. Every check on user input throws one of these; the bindings turn them into the
// matching Python exception (ValueError, TypeError, IndexError, MemoryError, singa_lite.CudaError,
// singa_lite.CommError, ...).
// Library code never aborts or exits: an internal invariant that fails is an InternalError, not a crash.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace sl {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ValueError : Error { using Error::Error; };
struct TypeError : Error { using Error::Error; };
struct IndexError : Error { using Error::Error; };
struct OutOfMemory : Error { using Error::Error; };
struct CudaError : Error { using Error::Error; };
// A communicator failed: a peer died, left or timed out, the job was aborted, or the communicator is closed.
struct CommError : Error { using Error::Error; };
struct InternalError : Error { using Error::Error; };

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append(os, rest...);
}
}  // namespace detail

// Concatenates its arguments with operator<< into one message.
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

}  // namespace sl

// SL_CHECK(cond, ErrorType, message parts...): a check on user input.
#define SL_CHECK(cond, Kind, ...)                         \
  do {                                                    \
    if (!(cond)) throw ::sl::Kind(::sl::str(__VA_ARGS__)); \
  } while (0)

// SL_ASSERT(cond): an internal invariant; failing it is our bug, reported without killing the process.
#define SL_ASSERT(cond)                                                                         \
  do {                                                                                          \
    if (!(cond))                                                                                \
      throw ::sl::InternalError(::sl::str("internal error: ", #cond, " at ", __FILE__, ":", __LINE__, \
                                          " (please report)"));                                 \
  } while (0)
