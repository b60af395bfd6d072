// A small FileCheck (LLVM's, as TorchScript's and MLIR's pass tests use it) for checks on IR
// text:
//
//   EXPECT_TRUE(test::filecheck(to_text(g), R"(
//     CHECK:      [[T:%[0-9]+]] : f32[4] = aten::mul.Tensor(%0, %1)
//     CHECK-NOT:  aten::exp
//     CHECK-NEXT: return ([[T]] out0)
//   )"));
//
// Each non-blank line of `checks` is one directive:
//  - CHECK: the pattern occurs at or after where the last match ended (CHECK-LABEL: the same,
//    to name the start of a graph in a file of several);
//  - CHECK-NEXT: it occurs on the line after the last match;
//  - CHECK-SAME: it occurs on the line of the last match, after it;
//  - CHECK-NOT: it does not occur between the last match and the next positive match (or the
//    end of the text).
// A pattern is literal text, except {{regex}} (an ECMAScript regex) and [[NAME:regex]], which
// matches the regex and remembers the text as NAME, which a later [[NAME]] must match exactly.
// A pattern matches within one line. A failure says which directive failed and shows the text
// with line numbers.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace jvpc::test {

namespace filecheck_detail {

inline std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

inline std::string escape(const std::string& s) {
  static const std::string special = R"(\^$.|?*+()[]{})";
  std::string out;
  for (char c : s) {
    if (special.find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

// The pattern as a regex, with [[NAME]] replaced by what NAME matched; `defines` receives the
// names that [[NAME:re]] defines, in the order of their groups.
inline std::regex compile(const std::string& pattern, const std::map<std::string, std::string>& vars,
                          std::vector<std::string>& defines, std::string& error) {
  std::string re;
  size_t i = 0;
  while (i < pattern.size()) {
    if (pattern.compare(i, 2, "{{") == 0) {
      size_t e = pattern.find("}}", i + 2);
      if (e == std::string::npos) {
        error = "unclosed {{";
        return {};
      }
      re += "(?:" + pattern.substr(i + 2, e - i - 2) + ")";
      i = e + 2;
    } else if (pattern.compare(i, 2, "[[") == 0) {
      size_t e = pattern.find("]]", i + 2);
      if (e == std::string::npos) {
        error = "unclosed [[";
        return {};
      }
      std::string body = pattern.substr(i + 2, e - i - 2);
      size_t colon = body.find(':');
      if (colon == std::string::npos) {
        auto it = vars.find(body);
        if (it == vars.end()) {
          error = "[[" + body + "]] is used before it is defined";
          return {};
        }
        re += escape(it->second);
      } else {
        defines.push_back(body.substr(0, colon));
        re += "(" + body.substr(colon + 1) + ")";
      }
      i = e + 2;
    } else {
      re += escape(std::string(1, pattern[i]));
      ++i;
    }
  }
  try {
    return std::regex(re, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    error = std::string("bad regex: ") + e.what();
    return {};
  }
}

inline std::string numbered(const std::vector<std::string>& lines) {
  std::ostringstream os;
  for (size_t i = 0; i < lines.size(); ++i) os << (i + 1 < 10 ? "  " : " ") << i + 1 << "| " << lines[i] << "\n";
  return os.str();
}

}  // namespace filecheck_detail

/// Checks `text` against the directives in `checks` (see the top of this file).
inline ::testing::AssertionResult filecheck(const std::string& text, const std::string& checks) {
  using namespace filecheck_detail;
  std::vector<std::string> lines;
  {
    std::istringstream is(text);
    for (std::string l; std::getline(is, l);) lines.push_back(l);
  }
  struct Directive {
    std::string kind, pattern, source;
  };
  std::vector<Directive> ds;
  {
    std::istringstream is(checks);
    for (std::string l; std::getline(is, l);) {
      std::string t = trim(l);
      if (t.empty()) continue;
      size_t colon = t.find(':');
      std::string kind = colon == std::string::npos ? "" : t.substr(0, colon);
      if (kind == "CHECK-LABEL") kind = "CHECK";
      if (kind != "CHECK" && kind != "CHECK-NEXT" && kind != "CHECK-SAME" && kind != "CHECK-NOT")
        return ::testing::AssertionFailure() << "filecheck: not a directive: '" << t << "'";
      ds.push_back({kind, trim(t.substr(colon + 1)), t});
    }
  }
  if (ds.empty()) return ::testing::AssertionFailure() << "filecheck: no directives";

  std::map<std::string, std::string> vars;
  size_t line = 0, col = 0;            // where the last match ended
  bool matched_any = false;            // CHECK-NEXT and CHECK-SAME need an earlier match
  std::vector<const Directive*> nots;  // CHECK-NOTs waiting for the next positive match
  size_t not_line = 0, not_col = 0;    // where their range starts
  auto failure = [&](const Directive& d, const std::string& why) {
    return ::testing::AssertionFailure() << "filecheck: '" << d.source << "' " << why << "\n" << numbered(lines);
  };
  // The first match of `re` on line `l` from column `c`: {start, end, groups}.
  auto search = [&](const std::regex& re, size_t l, size_t c) -> std::optional<std::smatch> {
    if (l >= lines.size() || c > lines[l].size()) return std::nullopt;
    std::smatch m;
    if (!std::regex_search(lines[l].cbegin() + static_cast<std::ptrdiff_t>(c), lines[l].cend(), m, re))
      return std::nullopt;
    return m;
  };
  // CHECK-NOTs pending: none may match from (not_line, not_col) up to (l, c).
  auto check_nots = [&](size_t l, size_t c) -> std::optional<::testing::AssertionResult> {
    for (const Directive* d : nots) {
      std::vector<std::string> defs;
      std::string err;
      std::regex re = compile(d->pattern, vars, defs, err);
      if (!err.empty()) return failure(*d, err);
      for (size_t i = not_line; i <= l && i < lines.size(); ++i) {
        size_t from = i == not_line ? not_col : 0;
        auto m = search(re, i, from);
        if (!m) continue;
        size_t start = from + static_cast<size_t>(m->position(0));
        if (i < l || start + static_cast<size_t>(m->length(0)) <= c)
          return failure(*d, "matches line " + std::to_string(i + 1) + ": '" + lines[i] + "'");
      }
    }
    nots.clear();
    return std::nullopt;
  };

  for (const Directive& d : ds) {
    if (d.kind == "CHECK-NOT") {
      if (nots.empty()) {
        not_line = line;
        not_col = col;
      }
      nots.push_back(&d);
      continue;
    }
    std::vector<std::string> defs;
    std::string err;
    std::regex re = compile(d.pattern, vars, defs, err);
    if (!err.empty()) return failure(d, err);
    std::optional<std::smatch> m;
    size_t at_line = line, at_col = col;
    if (d.kind == "CHECK") {
      for (size_t l = line; l < lines.size() && !m; ++l) {
        m = search(re, l, l == line ? col : 0);
        at_line = l;
        at_col = l == line ? col : 0;
      }
      if (!m) return failure(d, "has no match after line " + std::to_string(line + 1));
    } else if (!matched_any) {
      return failure(d, "has no earlier match to follow");
    } else if (d.kind == "CHECK-NEXT") {
      at_line = line + 1;
      at_col = 0;
      m = search(re, at_line, 0);
      if (!m)
        return failure(d, "does not match line " + std::to_string(at_line + 1) + ", the line after the last match (" +
                              std::to_string(line + 1) + ")");
    } else {  // CHECK-SAME
      m = search(re, line, col);
      if (!m) return failure(d, "does not match the rest of line " + std::to_string(line + 1));
    }
    size_t start = at_col + static_cast<size_t>(m->position(0));
    if (auto f = check_nots(at_line, start)) return *f;
    for (size_t i = 0; i < defs.size(); ++i) vars[defs[i]] = (*m)[i + 1].str();
    line = at_line;
    col = start + static_cast<size_t>(m->length(0));
    matched_any = true;
  }
  if (auto f = check_nots(lines.empty() ? 0 : lines.size() - 1, lines.empty() ? 0 : lines.back().size() + 1)) return *f;
  return ::testing::AssertionSuccess();
}

}  // namespace jvpc::test
