// The fused (flash-style) attention, posenc::fused:: (src/attention/attention_cpu.cc), against the plain
// reference posenc::reference:: (src/attention/attention_ref.cc), forward (out, lse) and backward
// (dq, dk, dv and the parameter gradients), for every encoding the kernels cover (nope, rope in both
// layouts, full and partial, alibi symmetric / with slopes / nonsymmetric / learned, t5 bi- and
// unidirectional, kerple log and power, sandwich, fire, rope2d axial and mixed (with dfreqs, per
// query head under grouped heads), mrope chunked and interleaved with 2D/3D positions shared or per
// batch row, xpos) × causal or not × M = N, decode (M = 1), M < N, M > N × grouped-query heads ×
// global offsets × float32, bfloat16 and float16 × sizes off the tile (L ∈ {1, 3, 19, 130},
// D ∈ {2, 6, 64, 130}) × 1 and 2 threads; every SIMD target on one case per encoding, and at the study model's
// head dim (D = 16, 20); backward units split over key
// blocks (B·Hkv not a multiple of the threads: one head, MQA, three units) against one thread and the
// reference; a large case (L = 989); a long one (L = 16384) whose peak memory shows no L×L buffer; the
// dispatcher's choice; attention_backward_saved (given the forward's out and lse) against
// attention_backward, bit for bit; and the kernels' refusals. The products at the bfloat16 rate:
// test_attention_bf16_rate.cc; the fixtures of both: attention_fast_testing.h.
//
// The reference sees exactly what the kernels read: inputs are rounded to the dtype first.
// Tolerances: |got − want| ≤ atol + rtol·|want| with atol scaled by the largest |want| of the tensor.
//
// Shape letters: B batch, M queries, N keys, Hq query heads, Hkv kv heads, D head dim.
#include "attention_fast_testing.h"

namespace posenc {
namespace {

using namespace fast_testing;  // NOLINT: the fixtures

class FastAttention : public ::testing::TestWithParam<Variant> {};

TEST_P(FastAttention, ForwardMatchesReference) {
  const Variant& var = GetParam();
  for (const NamedShape& ns : shapes())
    for (bool causal : {false, true})
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        if (dt != DType::kF32 && ns.s.D == 130) continue;  // 16-bit on the smaller shapes suffices
        if (var.enc == Encoding::kRope2d && ns.s.D < 4) continue;  // 2D RoPE needs r >= 4
        SCOPED_TRACE(std::string(ns.name) + (causal ? " causal " : " full ") + dtype_name(dt));
        Problem pr(var, ns.s, causal, 100);
        check_forward(pr, dt, 200);
      }
}

TEST_P(FastAttention, BackwardMatchesReference) {
  const Variant& var = GetParam();
  for (const NamedShape& ns : shapes())
    for (bool causal : {false, true})
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        if (dt != DType::kF32 && ns.s.D == 130) continue;
        if (var.enc == Encoding::kRope2d && ns.s.D < 4) continue;
        SCOPED_TRACE(std::string(ns.name) + (causal ? " causal " : " full ") + dtype_name(dt));
        Problem pr(var, ns.s, causal, 300);
        check_backward(pr, dt, 400);
      }
}

// The two float32 backwards without saved statistics: the forward run again then pass 2 (the
// stored tiles off), and the stored path (one thread: every unit whole, so it is taken wherever
// its conditions hold), each against the reference on every shape.
TEST_P(FastAttention, BackwardRecomputedAndStoredMatchReference) {
  const Variant& var = GetParam();
  for (bool stored : {false, true})
    for (const NamedShape& ns : shapes())
      for (bool causal : {false, true}) {
        if (var.enc == Encoding::kRope2d && ns.s.D < 4) continue;
        SCOPED_TRACE(std::string(ns.name) + (causal ? " causal" : " full") + (stored ? " stored" : " recomputed"));
        const fused::ScoreStoreLimit limit(stored ? -1 : 0);
        set_num_threads(stored ? 1 : 0);
        Problem pr(var, ns.s, causal, 300);
        check_backward(pr, DType::kF32, 450);
      }
  set_num_threads(0);
}

