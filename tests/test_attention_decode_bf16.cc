// The decode kernel at the bfloat16 rate (src/attention/attention_decode_bf16-inl.h): bfloat16 q, k, v
// with products on bfloat16 pairs, VDPBF16PS where this CPU has it and its emulation on any AVX-512
// CPU, against the plain reference at the bfloat16 tolerances (tests/decode_testing.h): every
// encoding the kernel covers, query rows exact in bfloat16 (one part) and not (the rotary and xl rows:
// two parts), head dims taken as constants (64, 128), with a tail of pairs (40, 94) and odd (no
// pairs: the float32 products), odd and even key counts per row (causal, M = 3); every SIMD target.
#include <string>
#include <utility>
#include <vector>

#include <hwy/targets.h>

#include "attention/tile_gemm_bf16.h"
#include "decode_testing.h"

namespace posenc {
namespace {

using namespace decode_testing;  // NOLINT: the shared problems and check()
using attn_fast::Bf16Mode;

// The modes that run here: the emulation on any AVX-512 CPU, VDPBF16PS where the CPU has it.
std::vector<std::pair<Bf16Mode, std::string>> modes() {
  std::vector<std::pair<Bf16Mode, std::string>> m = {{Bf16Mode::kEmulated, "emulated"}};
  if (attn_fast::cpu_has_avx512_bf16()) m.push_back({Bf16Mode::kVdpbf16, "vdpbf16"});
  return m;
}

class DecodeBf16Rate : public ::testing::Test {
 protected:
  void TearDown() override { attn_fast::bf16_set_mode(Bf16Mode::kAuto); }
};

TEST_F(DecodeBf16Rate, EveryEncodingMatchesReference) {
  for (const auto& [mode, name] : modes()) {
    attn_fast::bf16_set_mode(mode);
    SCOPED_TRACE(name);
    std::uint64_t seed = 3000;
    for (const Variant& var : variants())
      for (I D : {40, 64, 128})
        for (bool causal : {false, true}) {
          check(var, DType::kBF16, 3, 8, 2, causal, 601, 1, seed += 20, D);
          check(var, DType::kBF16, 1, 4, 1, causal, 333, 2, seed += 20, D);
        }
  }
}

// Every SIMD target (the bfloat16 rate on the AVX-512 ones, the float32 products elsewhere), a tail of
// pairs (D = 94) and an odd D (the float32 products everywhere; the encodings without rotary pairs).
TEST_F(DecodeBf16Rate, EveryTargetMatchesReference) {
  for (const auto& [mode, name] : modes()) {
    attn_fast::bf16_set_mode(mode);
    for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      SCOPED_TRACE(name + " " + hwy::TargetName(target));
      for (const Variant& var : variants()) {
        const bool rotary = var.enc == Encoding::kRope || var.enc == Encoding::kXpos ||
                            var.enc == Encoding::kMrope || var.enc == Encoding::kRope2d;
        check(var, DType::kBF16, 2, 4, 2, true, 301, 2, 7, 94);
        if (!rotary) check(var, DType::kBF16, 2, 4, 2, true, 301, 2, 8, 39);  // (rotary pairs need an even D)
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

// The rate is taken where it is asked for: P rounded to bfloat16 moves out (within the tolerance), so
// the emulated rate and the float32 products (mode off, or bf16_rate false) give different outs, and
// those two give the same.
TEST_F(DecodeBf16Rate, TakenWhereAsked) {
  const Variant var{"nope", Encoding::kNope};
  Vec off, emulated, unasked;
  attn_fast::bf16_set_mode(Bf16Mode::kOff);
  check(var, DType::kBF16, 1, 8, 2, false, 601, 1, 11, 64, 1, &off);
  attn_fast::bf16_set_mode(Bf16Mode::kEmulated);
  check(var, DType::kBF16, 1, 8, 2, false, 601, 1, 11, 64, 1, &emulated);
  check(var, DType::kBF16, 1, 8, 2, false, 601, 1, 11, 64, 1, &unasked, /*bf16_rate=*/false);
  if (!attn_fast::bf16_ops()) GTEST_SKIP() << "no AVX-512: no emulation";
  EXPECT_NE(off, emulated);
  EXPECT_EQ(off, unasked);
}

}  // namespace
}  // namespace posenc
