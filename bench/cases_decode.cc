// The decode cases of `posenc bench`: one query against N cached keys through the public
// attention_forward, against a same-run read of the K and V bytes.
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "attention/attention_decode.h"
#include "bench/bench_cases.h"

namespace posenc::bench_impl {
namespace {

// The encodings of the decode rows: those the decode kernel takes (rope with keys_rotated; rope2d
// mixed, whose keys the kernel rotates per head).
const std::vector<Encoding>& decode_encodings() {
  static const std::vector<Encoding> e = {Encoding::kNope, Encoding::kRope, Encoding::kAlibi, Encoding::kT5,
                                          Encoding::kKerple, Encoding::kSandwich, Encoding::kFire, Encoding::kXL,
                                          Encoding::kCope, Encoding::kRope2d};
  return e;
}

std::atomic<std::uint64_t> g_sink{0};  // the read baseline's sums, so that the reads stay

// The read baseline of a decode row: sums every 8-byte word of the K and V buffers (the very bytes
// the kernel reads) in the CPU's widest vectors (sum_words), split over the threads like the
// kernel's (batch, kv head, key part) tasks.
void sum_bytes(const void* a, const void* b, std::size_t bytes, int threads) {
  const std::size_t words = bytes / 8;
  std::uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total) if (threads > 1)
  {
    const std::size_t t = ix(omp_get_thread_num()), T = ix(omp_get_num_threads());
    const std::size_t lo = words * t / T, hi = words * (t + 1) / T;
    for (const void* buf : {a, b}) total += sum_words(static_cast<const std::uint64_t*>(buf) + lo, hi - lo);
  }
  g_sink += total;
}

// How many copies of K and V a decode row cycles through, one per call: enough that they fill twice
// the last-level cache, so that every call reads its cache from memory, as each layer of a model
// reads its own cache once per step (a 128 MiB cache in a 480 MiB L3 would otherwise be read from
// the cache by kernel and baseline alike); at most 4 GiB of them.
std::size_t cache_copies(std::size_t kv_bytes) {
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const std::size_t cold = 2 * (llc > 0 ? static_cast<std::size_t>(llc) : std::size_t{64} << 20);
  const std::size_t cap = (std::size_t{4} << 30) / kv_bytes;
  return std::max<std::size_t>(1, std::min(cap, (cold + kv_bytes - 1) / kv_bytes));
}

// A decode step: M = 1 query at the end of N cached keys, q [1, 1, Hq, D], k and v [1, N, Hkv, D]
// of dtype dt (rope: keys_rotated, the cache holds rotated keys), not causal (the one query sees every
// key either way). Rate: the K and V bytes read per second; baseline: sum_bytes over the same buffers.
// Each call, of the kernel or of the baseline, reads the next of cache_copies() copies of K and V.
// rate: AttentionParams::bf16_rate. The path names the products: "decode", or "decode+vdpbf16" for
// bfloat16 pairs (decode::bf16_products).
Case decode_case(Encoding enc, I N, I Hq, I Hkv, I D, DType dt, bool rate = true) {
  Case c{"attention.decode", encoding_info(enc).name, shape_str({1, N, Hkv, D}) + "/" + std::to_string(Hq), dt};
  AttentionParams p;
  p.encoding = enc;
  p.bf16_rate = rate;
  p.keys_rotated = enc == Encoding::kRope;
  if (enc == Encoding::kRope2d) p.rope2d.variant = Rope2dVariant::kMixed;  // keys on a grid (below)
  const std::string pairs = decode::bf16_products(p, D, dt);
  c.path = pairs.empty() ? "decode" : "decode+" + pairs;
  c.setup = [=](int threads) {
    auto a = std::make_shared<AttnProblem>();
    a->p = p;
    const std::size_t es = dtype_size(dt), kv = ix(N * Hkv * D) * es;
    auto qm = std::make_shared<Mem>(ix(Hq * D) * es, 1), om = std::make_shared<Mem>(ix(Hq * D) * es, 1);
    a->mem = {qm, om};
    std::vector<void*> ks, vs;  // the copies' K and V buffers
    for (std::size_t c = cache_copies(2 * kv); c > 0; --c) {
      auto km = std::make_shared<Mem>(kv, threads), vm = std::make_shared<Mem>(kv, threads);
      fill_random(km->data(), ix(N * Hkv * D), dt);  // a strided sample: the speed does not depend on it
      fill_random(vm->data(), ix(N * Hkv * D), dt);
      ks.push_back(km->data()), vs.push_back(vm->data());
      a->mem.push_back(km), a->mem.push_back(vm);
    }
    a->q = View::contiguous(qm->data(), dt, {1, 1, Hq, D});
    a->out = View::contiguous(om->data(), dt, {1, 1, Hq, D});
    a->k = View::contiguous(nullptr, dt, {1, N, Hkv, D});  // data: the call's copy
    a->v = a->k;
    fill_all(a->q, 1);
    auto small = [&](std::vector<I> s, double lo, double step) {
      a->small.emplace_back(ix(numel(s)), 0.f);
      for (std::size_t e = 0; e < a->small.back().size(); ++e) a->small.back()[e] = static_cast<float>(lo + step * double(e));
      return View::contiguous(a->small.back().data(), DType::kF32, s);
    };
    a->small.reserve(8);
    if (enc == Encoding::kT5) a->t.weights = small({kT5Buckets, Hq}, -0.5, 0.001);
    if (enc == Encoding::kKerple) a->t.r1 = small({Hq}, 0.25, 0.04), a->t.r2 = small({Hq}, 0.05, 0.02);
    if (enc == Encoding::kXL) {  // the sinusoid as wide as a head
      a->t.u = small({Hq, D}, -0.2, 0.0001);
      a->t.v = small({Hq, D}, 0.1, -0.0001);
      a->t.rel_proj = small({Hq, D, D}, -0.05, 1e-7);
    }
    if (enc == Encoding::kCope) a->t.table = small({kCopeNpos, D}, -0.3, 0.0001);
    if (enc == Encoding::kRope2d) {  // mixed; keys on a grid 256 wide, the query on the next cell
      a->t.freqs = small({2, Hq, D / 2}, 0.001, 0.0003);
      a->qpos.resize(ix(2 * N + 2));
      for (I j = 0; j <= N; ++j) a->qpos[ix(j)] = j % 256, a->qpos[ix(N + 1 + j)] = j / 256;
      // x then y of keys 0 … N − 1 and the query (position N), read through two strided views
      a->t.k_positions = View{a->qpos.data(), DType::kI64, 2, {2, N}, {N + 1, 1}};
      a->t.q_positions = View{a->qpos.data() + N, DType::kI64, 2, {2, 1}, {N + 1, 1}};
    }
    if (enc == Encoding::kFire) {
      FireTensors& f = a->t.fire;
      f.w1 = small({kFireWidth}, -1.0, 0.06);
      f.b1 = small({kFireWidth}, 0.5, -0.03);
      f.w2 = small({Hq, kFireWidth}, -0.3, 0.0006);
      f.b2 = small({Hq}, 0.1, 0.0);
      f.c = small({1}, 0.1, 0);
      f.threshold = small({1}, 512.0, 0);
    }
    Bound b;
    // one counter for both: no call reads the copy that the call before it (kernel or baseline) read
    auto next = std::make_shared<std::size_t>(0);
    b.kernel = [=] {
      View k = a->k, v = a->v;
      k.data = ks[*next], v.data = vs[*next];
      *next = (*next + 1) % ks.size();
      const Status st = attention_forward(a->p, a->q, k, v, a->t, a->out);
      if (!st.ok()) std::fprintf(stderr, "posenc bench: attention refused: %s\n", st.message().c_str());
    };
    b.baseline = [=] {
      sum_bytes(ks[*next], vs[*next], kv, threads);
      *next = (*next + 1) % ks.size();
    };
    b.kernel_work = b.baseline_work = 2.0 * static_cast<double>(kv);
    b.baseline_name = "sum";
    b.keep = a;
    return b;
  };
  return c;
}

}  // namespace

std::vector<Case> decode_cases() {
  std::vector<Case> cs;
  // Hq = 32, Hkv = 8, D = 128 (Llama 3 8B's attention), and Hq = 8, Hkv = 2, D = 64
  for (I N : {I{32768}, I{131072}})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (Encoding e : decode_encodings()) cs.push_back(decode_case(e, N, 32, 8, 128, dt));
  for (DType dt : {DType::kF32, DType::kF16}) cs.push_back(decode_case(Encoding::kNope, 32768, 8, 2, 64, dt));
  // bfloat16 with the float32 products (bf16_rate false), beside the rows above where they differ
  if (!decode::bf16_products(AttentionParams{}, 128, DType::kBF16).empty())
    cs.push_back(decode_case(Encoding::kNope, 32768, 32, 8, 128, DType::kBF16, false));
  return cs;
}

}  // namespace posenc::bench_impl