// Two threads compute exactly what one does (tasks partition the work; no shared accumulation order).
TEST_P(FastAttention, TwoThreadsEqualOne) {
  const Variant& var = GetParam();
  Problem pr(var, {2, 130, 130, 4, 2, 64}, true, 500);
  Tensor q(DType::kF32, randn(ix(2 * 130 * 4 * 64), 1), pr.qshape());
  Tensor k(DType::kF32, randn(ix(2 * 130 * 2 * 64), 2), pr.kshape());
  Tensor v(DType::kF32, randn(ix(2 * 130 * 2 * 64), 3), pr.kshape());
  Tensor dout(DType::kF32, randn(q.d.size(), 4), pr.qshape());
  const EncodingTensors t = pr.tensors();
  std::vector<Vec> res[2];
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor out(DType::kF32, pr.qshape()), dq(DType::kF32, pr.qshape()), dk(DType::kF32, pr.kshape()),
        dv(DType::kF32, pr.kshape());
    Problem::Grads g = pr.grads(0.0);
    ASSERT_TRUE(fused::attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view()).ok());
    ASSERT_TRUE(fused::attention_backward(pr.p, q.view(), k.view(), v.view(), t, dout.view(), dq.view(),
                                          dk.view(), dv.view(), g.g).ok());
    res[threads - 1] = {out.values(), dq.values(), dk.values(), dv.values()};
    for (const Vec& b : g.bufs) res[threads - 1].push_back(b);
  }
  set_num_threads(0);
  for (std::size_t i = 0; i < res[0].size(); ++i) EXPECT_EQ(res[0][i], res[1][i]) << "output " << i;
}

// attention_backward_saved (the study model's entry point) with the out and lse of the public
// forward equals the public backward bit for bit where that runs the forward again: at a size the
// dispatcher sends to the kernels, where pass 1 reads the saved out and lse instead of recomputing
// them (1 and 2 threads), and at one it sends to the reference, which ignores them. Where the public
// backward takes the stored path (its D summed as Σ P·dP), within 1e-5 of each output's largest entry.
TEST_P(FastAttention, SavedForwardGivesTheSameBackward) {
  const Variant& var = GetParam();
  for (const I L : {I{130}, I{5}})
    for (int threads : {1, 2})
      for (bool stored : {false, true}) {
        SCOPED_TRACE("L = " + std::to_string(L) + ", threads " + std::to_string(threads) + (stored ? ", stored" : ""));
        const fused::ScoreStoreLimit limit(stored ? -1 : 0);
        set_num_threads(threads);
        Problem pr(var, {2, L, L, 4, 2, 64}, true, 600);
        Tensor q(DType::kF32, randn(ix(2 * L * 4 * 64), 1), pr.qshape());
        Tensor k(DType::kF32, randn(ix(2 * L * 2 * 64), 2), pr.kshape());
        Tensor v(DType::kF32, randn(ix(2 * L * 2 * 64), 3), pr.kshape());
        Tensor dout(DType::kF32, randn(q.d.size(), 4), pr.qshape());
        Tensor out(DType::kF32, pr.qshape());
        std::vector<double> lse(ix(2 * 4 * L));
        const View lv = View::contiguous(lse.data(), DType::kF64, {2, 4, L});
        const EncodingTensors t = pr.tensors();
        ASSERT_TRUE(attention_forward(pr.p, q.view(), k.view(), v.view(), t, out.view(), lv).ok());
        std::vector<Vec> res[2];
        for (int saved : {0, 1}) {
          Tensor dq(DType::kF32, pr.qshape()), dk(DType::kF32, pr.kshape()), dv(DType::kF32, pr.kshape());
          Problem::Grads g = pr.grads(0.0);
          const Status st =
              saved ? attention_backward_saved(pr.p, q.view(), k.view(), v.view(), t, out.view(), lv, dout.view(),
                                               dq.view(), dk.view(), dv.view(), g.g)
                    : attention_backward(pr.p, q.view(), k.view(), v.view(), t, dout.view(), dq.view(), dk.view(),
                                         dv.view(), g.g);
          ASSERT_TRUE(st.ok()) << st.message();
          res[saved] = {dq.values(), dk.values(), dv.values()};
          for (const Vec& b : g.bufs) res[saved].push_back(b);
        }
        // the parameter gradients (outputs 3 …) against the largest entry of any of them, as in
        // check_backward (FIRE's db2 is Σ dS over whole rows: 0 up to rounding)
        double ptop = 0;
        for (std::size_t i = 3; i < res[1].size(); ++i) ptop = std::max(ptop, amax(res[1][i]));
        for (std::size_t i = 0; i < res[0].size(); ++i) {
          if (!stored) {
            EXPECT_EQ(res[0][i], res[1][i]) << "output " << i;
            continue;
          }
          double worst = 0;
          for (std::size_t e = 0; e < res[1][i].size(); ++e) worst = std::max(worst, std::abs(res[0][i][e] - res[1][i][e]));
          EXPECT_LE(worst, 1e-5 * (i < 3 ? amax(res[1][i]) : ptop)) << "output " << i;
        }
      }
  set_num_threads(0);
}

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) { return info.param.name; }
INSTANTIATE_TEST_SUITE_P(FastAttention, FastAttention, ::testing::ValuesIn(variants()), variant_name);

