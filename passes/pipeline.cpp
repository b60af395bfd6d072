#include "passes/pass.h"

#include "ir/ops.h"
#include "ir/printer.h"
#include "ir/io/graph_json.h"
#include "ir/io/json_text.h"
#include "ir/verifier.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
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

std::unique_ptr<Pass> make_pass(std::string name, std::function<bool(Graph&)> fn) {
  struct FnPass : Pass {
    std::string n;
    std::function<bool(Graph&)> f;
    std::string name() const override { return n; }
    bool run(Graph& g) override { return f(g); }
  };
  auto p = std::make_unique<FnPass>();
  p->n = std::move(name);
  p->f = std::move(fn);
  return p;
}

bool verify_each_by_default() {
  const char* env = std::getenv("JVPC_VERIFY_EACH");
  return env && std::string(env) == "1";
}

bool Pipeline::run(Graph& g) {
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  timings_.clear();
  // verify_each: every node's shapes inferred after every pass. Otherwise a node's shapes are
  // inferred again only when its op, arguments, operands' or its own metadata changed.
  ShapeChecks checked;
  VerifyOptions between;
  if (!verify_each_) between.shape_checks = &checked;
  if (input_verified_ && !verify_each_) {
    checked.trust(g);
  } else {
    try {
      verify(g, between);
    } catch (const std::exception& e) {
      throw Error("the pipeline's input does not verify: " + one_line(e));
    }
  }
  for (PassObserver* o : observers_) o->start(g);
  bool any = false;
  std::string last;
  for (const auto& p : passes_) {
    const std::string name = p->name();
    for (PassObserver* o : observers_) o->before_pass(name, g);
    PassTime t{name};
    auto fail = [&](const std::string& msg) {
      for (PassObserver* o : observers_) o->on_failure(name, g, msg);
      throw Error(msg);
    };
    bool changed = false;
    auto t0 = clock::now();
    try {
      changed = p->run(g);
    } catch (const std::exception& e) {
      fail("pass '" + name + "': " + one_line(e));
    }
    auto t1 = clock::now();
    if (verify_each_) {
      try {
        verify(g, between);
      } catch (const std::exception& e) {
        fail("after pass '" + name + "', the graph does not verify: " + one_line(e));
      }
    }
    t.run_ms = ms(t1 - t0);
    t.verify_ms = ms(clock::now() - t1);
    timings_.push_back(t);
    any |= changed;
    last = name;
    for (PassObserver* o : observers_) o->after_pass(name, g, changed);
  }
  // Without verify_each, the output once: a graph that does not verify is reported here, with
  // the way to find the pass that broke it.
  if (any && !verify_each_) {
    auto t0 = clock::now();
    checked.stop_recording();
    try {
      verify(g, between);
    } catch (const std::exception& e) {
      const std::string msg = "after the passes (the last: '" + last + "'), the graph does not verify: " + one_line(e) +
                              " (JVPC_VERIFY_EACH=1 or --verify-each names the pass that broke it)";
      for (PassObserver* o : observers_) o->on_failure(last, g, msg);
      throw Error(msg);
    }
    timings_.back().verify_ms += ms(clock::now() - t0);
  }
  return any;
}

void print_timings(const std::vector<PassTime>& timings, std::ostream& os) {
  double run = 0, check = 0;
  char line[128];
  std::snprintf(line, sizeof line, "%-20s %10s %10s\n", "pass", "ms", "verify ms");
  os << line;
  for (const PassTime& t : timings) {
    std::snprintf(line, sizeof line, "%-20s %10.3f %10.3f\n", t.pass.c_str(), t.run_ms, t.verify_ms);
    os << line;
    run += t.run_ms;
    check += t.verify_ms;
  }
  std::snprintf(line, sizeof line, "%-20s %10.3f %10.3f\n", "total", run, check);
  os << line;
}

void IrDump::start(const Graph& g) {
  position_ = 0;
  dump(input_name_, g);
}

void IrDump::after_pass(const std::string& pass, const Graph& g, bool) {
  ++position_;
  dump(pass, g);
}

void IrDump::on_failure(const std::string& pass, const Graph& g, const std::string&) {
  ++position_;
  dump(pass, g, /*failed=*/true);
}

void IrDump::dump(const std::string& after, const Graph& g, bool failed) {
  if (!passes_.count(after) && !passes_.count("all")) return;
  if (format_ == "json") {
    nlohmann::json j{{"after", after}, {"position", position_}};
    if (failed) j["failed"] = true;
    try {
      j["graph"] = to_json(g);
    } catch (const std::exception& e) {  // a broken graph may not serialize
      j["graph"] = nullptr;
      j["error"] = one_line(e);
    }
    out_ << j.dump() << "\n";
  } else {
    out_ << "// IR after " << (failed ? "failed " : "") << (position_ ? "pass '" + after + "'" : after) << "\n";
    try {
      out_ << to_text(g);
    } catch (const std::exception& e) {
      out_ << "// (cannot print: " << one_line(e) << ")\n";
    }
  }
}

}  // namespace jvpc
