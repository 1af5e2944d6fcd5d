// Fuzz target: the C ABI (posenc/c_api.h) driven by a sequence of operations decoded from the bytes:
// posenc_*_params_set with keys and values from the real vocabulary (the registry's parameters, the
// attention's and RoPE's keys, their choices) or raw bytes; set_tensor and set_grad with random
// dtypes, ndim, shapes and strides; then one call (forward, backward, backward from the forward's or
// a shard's statistics, rope_qk).
// The C ABI cannot know a buffer's size and trusts shapes and strides, so every tensor here lies in an
// allocation of exactly the bytes its shape and strides reach: a read or write outside it is an ASan
// report. Sizes stay small (B ≤ 2, M, N ≤ 5, heads ≤ 4, D ≤ 8) so that a run takes microseconds.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "posenc/c_api.h"
#include "posenc/registry.h"
#include "posenc/threads.h"

namespace {

using posenc::fuzz::FuzzInput;

std::vector<std::string> g_encodings, g_keys, g_values, g_tensor_names;
// Calls that returned POSENC_OK and calls in all, printed at exit when POSENC_FUZZ_STATS is set (a
// check that the inputs reach the kernels, not only the argument checks).
long g_ok = 0, g_calls = 0;

int count(int rc) {
  ++g_calls;
  if (rc == POSENC_OK) ++g_ok;
  return rc;
}

void add_unique(std::vector<std::string>* v, const std::string& s) {
  for (const std::string& x : *v)
    if (x == s) return;
  v->push_back(s);
}

std::string underscores(std::string s) {
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

// The vocabulary: every name the C ABI knows, from the registry, plus values that sit on edges.
void build_vocabulary() {
  for (const char* k : {"causal", "scale", "q_offset", "k_offset", "layout", "rotary_dim", "theta", "rope_type",
                        "factor", "original_max_position", "beta_fast", "beta_slow", "truncate", "mscale",
                        "mscale_all_dim", "low_freq_factor", "high_freq_factor", "short_factor", "long_factor",
                        "longrope_factors", "attention_factor", "freq_factors", "inv_freq", "angles", "seq_len"})
    add_unique(&g_keys, k);
  for (const char* v : {"0", "1", "2", "3", "4", "-1", "0.5", "-0.0", "1e308", "1e-308", "nan", "inf", "-inf", "",
                        "true", "false", "yes", "off", "16,24,24", "1,1,0", "1,2", "2,1", "1,1,1,1", "0.5,2",
                        "9223372036854775807", "-9223372036854775808", "9007199254740993", "2147483648",
                        "linear", "ntk", "dynamic", "yarn", "llama3", "longrope", "default", "hf", "accurate",
                        "short", "long", "by-length"})
    add_unique(&g_values, v);
  for (const posenc::EncodingInfo& e : posenc::registry()) {
    add_unique(&g_encodings, e.name);
    for (const posenc::ParamSpec& p : e.params) {
      if (p.type == "tensor")
        add_unique(&g_tensor_names, underscores(p.name));
      else
        add_unique(&g_keys, underscores(p.name));
      if (!p.default_.empty()) add_unique(&g_values, p.default_);
      for (const std::string& c : p.choices) add_unique(&g_values, c);
    }
  }
  for (const char* t : {"q_positions", "k_positions"}) add_unique(&g_tensor_names, t);
}

// A word from the vocabulary, or (for the last index) raw bytes.
std::string pick(FuzzInput& in, const std::vector<std::string>& words) {
  const unsigned i = in.below(static_cast<unsigned>(words.size()) + 1);
  return i < words.size() ? words[i] : in.text(12);
}

const std::size_t kElemSize[] = {4, 8, 4, 8, 2, 2};  // by POSENC_* dtype

// A tensor and the allocation of exactly the bytes its shape and strides reach.
struct Buffer {
  posenc_tensor t{};
  std::unique_ptr<unsigned char[]> bytes;
};

// Fills the buffer from the input: small numbers mostly, now and then an edge (NaN, inf, huge ints).
void fill(FuzzInput& in, Buffer* b, std::size_t n_bytes) {
  const std::size_t es = b->t.dtype >= 0 && b->t.dtype < 6 ? kElemSize[b->t.dtype] : 1;
  for (std::size_t at = 0; at + es <= n_bytes; at += es) {
    const std::uint8_t r = in.byte();
    unsigned char* p = b->bytes.get() + at;
    switch (b->t.dtype) {
      case POSENC_F32: {
        const float f = r == 255 ? std::numeric_limits<float>::quiet_NaN() : r == 254 ? 1e30f : (r - 128) / 32.0f;
        std::memcpy(p, &f, 4);
        break;
      }
      case POSENC_F64: {
        const double d = r == 255 ? std::numeric_limits<double>::infinity() : (r - 128) / 32.0;
        std::memcpy(p, &d, 8);
        break;
      }
      case POSENC_I32: {
        const std::int32_t i = r == 255 ? std::numeric_limits<std::int32_t>::max() : r == 254 ? -1 : r % 16;
        std::memcpy(p, &i, 4);
        break;
      }
      case POSENC_I64: {
        const std::int64_t i = r == 255   ? std::numeric_limits<std::int64_t>::max()
                               : r == 254 ? std::numeric_limits<std::int64_t>::min()
                               : r == 253 ? (std::int64_t{1} << 53) + 1
                                          : r % 16;
        std::memcpy(p, &i, 8);
        break;
      }
      case POSENC_BF16:
      case POSENC_F16:  // the byte as the high half
        p[0] = 0;
        p[1] = r;
        break;
      default:  // an invalid dtype: one byte per element
        p[0] = r;
        break;
    }
  }
}

// Allocates b for its shape and strides (elements reached: 1 + Σ (shape−1)·stride; none when a dim is
// 0). Shapes or strides that are negative get one element: whatever the library reads past it is
// reported.
void allocate(FuzzInput& in, Buffer* b) {
  const int nd = b->t.ndim < 0 ? 0 : b->t.ndim > POSENC_MAX_DIMS ? POSENC_MAX_DIMS : b->t.ndim;
  std::int64_t last = 0;
  bool empty = false;
  for (int i = 0; i < nd; ++i) {
    if (b->t.shape[i] == 0) empty = true;
    if (b->t.shape[i] > 0 && b->t.strides[i] > 0) last += (b->t.shape[i] - 1) * b->t.strides[i];
  }
  const std::size_t es = b->t.dtype >= 0 && b->t.dtype < 6 ? kElemSize[b->t.dtype] : 1;
  const std::size_t n = empty ? 0 : static_cast<std::size_t>(last + 1) * es;
  b->bytes.reset(new unsigned char[n]);
  b->t.data = b->bytes.get();
  fill(in, b, n);
}

// Dims of the call: batch, queries, keys, query heads, key heads, head dim.
struct Dims {
  std::int64_t B, M, N, Hq, Hkv, D;
};

// A tensor of `want`'s shape, contiguous (most often), with other strides, or entirely random.
Buffer make_tensor(FuzzInput& in, int dtype, std::vector<std::int64_t> want) {
  Buffer b;
  const unsigned mode = in.below(8);
  b.t.dtype = mode == 7 ? static_cast<int>(in.below(8)) - 1 : dtype;
  b.t.ndim = mode == 7 ? static_cast<int>(in.below(POSENC_MAX_DIMS + 3)) - 1 : static_cast<int>(want.size());
  for (int i = 0; i < POSENC_MAX_DIMS; ++i) {
    b.t.shape[i] = i < static_cast<int>(want.size()) ? want[static_cast<std::size_t>(i)] : 1;
    if (mode == 7) b.t.shape[i] = static_cast<int>(in.below(7)) - 1;
  }
  std::int64_t s = 1;
  for (int i = (b.t.ndim > 0 ? std::min(b.t.ndim, POSENC_MAX_DIMS) : 0) - 1; i >= 0; --i) {
    b.t.strides[i] = mode >= 6 ? static_cast<int>(in.below(9)) - 1 : s;
    s *= b.t.shape[i] > 0 ? b.t.shape[i] : 1;
  }
  allocate(in, &b);
  return b;
}

// A parameter tensor of the encoding: 1 to 3 dims from the call's sizes.
Buffer make_param(FuzzInput& in, const Dims& d) {
  const std::int64_t sizes[] = {1, 2, 3, d.Hq, d.D / 2, d.M + d.N - 1, 32, 4};
  std::vector<std::int64_t> shape(1 + in.below(3));
  for (std::int64_t& x : shape) x = sizes[in.below(8)];
  const int dtypes[] = {POSENC_F32, POSENC_F64, POSENC_I64, POSENC_I32};
  return make_tensor(in, dtypes[in.below(4)], shape);
}

int call_attention(FuzzInput& in, const Dims& d) {
  posenc_attention_params* p = posenc_attention_params_new(pick(in, g_encodings).c_str());
  if (p == nullptr) return 0;
  std::vector<Buffer> held;  // borrowed by p until it is freed
  held.reserve(16);
  const unsigned n_ops = in.below(8);
  for (unsigned i = 0; i < n_ops; ++i) {
    const unsigned what = in.below(4);
    if (what <= 1) {
      const std::string key = pick(in, g_keys), value = pick(in, g_values);
      posenc_attention_params_set(p, key.c_str(), value.c_str());
    } else {
      const std::string name = pick(in, g_tensor_names);
      held.push_back(make_param(in, d));
      if (what == 2)
        posenc_attention_set_tensor(p, name.c_str(), in.below(8) == 0 ? nullptr : &held.back().t);
      else
        posenc_attention_set_grad(p, name.c_str(), &held.back().t);
    }
  }
  const int dt = in.below(4) == 0 ? POSENC_F64 : POSENC_F32;
  Buffer q = make_tensor(in, dt, {d.B, d.M, d.Hq, d.D}), k = make_tensor(in, dt, {d.B, d.N, d.Hkv, d.D}),
         v = make_tensor(in, dt, {d.B, d.N, d.Hkv, d.D}), out = make_tensor(in, dt, {d.B, d.M, d.Hq, d.D}),
         lse = make_tensor(in, POSENC_F64, {d.B, d.Hq, d.M});
  switch (in.below(4)) {
    case 0:
      count(posenc_attention_forward(p, &q.t, &k.t, &v.t, &out.t, in.below(2) ? &lse.t : nullptr));
      break;
    case 1: {
      Buffer dq = make_tensor(in, dt, {d.B, d.M, d.Hq, d.D}), dk = make_tensor(in, dt, {d.B, d.N, d.Hkv, d.D}),
             dv = make_tensor(in, dt, {d.B, d.N, d.Hkv, d.D});
      count(posenc_attention_backward(p, &q.t, &k.t, &v.t, &out.t, &dq.t, in.below(2) ? &dk.t : nullptr, &dv.t));
      break;
    }
    case 2: {
      Buffer dout = make_tensor(in, dt, {d.B, d.M, d.Hq, d.D}), dq = make_tensor(in, dt, {d.B, d.M, d.Hq, d.D});
      count(posenc_attention_backward_saved(p, &q.t, &k.t, &v.t, &out.t, in.below(2) ? &lse.t : nullptr, &dout.t,
                                            &dq.t, nullptr, nullptr));
      break;
    }
    default: {
      Buffer dout = make_tensor(in, dt, {d.B, d.M, d.Hq, d.D}), dq = make_tensor(in, dt, {d.B, d.M, d.Hq, d.D});
      count(posenc_attention_backward_from_stats(p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t, &dq.t, nullptr,
                                                 nullptr));
      break;
    }
  }
  posenc_attention_params_free(p);
  return 0;
}

int call_rope(FuzzInput& in, const Dims& d) {
  posenc_rope_params* p = posenc_rope_params_new();
  if (p == nullptr) return 0;
  const unsigned n_ops = in.below(6);
  for (unsigned i = 0; i < n_ops; ++i) {
    const std::string key = pick(in, g_keys), value = pick(in, g_values);
    posenc_rope_params_set(p, key.c_str(), value.c_str());
  }
  const int dt = static_cast<int>(in.below(6));
  Buffer q = make_tensor(in, dt, {d.B, d.M, d.Hq, d.D}), k = make_tensor(in, dt, {d.B, d.M, d.Hkv, d.D});
  Buffer pos = make_tensor(in, in.below(2) ? POSENC_I64 : POSENC_I32,
                           in.below(2) ? std::vector<std::int64_t>{d.M} : std::vector<std::int64_t>{d.B, d.M});
  const std::int64_t offsets[] = {0, 3, -1, std::numeric_limits<std::int64_t>::max()};
  const bool with_k = in.below(2), with_pos = in.below(2), in_place = in.below(2);
  Buffer qo = make_tensor(in, dt, {d.B, d.M, d.Hq, d.D}), ko = make_tensor(in, dt, {d.B, d.M, d.Hkv, d.D});
  count(posenc_rope_qk(p, &q.t, with_k ? &k.t : nullptr, with_pos ? &pos.t : nullptr, offsets[in.below(4)],
                       in_place ? &q.t : &qo.t, with_k ? (in_place ? &k.t : &ko.t) : nullptr, in.below(2)));
  posenc_rope_params_free(p);
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  posenc::set_num_threads(1);
  build_vocabulary();
  if (std::getenv("POSENC_FUZZ_STATS") != nullptr)
    std::atexit([] { std::fprintf(stderr, "fuzz_capi: %ld of %ld calls returned POSENC_OK\n", g_ok, g_calls); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  const bool rope = in.below(4) == 0;
  Dims d{1 + in.below(2), 1 + in.below(5), 1 + in.below(5), 1 + in.below(4), 1, 2 * (1 + in.below(4))};
  d.Hkv = in.below(2) ? d.Hq : 1;
  return rope ? call_rope(in, d) : call_attention(in, d);
}