// Every SIMD target compiled and supported here (hwy::SetSupportedTargetsForTest; the kernels fetch
// their row helpers per call), one mid-size case per encoding (both rope layouts; learned ALiBi,
// whose backward also sums diagonals), forward and backward: two key blocks; D = 66 leaves the
// rotation's and the row helpers' vector loops a tail; grouped heads; causal on every other one.
TEST(FastAttentionTargets, EveryTargetMatchesReference) {
  set_num_threads(1);
  int n = 0;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const Variant& var : variants()) {
      if (var.name != "nope" && var.name != "rope_interleaved" && var.name != "rope_half_partial" &&
          var.name != "alibi_learned" && var.name != "t5_bidirectional" && var.name != "kerple_power" &&
          var.name != "sandwich" && var.name != "fire" && var.name != "rope_yarn_attention_factor" &&
          var.name != "rope_dynamic_hf" && var.name != "rope2d_mixed_half" && var.name != "mrope_interleaved_partial" &&
          var.name != "xpos")
        continue;
      SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + var.name);
      const bool causal = ++n % 2 == 1;
      Problem pr(var, {1, 140, 140, 2, 1, 66}, causal, 1200 + ix(n));
      check_forward(pr, DType::kF32, 1300);
      check_backward(pr, DType::kF32, 1400);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  set_num_threads(0);
}

