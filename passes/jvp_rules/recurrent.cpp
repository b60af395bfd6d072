// JVP rule of oneDNN's fused LSTM layer, which at::lstm runs in float32 on the CPU (one layer,
// one direction per call). ATen's other recurrent paths trace through their cells.
//
// With gates G_t = x_t·W_ihᵀ + h_{t−1}·W_hhᵀ + b_ih + b_hh split into i, f, g, o (σ, σ, tanh, σ),
// c_t = f·c_{t−1} + i·g and h_t = o·tanh(c_t), the tangent runs the same recurrence:
//   dG_t = [dx_t·W_ihᵀ + x_t·dW_ihᵀ + h_{t−1}·dW_hhᵀ + db]  +  dh_{t−1}·W_hhᵀ
//           (all steps at once, before the loop)               (per step)
//   dc_t = di·g + df·c_{t−1} + dg·i + f·dc_{t−1},   dh_t = do·tanh(c_t) + o·tanh'(c_t)·dc_t
// The layer returns only h (its output) and the last c, so the primal states and gates are
// computed again from them, as primal expressions: fold evaluates them once, and a call costs
// one matmul and a few elementwise ops per step.
#include "passes/jvp_rules/rules.h"
#include "ir/op.h"

namespace jvpc::jvp_rules {

namespace {

// mkldnn_rnn_layer(input [T, B, I], W_ih, W_hh, b_ih, b_hh, hx [B, H], cx [B, H], reverse,
//   batch_sizes, mode, hidden_size, num_layers, has_biases, bidirectional, batch_first, train)
//   -> (output [T, B, H], hy, cy, workspace); the input is time-major whatever batch_first says.
std::vector<Value*> lstm_layer(Ctx& c) {
  if (!c.c(8).toIntVector().empty()) throw Error("packed sequences (batch_sizes) have no rule");
  bool reverse = c.c(7).toBool(), biases = c.c(12).toBool();
  int64_t H = c.c(10).toInt();
  Value *x = c.x(0), *w_ih = c.x(1), *w_hh = c.x(2), *h0 = c.x(5), *c0 = c.x(6), *out = c.out(0);
  if (w_ih->meta().sizes.at(0) != 4 * H) throw Error("only the LSTM layer has a rule");
  int64_t T = x->meta().sizes.at(0);
  auto step_time = [&](int64_t s) { return reverse ? T - 1 - s : s; };
  // time step t of v, and gate k (i, f, g, o) of v [.., 4H]; zero stays zero
  auto at_time = [&](Value* v, int64_t t) { return v ? c.call(ops::select_int, {v, 0, t}) : nullptr; };
  auto at_gate = [&](Value* v, int64_t k) { return v ? narrow(c, v, -1, k * H, H) : nullptr; };

  // Primal (folded): the states before each time step, the gates, and the cell states.
  Value* h_first = c.unsqueeze(h0, 0);
  Value* h_prev = T == 1    ? h_first
                  : reverse ? c.call(ops::cat, {std::vector<Value*>{narrow(c, out, 0, 1, T - 1), h_first}, 0})
                            : c.call(ops::cat, {std::vector<Value*>{h_first, narrow(c, out, 0, 0, T - 1)}, 0});
  Value* G = c.add(c.matmul(x, mT(c, w_ih)), c.matmul(h_prev, mT(c, w_hh)));
  if (biases) G = c.add(G, c.add(c.x(3), c.x(4)));
  Value* i = c.sigmoid(narrow(c, G, -1, 0, H));
  Value* f = c.sigmoid(narrow(c, G, -1, H, H));
  Value* g = c.call(ops::tanh, {narrow(c, G, -1, 2 * H, H)});
  Value* o = c.sigmoid(narrow(c, G, -1, 3 * H, H));
  std::vector<Value*> cells(static_cast<size_t>(T)), cell_prev(static_cast<size_t>(T));
  Value* cell = c0;
  for (int64_t s = 0; s < T; ++s) {
    int64_t t = step_time(s);
    cell_prev[static_cast<size_t>(t)] = cell;
    cell = c.add(c.mul(at_time(f, t), cell), c.mul(at_time(i, t), at_time(g, t)));
    cells[static_cast<size_t>(t)] = cell;
  }
  Value* C = c.call(ops::stack, {cells, 0});
  Value* tanh_c = c.call(ops::tanh, {C});
  auto sigmoid_derivative = [&](Value* s) { return c.mul(s, c.sub(1, s)); };  // σ' = σ(1 − σ)
  // dG ⊙ D gives (di·g, df·c_{t−1}, dg·i, do·tanh(c_t)) side by side
  Value* D =
      c.call(ops::cat, {std::vector<Value*>{c.mul(sigmoid_derivative(i), g),
                                            c.mul(sigmoid_derivative(f), c.call(ops::stack, {cell_prev, 0})),
                                            c.mul(c.sub(1, c.square(g)), i), c.mul(sigmoid_derivative(o), tanh_c)},
                        -1});
  Value* o_dtanh = c.mul(o, c.sub(1, c.square(tanh_c)));

  // Tangent: the parts of dG without the recurrence, for all steps at once.
  Value* dG = c.per_arg({
      [&](Ctx&, Value* t) { return c.matmul(t, mT(c, w_ih)); },
      [&](Ctx&, Value* t) { return c.matmul(x, mT(c, t)); },
      [&](Ctx&, Value* t) { return c.matmul(h_prev, mT(c, t)); },
  });
  Value* db = biases ? c.add(c.t(3), c.t(4)) : nullptr;  // [4H]: added per step (a bias alone has no [T, B, 4H])
  Value *dh = c.t(5), *dc = c.t(6), *w_hh_t = mT(c, w_hh);
  std::vector<Value*> dout(static_cast<size_t>(T));
  for (int64_t s = 0; s < T; ++s) {
    int64_t t = step_time(s);
    Value* dG_t = c.add(c.add(at_time(dG, t), c.matmul(dh, w_hh_t)), db);
    if (dG_t && dG_t->meta().sizes != at_time(D, t)->meta().sizes)
      dG_t = c.call(ops::expand, {dG_t, at_time(D, t)->meta().sizes});
    Value* parts = c.mul(dG_t, at_time(D, t));
    Value* dc_new =
        c.add(c.mul(dc, at_time(f, t)), c.add(c.add(at_gate(parts, 0), at_gate(parts, 1)), at_gate(parts, 2)));
    dh = c.add(at_gate(parts, 3), c.mul(dc_new, at_time(o_dtanh, t)));
    dc = dc_new;
    dout[static_cast<size_t>(t)] = dh ? dh : c.zeros_like(h0);
  }
  return {c.call(ops::stack, {dout, 0}), dh, dc};
}

}  // namespace

void register_recurrent(Registry& r) { r.add(ops::mkldnn_rnn_layer, lstm_layer); }

}  // namespace jvpc::jvp_rules
