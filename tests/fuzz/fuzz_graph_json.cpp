// libFuzzer target for the JSON graph loader: every input becomes a verified graph or a
// jvpc::Error. Anything else (a crash, a sanitizer report, another exception type, an abort)
// is a bug. Seed corpus: the examples' JSON and tests/fuzz/seeds/ (scripts/sanitize.sh writes it).
#include "ir/io/limits.h"
#include "ir/io/graph_json.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto g = jvpc::parse_graph(std::string(reinterpret_cast<const char*>(data), size));
    (void)jvpc::to_json(*g).dump();  // whatever loads must also print
    (void)jvpc::memory_needed(*g);   // and be counted against the memory limit
  } catch (const jvpc::Error&) {}
  return 0;
}