// The study model's shape (L = 64, D = 16: the tile GEMM's one-vector rows on AVX-512, two on AVX2)
// and D = 20 (a tail after whole vectors on every width) on every SIMD target, forward and backward,
// with the encodings the model trains.
TEST(FastAttentionTargets, EveryTargetMatchesReferenceAtSmallHeadDims) {
  set_num_threads(1);
  int n = 0;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const Variant& var : variants()) {
      if (var.name != "nope" && var.name != "rope_interleaved" && var.name != "alibi_learned" &&
          var.name != "t5_bidirectional")
        continue;
      for (I D : {16, 20}) {
        SCOPED_TRACE(std::string(hwy::TargetName(target)) + " " + var.name + " D " + std::to_string(D));
        ++n;
        Problem pr(var, {2, 64, 64, 4, 2, D}, true, 1700 + ix(n));
        check_forward(pr, DType::kF32, 1800);
        check_backward(pr, DType::kF32, 1900);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  set_num_threads(0);
}

// The softmax's exponential (ExpSoftmax, core/simd-inl.h, through the tile helper S = e^(S − lse)
// and the tile's online step) on every SIMD target against e^x in double: within 2.5·10⁻⁷ relative
// (2 ulp) on [−86, 0.5] and beyond the row max, 0 at −∞ and below −86 (where e^x < 5·10⁻³⁸), a row
// of lse −∞ all 0; row lengths that end in a vector tail. The online step over two tiles of a
// banded row set against the same softmax in double: m, l and the rescaled o.
TEST(FastAttentionTargets, SoftmaxExponentialOnEveryTarget) {
  std::vector<float> xs;
  for (int i = 0; i <= 86 * 1024; ++i) xs.push_back(-static_cast<float>(i) / 1024.f);  // 0 .. −86
  for (float x : {0.125f, 0.5f, -1e-7f, -0.3465f, -0.3466f, -87.f, -100.f, -1e30f, -HUGE_VALF}) xs.push_back(x);
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    const attn_fast::Simd sd = attn_fast::simd();
    for (std::size_t n : {xs.size(), std::size_t{13}}) {  // 13: a tail on every vector width
      // two rows: lse 0 (the values), then lse −inf (zeros whatever the row holds)
      std::vector<float> y(2 * n);
      std::copy(xs.begin(), xs.begin() + static_cast<long>(n), y.begin());
      std::copy(xs.begin(), xs.begin() + static_cast<long>(n), y.begin() + static_cast<long>(n));
      const float lse[2] = {0.f, -HUGE_VALF};
      sd.exp_rows(y.data(), 2, static_cast<I>(n), static_cast<I>(n), lse, attn_fast::kNoBand);
      int bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double x = xs[i], want = x < -86 ? 0.0 : std::exp(x);
        const double err = x < -86 ? std::fabs(y[i]) : std::fabs(y[i] - want) / want;
        if (!(err <= (x < -86 ? 5e-38 : 2.5e-7)) && ++bad <= 5) ADD_FAILURE() << "e^" << x << " gave " << y[i];
        if (y[n + i] != 0.f && ++bad <= 5) ADD_FAILURE() << "row of lse -inf: " << y[n + i] << " at " << i;
      }
      EXPECT_EQ(bad, 0) << "n " << n;
    }
    // the online step: rows i = 0 .. 39 see keys j ≤ i + 20 of two 48-key tiles (rows from 28 on
    // reach the second); masked keys hold −inf up to the band's reach and 0 beyond, as in Fused::logits
    const I nq = 40, D = 6, band = 20;
    std::vector<float> m(nq, -HUGE_VALF), l(nq, 0.f), o(ix(nq * D), 0.f);
    std::vector<double> S0(ix(nq * 96));
    std::mt19937 rng(7);
    std::normal_distribution<double> nd(0.0, 3.0);
    for (double& v : S0) v = nd(rng);
    for (int t = 0; t < 2; ++t) {
      std::vector<float> S(ix(nq * attn_fast::kBk), 0.f);
      const I bt = band - t * 48;
      for (I i = 0; i < nq; ++i)
        for (I j = 0; j < 48; ++j)
          S[ix(i * attn_fast::kBk + j)] = j <= i + bt                           ? static_cast<float>(S0[ix(i * 96 + t * 48 + j)])
                                          : j < attn_fast::band_reach(i, bt, 48) ? -HUGE_VALF
                                                                                 : 0.f;
      attn_fast::online_softmax_step(sd, S.data(), nq, 48, m.data(), l.data(), o.data(), D, bt);
      for (I i = 0; i < nq; ++i)  // o += P·V with V[j, e] = 1: o's entries all equal the row's Σ P
        for (I e = 0; e < D; ++e)
          for (I j = 0; j < 48; ++j) o[ix(i * D + e)] += S[ix(i * attn_fast::kBk + j)];
    }
    for (I i = 0; i < nq; ++i) {
      double mx = -HUGE_VAL, sum = 0;
      for (I j = 0; j < 96 && j <= i + band; ++j) mx = std::max(mx, double(static_cast<float>(S0[ix(i * 96 + j)])));
      for (I j = 0; j < 96 && j <= i + band; ++j) sum += std::exp(double(static_cast<float>(S0[ix(i * 96 + j)])) - mx);
      EXPECT_EQ(m[ix(i)], static_cast<float>(mx)) << "row " << i;
      EXPECT_NEAR(l[ix(i)], sum, 1e-6 * sum) << "row " << i;
      EXPECT_NEAR(o[ix(i * D + 3)], sum, 1e-6 * sum) << "row " << i;
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// A float32 dq that takes the tile products' sums in place (tasks past the buffer limit) against
// one summed in a task's buffer: the same sums in the same order, so the same gradients bit for
// bit, and the reference's within the tolerances.
TEST(FastAttentionDq, InPlaceEqualsBuffered) {
  ASSERT_TRUE(attn_fast::dq_buffered(2, 130, 64));  // the shapes below buffer dQ by default
  {
    DqBufferLimit in_place(0);
    ASSERT_FALSE(attn_fast::dq_buffered(1, 1, 2));  // and sum in place under limit 0
  }
  for (const Variant& var : variants())
    for (const NamedShape& ns : shapes())
      for (bool causal : {false, true}) {
        if (var.enc == Encoding::kRope2d && ns.s.D < 4) continue;
        SCOPED_TRACE(std::string(var.name) + " " + ns.name + (causal ? " causal" : " full"));
        Problem pr(var, ns.s, causal, 300);
        const std::vector<Vec> buffered = backward_fused(pr, DType::kF32, true, 400);
        DqBufferLimit in_place(0);
        const std::vector<Vec> got = backward_fused(pr, DType::kF32, true, 400);
        ASSERT_EQ(got.size(), buffered.size());
        for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], buffered[i]) << "gradient " << i;
        check_backward(pr, DType::kF32, 400);
      }
}

