#include "core/generator.h"

#include "core/errors.h"

#include <map>
#include <mutex>

namespace sl {
namespace {

struct GeneratorState {
  uint64_t seed = kDefaultSeed;
  uint64_t offset = 0;
};

std::mutex g_mutex;
std::map<std::pair<int, int>, GeneratorState>& states() {
  static std::map<std::pair<int, int>, GeneratorState> s;
  return s;
}

GeneratorState& state_of(Device d) { return states()[{int(d.kind), d.index}]; }

}  // namespace

std::pair<uint64_t, uint64_t> reserve_counters(Device device, uint64_t counters) {
  std::lock_guard<std::mutex> lock(g_mutex);
  GeneratorState& s = state_of(device);
  uint64_t start = s.offset;
  s.offset += counters;
  return {s.seed, start};
}

void manual_seed(Device device, uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_mutex);
  GeneratorState& s = state_of(device);
  s.seed = seed;
  s.offset = 0;
}

uint64_t current_seed(Device device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_of(device).seed;
}

std::pair<uint64_t, uint64_t> generator_state(Device device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const GeneratorState& s = state_of(device);
  return {s.seed, s.offset};
}

void set_generator_state(Device device, uint64_t seed, uint64_t counter) {
  // A state restored onto a GPU this machine lacks would never be used: say so rather than keep it.
  if (device.is_cuda()) {
    int n = cuda_device_count();
    SL_CHECK(device.index >= 0 && device.index < n, ValueError, "set_generator_state: ", device.str(),
             " does not exist here (", n, " GPU(s) visible); restore each generator on its own device");
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  GeneratorState& s = state_of(device);
  s.seed = seed;
  s.offset = counter;
}

}  // namespace sl
