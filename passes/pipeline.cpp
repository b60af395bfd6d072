#include "passes/pass.h"

#include "compiler/ir/printer.h"
#include "compiler/ir/serialize.h"
#include "compiler/ir/verifier.h"

#include <nlohmann/json.hpp>

#include <ostream>

namespace jvpc {

Pipeline& Pipeline::add(std::unique_ptr<Pass> p) {
  passes_.push_back(std::move(p));
  return *this;
}

Pipeline& Pipeline::observe(PassObserver* o) {
  observers_.push_back(o);
  return *this;
}

std::vector<std::string> Pipeline::pass_names() const {
  std::vector<std::string> names;
  for (const auto& p : passes_) names.push_back(p->name());
  return names;
}

void Pipeline::run(Graph& g) {
  for (PassObserver* o : observers_) o->start(g);
  for (const auto& p : passes_) {
    bool changed = false;
    try {
      changed = p->run(g);
      verify(g);
    } catch (const std::exception& e) {
      throw Error("pass '" + p->name() + "': " + e.what());
    }
    for (PassObserver* o : observers_) o->after_pass(p->name(), g, changed);
  }
}

void IrDump::start(const Graph& g) {
  position_ = 0;
  dump(input_name_, g);
}

void IrDump::after_pass(const std::string& pass, const Graph& g, bool) {
  ++position_;
  dump(pass, g);
}

void IrDump::dump(const std::string& after, const Graph& g) {
  if (!passes_.count(after) && !passes_.count("all")) return;
  if (format_ == "json") {
    out_ << nlohmann::json{{"after", after}, {"position", position_}, {"graph", to_json(g)}}.dump() << "\n";
  } else {
    out_ << "// IR after " << (position_ ? "pass '" + after + "'" : after) << "\n" << to_text(g);
  }
}

}  // namespace jvpc