// The stored path is taken (one thread, causal, no offsets: the tiles of both paths coincide): dv,
// which does not read D, equals the recomputing path's bit for bit, and dk, which does, differs in
// some bit (D = Σ P·dP rounds otherwise than dO·out); both hold the reference (the tests above).
TEST(FastAttentionStored, TakenWhereItFits) {
  set_num_threads(1);
  Problem pr(Variant{"nope", Encoding::kNope}, {2, 260, 260, 4, 2, 64}, true, 700);
  std::vector<Vec> res[2];
  for (int stored : {0, 1}) {
    const fused::ScoreStoreLimit limit(stored ? -1 : 0);
    res[stored] = backward_fused(pr, DType::kF32, true, 800);
  }
  EXPECT_EQ(res[1][2], res[0][2]) << "dv";
  EXPECT_NE(res[1][1], res[0][1]) << "dk";
  set_num_threads(0);
}

// ---- pass 2 split over key blocks ---------------------------------------------------------------
// Backward units (b, kv head) beyond the last multiple of the thread count are split over their key
// blocks, each part with its own dQ rows, summed in part order. dk and dv of a key block come from
// one part whatever the split, so they equal the one-thread result exactly; dq and the parameter
// gradients are summed in another order, so they agree within float32 rounding of the sum
// (tol_grad), and the reference holds every thread count to the usual tolerances.
struct SplitCase {
  const char* name;
  Shape s;
  bool causal;
};

TEST(FastAttentionSplit, SplitUnitsMatchOneThreadAndReference) {
  const SplitCase cases[] = {
      // B·Hq·M·N ≥ 2^15 in each, so that the kernels take the threads they are given.
      {"one_head", {1, 260, 260, 1, 1, 32}, true},    // B·Hkv = 1: every unit split
      {"mqa", {1, 130, 130, 4, 1, 32}, true},         // Hkv = 1 under 4 query heads
      {"units3", {3, 130, 130, 1, 1, 32}, false},     // B·Hkv = 3: whole units and a split one
      {"decode_rows", {1, 40, 420, 2, 1, 32}, true},  // M < N: the early key blocks see every row
  };
  const Variant vars[] = {{"nope", Encoding::kNope},
                          {"rope_half", Encoding::kRope, RopeLayout::kHalf},
                          {"alibi_nonsymmetric", Encoding::kAlibi, RopeLayout::kInterleaved, false,
                           AlibiVariant::kNonsymmetric},
                          {"alibi_learned", Encoding::kAlibi, RopeLayout::kInterleaved, false,
                           AlibiVariant::kLearned},
                          {"t5", Encoding::kT5},
                          {"kerple", Encoding::kKerple},
                          {"fire", Encoding::kFire},
                          {"rope2d_mixed", Encoding::kRope2d, RopeLayout::kInterleaved},
                          {"xpos", Encoding::kXpos, RopeLayout::kHalf}};
  const fused::ScoreStoreLimit recompute(0);  // one thread would take the stored path
  int n = 0;
  for (const SplitCase& c : cases)
    for (const Variant& var : vars) {
      if (var.alibi == AlibiVariant::kNonsymmetric && c.s.Hq % 2 != 0) continue;  // needs Hq even
      ++n;
      const DType dt = n % 3 == 0 ? DType::kBF16 : DType::kF32;
      DqBufferLimit limit(n % 2 == 0 ? 0 : -1);  // even cases: a float32 dq summed in place
      SCOPED_TRACE(std::string(c.name) + " " + var.name + " " + dtype_name(dt));
      Problem pr(var, c.s, c.causal, 1500 + ix(n));
      set_num_threads(1);
      const std::vector<Vec> one = backward_fused(pr, dt, true, 1600);
      for (int threads : {2, 3}) {
        if (threads == 3 && n != 1) continue;  // three parts (uneven cuts) on one case
        SCOPED_TRACE(threads);
        set_num_threads(threads);
        const std::vector<Vec> got = backward_fused(pr, dt, n % 4 != 1, 1600);  // also without dq
        if (n % 4 != 1) {
          EXPECT_TRUE(Close(got[0], one[0], tol_grad(dt))) << "dq";
        }
        EXPECT_EQ(got[1], one[1]) << "dk";
        EXPECT_EQ(got[2], one[2]) << "dv";
        for (std::size_t i = 3; i < got.size(); ++i)
          EXPECT_TRUE(Close(got[i], one[i], Tol{1e-5, 1e-5})) << "parameter gradient " << i - 3;
        if (threads == 2) check_backward(pr, dt, 1600);
      }
    }
  set_num_threads(0);
}

