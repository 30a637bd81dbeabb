// Parity of the MoE and data-movement slots (moe_gather, moe_combine,
// moe_combine_bwd, moe_route, moe_route_bwd, moe_balance_stats, copy_rows, add_scaled, embedding_bwd, sum) on
// every ISA against the scalar oracles; instantiated in parity_test.cc.
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "backend/parity_test_util.h"

namespace myriad::parity {

TEST_P(Parity, Moe) {
  Rng rng(9);
  for (int64_t C : {1, 37, 64}) {
    const int64_t N = 37, K = 2, rows = N * K, src_rows = 50;
    Vec src = Randn(src_rows * C, rng);
    std::vector<int32_t> idx(rows);
    for (auto& i : idx) i = (int32_t)rng.Below(src_rows);  // repeats allowed
    Vec dst(rows * C), dst_r(rows * C);
    ops_->moe_gather(src.data(), idx.data(), rows, C, dst.data());
    ref_.moe_gather(src.data(), idx.data(), rows, C, dst_r.data());
    ExpectClose(dst, dst_r, 0, 0, "moe_gather C" + std::to_string(C));
    // pos: a permutation of the rows of buf (each named exactly once).
    std::vector<int32_t> pos(rows);
    for (int64_t i = 0; i < rows; ++i) pos[i] = (int32_t)i;
    for (int64_t i = rows - 1; i > 0; --i) std::swap(pos[i], pos[rng.Below(i + 1)]);
    Vec buf = Randn(rows * C, rng), w = Randn(N * K, rng), dout = Randn(N * C, rng);
    for (const float* wp : {(const float*)w.data(), (const float*)nullptr}) {
      std::string tag = std::string(wp ? " weighted" : " unweighted") + " C" + std::to_string(C);
      Vec out = Randn(N * C, rng), out_r = out;
      ops_->moe_combine(buf.data(), pos.data(), wp, N, K, C, out.data());
      ref_.moe_combine(buf.data(), pos.data(), wp, N, K, C, out_r.data());
      ExpectClose(out, out_r, 1e-6, 1e-6, "moe_combine" + tag);
      Vec dbuf(rows * C, NAN), dbuf_r(rows * C, NAN), dw(N * K), dw_r(N * K);
      ops_->moe_combine_bwd(dout.data(), buf.data(), pos.data(), wp, N, K, C, dbuf.data(), dw.data());
      ref_.moe_combine_bwd(dout.data(), buf.data(), pos.data(), wp, N, K, C, dbuf_r.data(), dw_r.data());
      ExpectClose(dbuf, dbuf_r, 1e-6, 1e-7, "moe_combine_bwd dbuf" + tag);
      ExpectClose(dw, dw_r, 1e-5, 1e-5, "moe_combine_bwd dw" + tag);
    }
  }
}

// Routing: selection, permutation and offsets exactly; scores and weights
// to fp32 rounding. Logits on a coarse grid make exact ties, which both
// sides must break towards the lower index.
TEST_P(Parity, MoeRoute) {
  Rng rng(21);
  struct S { int64_t N, E, K; };
  for (S c : {S{1, 4, 1}, S{7, 8, 2}, S{33, 16, 6}, S{300, 64, 8}, S{5, 256, 8}})
    for (bool sigmoid : {false, true})
      for (int variant = 0; variant < 3; ++variant)  // 0 random, 1 with bias, 2 ties
      for (int rule = 0; rule < 3; ++rule) {  // 0 ours; 1 unnormalised, scaled; 2 group-limited, scaled
        const int64_t ng = rule == 2 ? std::min<int64_t>(8, c.E / 2) : 1, tg = std::max<int64_t>(1, ng / 2);
        Vec logits = Randn(c.N * c.E, rng, 2.f), bias;
        if (variant == 2)
          for (auto& l : logits) l = std::round(l * 2) / 2;
        if (variant == 1) bias = Randn(c.E, rng, 0.1f);
        auto run = [&](const BackendOps& o, Vec* sc, std::vector<int32_t>* sel, Vec* w,
                       std::vector<int32_t>* pos, std::vector<int32_t>* perm, std::vector<int64_t>* off) {
          sc->assign(c.N * c.E, -1); sel->assign(c.N * c.K, -1); w->assign(c.N * c.K, -1);
          pos->assign(c.N * c.K, -1); perm->assign(c.N * c.K, -1); off->assign(c.E + 1, -1);
          MoeRouteParams p;
          p.N = c.N, p.E = c.E, p.K = c.K, p.sigmoid = sigmoid;
          p.normalize = rule != 1, p.scale = rule == 0 ? 1.f : 2.5f, p.n_group = ng, p.topk_group = tg;
          p.logits = logits.data(), p.bias = bias.empty() ? nullptr : bias.data();
          p.scores = sc->data(), p.sel = sel->data(), p.weights = w->data();
          p.pos = pos->data(), p.perm = perm->data(), p.expert_offset = off->data();
          o.moe_route(p);
        };
        Vec sc, rsc, w, rw;
        std::vector<int32_t> sel, rsel, pos, rpos, perm, rperm;
        std::vector<int64_t> off, roff;
        run(*ops_, &sc, &sel, &w, &pos, &perm, &off);
        run(ref_, &rsc, &rsel, &rw, &rpos, &rperm, &roff);
        std::string what = "moe_route N" + std::to_string(c.N) + " E" + std::to_string(c.E) + " K" +
                           std::to_string(c.K) + (sigmoid ? " sigmoid" : " softmax") + " v" + std::to_string(variant) +
                           " rule" + std::to_string(rule);
        EXPECT_EQ(sel, rsel) << what;
        EXPECT_EQ(pos, rpos) << what;
        EXPECT_EQ(perm, rperm) << what;
        EXPECT_EQ(off, roff) << what;
        ExpectClose(sc, rsc, 2e-6, 1e-7, what + " scores");
        ExpectClose(w, rw, 2e-6, 1e-7, what + " weights");
      }
}

// Group-limited routing on a hand-worked case (both implementations): 8
// experts in 4 groups of 2, sigmoid scores all 0.5 (logits 0), the biases
// making the biased scores 0.78 0.10 | 0.81 0.30 | 0.52 0.51 | 0.70 0.65;
// group scores 0.88, 1.11, 1.03, 1.35 keep groups 3 and 1, so the top 2 are
// experts 2 and 6 (without groups: 2 and 0); weights 2.5 * 0.5 / 1.0.
TEST_P(Parity, MoeRouteGroupLimitedByHand) {
  Vec logits(8, 0.f), bias = {0.28f, -0.4f, 0.31f, -0.2f, 0.02f, 0.01f, 0.2f, 0.15f};
  for (const BackendOps* o : {ops_, static_cast<const BackendOps*>(&ref_)})
    for (int64_t groups : {4, 1}) {
      Vec sc(8), w(2);
      std::vector<int32_t> sel(2), pos(2), perm(2);
      std::vector<int64_t> off(9);
      MoeRouteParams p;
      p.N = 1, p.E = 8, p.K = 2, p.sigmoid = true, p.scale = 2.5f, p.n_group = groups, p.topk_group = groups == 4 ? 2 : 1;
      p.logits = logits.data(), p.bias = bias.data(), p.scores = sc.data(), p.sel = sel.data(), p.weights = w.data();
      p.pos = pos.data(), p.perm = perm.data(), p.expert_offset = off.data();
      o->moe_route(p);
      EXPECT_EQ(sel, (groups == 4 ? std::vector<int32_t>{2, 6} : std::vector<int32_t>{2, 0})) << groups << " groups";
      EXPECT_EQ(w, (Vec{1.25f, 1.25f}));
    }
}

// Router backward (with and without the balance term, both score
// functions) against the explicit-Jacobian oracle, and the balance-loss
// statistics exactly (counts) and to double rounding (sums).
TEST_P(Parity, MoeRouteBackward) {
  Rng rng(27);
  struct S { int64_t B, T, E, K; };
  for (S c : {S{1, 1, 4, 1}, S{2, 7, 8, 2}, S{3, 11, 16, 6}, S{4, 75, 64, 8}, S{1, 5, 256, 8}})
    for (bool sigmoid : {false, true})
      for (bool balance : {false, true})
      for (int rule = 0; rule < 2; ++rule) {  // 0 normalised; 1 unnormalised and scaled
        const int64_t N = c.B * c.T;
        Vec logits = Randn(N * c.E, rng, 2.f), sc(N * c.E), w(N * c.K);
        std::vector<int32_t> sel(N * c.K), pos(N * c.K), perm(N * c.K);
        std::vector<int64_t> off(c.E + 1);
        MoeRouteParams rp;
        rp.N = N, rp.E = c.E, rp.K = c.K, rp.sigmoid = sigmoid, rp.logits = logits.data();
        rp.normalize = rule == 0, rp.scale = rule == 0 ? 1.f : 2.5f;
        rp.scores = sc.data(), rp.sel = sel.data(), rp.weights = w.data(), rp.pos = pos.data();
        rp.perm = perm.data(), rp.expert_offset = off.data();
        ref_.moe_route(rp);
        Vec dw = Randn(N * c.K, rng), coef = Randn(c.B * c.E, rng, 0.3f), dl(N * c.E, NAN), dl_r(N * c.E, NAN);
        MoeRouteBackwardParams p;
        p.N = N, p.E = c.E, p.K = c.K, p.T = c.T, p.sigmoid = sigmoid;
        p.normalize = rp.normalize, p.scale = rp.scale;
        p.scores = sc.data(), p.sel = sel.data(), p.weights = w.data(), p.d_weights = dw.data();
        p.balance = balance ? coef.data() : nullptr;
        p.d_logits = dl.data();
        ops_->moe_route_bwd(p);
        p.d_logits = dl_r.data();
        ref_.moe_route_bwd(p);
        std::string what = "moe_route_bwd B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " E" +
                           std::to_string(c.E) + (sigmoid ? " sigmoid" : " softmax") + (balance ? " +balance" : "") +
                           (rule ? " unnormalised x2.5" : "");
        ExpectClose(dl, dl_r, 1e-5, 1e-7, what);
        std::vector<double> st(2 * c.B * c.E, NAN), st_r(2 * c.B * c.E, NAN);
        ops_->moe_balance_stats(sc.data(), sel.data(), c.B, c.T, c.E, c.K, st.data());
        ref_.moe_balance_stats(sc.data(), sel.data(), c.B, c.T, c.E, c.K, st_r.data());
        for (size_t i = 0; i < st.size(); ++i) {
          if (i < st.size() / 2) ASSERT_EQ(st[i], st_r[i]) << "moe_balance_stats count " << i << " " << what;
          else ASSERT_NEAR(st[i], st_r[i], 1e-12 * (1 + c.T)) << "moe_balance_stats sum " << i << " " << what;
        }
      }
}

// Strided copies (with and without a scale), the residual add, the
// embedding backward with repeated tokens, and the loss sum.
TEST_P(Parity, DataMovement) {
  Rng rng(33);
  for (auto [rows, width, ld_src, ld_dst] : std::vector<std::array<int64_t, 4>>{
           {1, 1, 1, 1}, {7, 5, 5, 5}, {33, 37, 50, 41}, {300, 200, 256, 200}, {2, 40000, 40000, 40003}})
    for (float scale : {1.f, 0.37f}) {
      Vec src = Randn(rows * ld_src, rng), a(rows * ld_dst, 7.f), b(rows * ld_dst, 7.f);
      ops_->copy_rows(src.data(), ld_src, a.data(), ld_dst, rows, width, scale);
      ref_.copy_rows(src.data(), ld_src, b.data(), ld_dst, rows, width, scale);
      EXPECT_EQ(a, b) << "copy_rows " << rows << "x" << width << " scale " << scale;  // untouched gaps stay 7
    }
  for (int64_t n : {1, 37, 4099, 100003})
    for (float alpha : {1.f, -0.5f}) {
      Vec x = Randn(n, rng), y = Randn(n, rng), a(n), b(n), inplace = x;
      ops_->add_scaled(x.data(), y.data(), alpha, n, a.data());
      ref_.add_scaled(x.data(), y.data(), alpha, n, b.data());
      ExpectClose(a, b, 1e-6, 1e-7, "add_scaled");
      ops_->add_scaled(inplace.data(), y.data(), alpha, n, inplace.data());  // out aliases x
      EXPECT_EQ(inplace, a);
    }
  for (auto [N, C, V] : std::vector<std::array<int64_t, 3>>{{1, 3, 2}, {50, 37, 5}, {333, 64, 1000}}) {
    Vec d = Randn(N * C, rng), g0 = Randn(V * C, rng), a = g0, b = g0;
    std::vector<int32_t> tok(N);
    for (auto& t : tok) t = (int32_t)rng.Below(V);
    ops_->embedding_bwd(d.data(), tok.data(), N, C, a.data());
    ref_.embedding_bwd(d.data(), tok.data(), N, C, b.data());
    EXPECT_EQ(a, b) << "embedding_bwd N" << N << " C" << C;  // same order of additions: same bits
  }
  for (int64_t n : {0, 1, 37, 100003}) {
    Vec x = Randn(n, rng);
    EXPECT_NEAR(ops_->sum(x.data(), n), ref_.sum(x.data(), n), 1e-9 * (1 + n)) << "sum " << n;
  }
}

}  // namespace myriad::parity