// A large case against the reference on two heads: rope causal (forward and backward), t5 full.
TEST(FastAttentionLarge, L989MatchesReference) {
  set_num_threads(2);
  {
    Variant var{"rope", Encoding::kRope};
    Problem pr(var, {1, 989, 989, 2, 1, 64}, true, 600);
    check_forward(pr, DType::kF32, 700);
    check_backward(pr, DType::kF32, 800);
  }
  {
    Variant var{"t5", Encoding::kT5};
    Problem pr(var, {1, 989, 989, 2, 2, 64}, false, 900);
    check_forward(pr, DType::kF32, 1000);
  }
  set_num_threads(0);
}

// kB of the process's peak resident memory (VmHWM).
long peak_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// L = 16384, one head: an L×L float buffer would be 1 GiB; the kernel needs O(L·D).
TEST(FastAttentionLarge, LongSequenceNeedsNoLxLBuffer) {
  const I L = 16384, D = 64;
  std::vector<float> q(ix(L * D)), k(ix(L * D)), v(ix(L * D)), out(ix(L * D));
  const Vec r = randn(ix(L * D), 5);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = k[i] = v[i] = static_cast<float>(r[i]);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = 1.f;  // touched: counted before the call
  const long before = peak_kb();
  AttentionParams p;
  p.causal = true;
  const View qv = View::contiguous(q.data(), DType::kF32, {1, L, 1, D});
  const View kv = View::contiguous(k.data(), DType::kF32, {1, L, 1, D});
  const View vv = View::contiguous(v.data(), DType::kF32, {1, L, 1, D});
  ASSERT_TRUE(attention_forward(p, qv, kv, vv, {}, View::contiguous(out.data(), DType::kF32, {1, L, 1, D})).ok());
  const long after = peak_kb();
  if (before < 0 || after < 0) GTEST_SKIP() << "no /proc/self/status";
  EXPECT_LT(after - before, 64 * 1024) << "peak grew by " << (after - before) << " kB";
  // first row sees only key 0: out = v_0
  for (I e = 0; e < D; ++e) EXPECT_FLOAT_EQ(out[ix(e)], v[ix(e)]);
}

// The same for KERPLE, Sandwich and FIRE (their tables are O(Hq·L), FIRE's thresholds O(L·W)):
// forward for each, backward for FIRE (its per-segment moments), the peak reset before each call.
TEST(FastAttentionLarge, LongSequenceWithTheNewBiasesNeedsNoLxLBuffer) {
  const I L = 16384, D = 64, W = 32;
  std::vector<float> q(ix(L * D)), out(ix(L * D), 1.f), dq(ix(L * D), 1.f), dk(ix(L * D), 1.f), dv(ix(L * D), 1.f);
  const Vec r = randn(ix(L * D), 6);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(r[i]);
  Vec r1 = {0.8}, r2 = {0.3}, w1 = randn(ix(W), 7), b1 = randn(ix(W), 8, 0.5), w2 = randn(ix(W), 9, 0.3), b2 = {0.1},
      c = {0.1}, thr = {512.0};
  const View qv = View::contiguous(q.data(), DType::kF32, {1, L, 1, D});
  auto v64 = [](Vec& x, std::initializer_list<std::int64_t> s) { return View::contiguous(x.data(), DType::kF64, s); };
  auto v32 = [&](std::vector<float>& x) { return View::contiguous(x.data(), DType::kF32, {1, L, 1, D}); };
  for (Encoding e : {Encoding::kKerple, Encoding::kSandwich, Encoding::kFire})
    for (bool backward : {false, true}) {
      if (backward && e != Encoding::kFire) continue;
      SCOPED_TRACE(std::string(encoding_info(e).name) + (backward ? " backward" : " forward"));
      AttentionParams p;
      p.encoding = e;
      p.causal = true;
      EncodingTensors t;
      if (e == Encoding::kKerple) t.r1 = v64(r1, {1}), t.r2 = v64(r2, {1});
      if (e == Encoding::kFire) t.fire = FireTensors{v64(w1, {W}), v64(b1, {W}), v64(w2, {1, W}), v64(b2, {1}), v64(c, {1}), v64(thr, {1})};
      std::FILE* f = std::fopen("/proc/self/clear_refs", "w");  // VmHWM := VmRSS (Linux ≥ 4.0)
      const bool reset = f && std::fputs("5", f) >= 0;
      if (f) std::fclose(f);
      if (!reset) GTEST_SKIP() << "cannot reset the peak resident memory here";
      const long before = peak_kb();
      const Status st = backward ? attention_backward(p, qv, qv, qv, t, qv, v32(dq), v32(dk), v32(dv), {})
                                 : attention_forward(p, qv, qv, qv, t, v32(out));
      ASSERT_TRUE(st.ok()) << st.message();
      const long after = peak_kb();
      EXPECT_LT(after - before, 64 * 1024) << "peak grew by " << (after - before) << " kB";
    }
}

// The rotary encodings at L = 16384 (one head, per-head tables for rope2d mixed: O(Hq·L·r)): forward
// and backward (mixed with dfreqs) without an L×L buffer, the peak reset before each call.
TEST(FastAttentionLarge, LongSequenceWithTheRotaryEncodingsNeedsNoLxLBuffer) {
  const I L = 16384, D = 64;
  std::vector<float> q(ix(L * D)), out(ix(L * D), 1.f), dq(ix(L * D), 1.f), dk(ix(L * D), 1.f), dv(ix(L * D), 1.f);
  const Vec r = randn(ix(L * D), 16);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(r[i]);
  Vec freqs = randn(ix(2 * D / 2), 17, 0.1), dfreqs(ix(2 * D / 2), 1.0);
  std::vector<std::int64_t> pos2(ix(2 * L)), pos3(ix(3 * L));
  for (I l = 0; l < L; ++l) {
    pos2[ix(l)] = l % 128, pos2[ix(L + l)] = l / 128;                                  // a 128 × 128 image
    pos3[ix(l)] = l < 64 ? l : 64, pos3[ix(L + l)] = l < 64 ? l : 64 + (l - 64) / 128;  // text, then a grid
    pos3[ix(2 * L + l)] = l < 64 ? l : 64 + (l - 64) % 128;
  }
  const View qv = View::contiguous(q.data(), DType::kF32, {1, L, 1, D});
  auto v32 = [&](std::vector<float>& x) { return View::contiguous(x.data(), DType::kF32, {1, L, 1, D}); };
  for (Encoding e : {Encoding::kRope2d, Encoding::kMrope, Encoding::kXpos})
    for (bool backward : {false, true}) {
      SCOPED_TRACE(std::string(encoding_info(e).name) + (backward ? " backward" : " forward"));
      AttentionParams p;
      p.encoding = e;
      p.causal = true;
      EncodingTensors t;
      EncodingGrads g;
      if (e == Encoding::kRope2d) {
        p.rope2d.variant = Rope2dVariant::kMixed;
        t.freqs = View::contiguous(freqs.data(), DType::kF64, {2, 1, D / 2});
        g.freqs = View::contiguous(dfreqs.data(), DType::kF64, {2, 1, D / 2});
        t.q_positions = t.k_positions = View::contiguous(pos2.data(), DType::kI64, {2, L});
      }
      if (e == Encoding::kMrope) {
        p.mrope.mrope_section = {8, 12, 12};
        t.q_positions = t.k_positions = View::contiguous(pos3.data(), DType::kI64, {3, L});
      }
      std::FILE* f = std::fopen("/proc/self/clear_refs", "w");  // VmHWM := VmRSS (Linux ≥ 4.0)
      const bool reset = f && std::fputs("5", f) >= 0;
      if (f) std::fclose(f);
      if (!reset) GTEST_SKIP() << "cannot reset the peak resident memory here";
      const long before = peak_kb();
      const Status st = backward ? attention_backward(p, qv, qv, qv, t, qv, v32(dq), v32(dk), v32(dv), g)
                                 : attention_forward(p, qv, qv, qv, t, v32(out));
      ASSERT_TRUE(st.ok()) << st.message();
      const long after = peak_kb();
      EXPECT_LT(after - before, 64 * 1024) << "peak grew by " << (after - before) << " kB";
    }
}

// No keys at all: the kernels write out = 0 and every gradient, parameter gradients included, as 0
// (not left unwritten), like the reference.
TEST(FastAttentionEdges, NoKeysWritesZeroGradients) {
  for (const Variant& var : variants()) {
    if (var.enc != Encoding::kKerple && var.enc != Encoding::kFire && var.enc != Encoding::kSandwich &&
        var.enc != Encoding::kT5 && var.name != "rope2d_mixed_half")
      continue;
    for (I M : {1, 3}) {  // M = 1: no distance at all (M + N − 1 = 0)
      SCOPED_TRACE(var.name + " M=" + std::to_string(M));
      Problem pr(var, {1, M, 0, 2, 1, 4}, false, 1800);
      std::vector<float> q(ix(M * 2 * 4), 0.5f), kv(1, 0.f), out(q.size(), 7.f), dq(q.size(), 7.f), dout(q.size(), 1.f);
      const View qv = View::contiguous(q.data(), DType::kF32, {1, M, 2, 4});
      const View kvv = View::contiguous(kv.data(), DType::kF32, {1, 0, 1, 4});
      ASSERT_TRUE(fused::attention_forward(pr.p, qv, kvv, kvv, pr.tensors(), View::contiguous(out.data(), DType::kF32, {1, M, 2, 4})).ok());
      for (float x : out) EXPECT_EQ(x, 0.f);
      Problem::Grads g = pr.grads(7.0);
      ASSERT_TRUE(fused::attention_backward(pr.p, qv, kvv, kvv, pr.tensors(), View::contiguous(dout.data(), DType::kF32, {1, M, 2, 4}),
                                            View::contiguous(dq.data(), DType::kF32, {1, M, 2, 4}), View{}, View{}, g.g).ok());
      for (float x : dq) EXPECT_EQ(x, 0.f);
      for (const Vec& b : g.bufs)
        for (double x : b) EXPECT_EQ(x, 0.0);
    }
  }
}

// The dispatcher: large enough problems run the fused kernel (bit for bit), small ones the reference,
// a decode step (M ≤ 16) the decode kernel (tests/test_attention_decode.cc).
TEST(FastAttentionDispatch, PublicEntryPointsPickTheKernelOrTheReference) {
  Variant var{"alibi", Encoding::kAlibi};
  for (I L : {I{17}, I{200}}) {
    Problem pr(var, {1, L, L, 2, 1, 64}, true, 1100);
    Tensor q(DType::kF32, randn(ix(L * 2 * 64), 1), pr.qshape());
    Tensor k(DType::kF32, randn(ix(L * 64), 2), pr.kshape());
    Tensor v(DType::kF32, randn(ix(L * 64), 3), pr.kshape());
    Tensor a(DType::kF32, pr.qshape()), b(DType::kF32, pr.qshape());
    ASSERT_TRUE(attention_forward(pr.p, q.view(), k.view(), v.view(), {}, a.view()).ok());
    const Status st = L == 17 ? reference::attention_forward(pr.p, q.view(), k.view(), v.view(), {}, b.view())
                             : fused::attention_forward(pr.p, q.view(), k.view(), v.view(), {}, b.view());
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(a.values(), b.values()) << "L = " << L;
  }
}

TEST(FastAttentionErrors, KernelsRefuseWhatTheyDoNotCover) {
  const I B = 1, L = 3, H = 1, D = 4;
  std::vector<float> q(ix(B * L * H * D), 0.5f), out(q.size());
  const View qv = View::contiguous(q.data(), DType::kF32, {B, L, H, D});
  const View ov = View::contiguous(out.data(), DType::kF32, {B, L, H, D});
  AttentionParams p;
  p.encoding = Encoding::kCope;
  std::vector<float> table(ix(4 * D), 0.1f);
  EncodingTensors t;
  t.table = View::contiguous(table.data(), DType::kF32, {4, D});
  // CoPE: refused until its kernel (attention_cope_cpu.cc) is built, then run.
  Status st = fused::attention_forward(p, qv, qv, qv, t, ov);
  if (fused::cope_fused()) {
    EXPECT_TRUE(st.ok()) << st.message();
  } else {
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_EQ(st.arg(), "encoding");
  }
  EXPECT_TRUE(attention_forward(p, qv, qv, qv, t, ov).ok());  // the dispatcher runs it either way

  p = AttentionParams{};
  st = fused::attention_forward(p, qv, qv, qv, {}, qv);  // in place over q
  EXPECT_EQ(st.arg(), "out");
  std::vector<double> q64(q.size(), 0.5), o64(q.size());
  st = fused::attention_forward(p, View::contiguous(q64.data(), DType::kF64, {B, L, H, D}),
                                View::contiguous(q64.data(), DType::kF64, {B, L, H, D}),
                                View::contiguous(q64.data(), DType::kF64, {B, L, H, D}), {},
                                View::contiguous(o64.data(), DType::kF64, {B, L, H, D}));
  EXPECT_EQ(st.arg(), "encoding");
  // validation is the reference's: a bad shape names its argument
  st = fused::attention_forward(p, qv, View::contiguous(q.data(), DType::kF32, {B, L, H, D - 1}), qv, {}, ov);
  EXPECT_EQ(st.arg(), "k");
}

}  // namespace
}  // namespace posenc
