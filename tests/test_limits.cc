// Resources (docs/reliability.md, Limits): sizes whose buffers cannot exist are refused before
// anything is allocated, with an error naming the argument; an allocation that fails is
// POSENC_ERR_NOMEM, never the end of the process. The broadcast (stride 0) views below describe
// enormous tensors over a few bytes, as a caller's expanded tensor can.
#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "posenc/absolute.h"
#include "posenc/attention.h"
#include "posenc/bias.h"
#include "posenc/c_api.h"
#include "posenc/rotary.h"
#include "posenc/threads.h"

extern char** environ;

namespace posenc {
namespace {

// While set, an allocation of 1 KiB or more through operator new on an OpenMP worker thread (not a
// team's primary thread) throws std::bad_alloc: a failure inside a parallel region, on demand.
std::atomic<bool> g_fail_on_workers{false};

}  // namespace
}  // namespace posenc

void* operator new(std::size_t n) {
  if (posenc::g_fail_on_workers.load(std::memory_order_relaxed) && n >= 1024 && omp_in_parallel() &&
      omp_get_thread_num() > 0)
    throw std::bad_alloc();
  if (void* p = std::malloc(n > 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
// The pair malloc/free matches: GCC cannot see it through the inlined operators.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace posenc {
namespace {

using I = std::int64_t;

// A float32 [B, L, H, D] tensor over `data`, every stride 0 but the last (1): L × H rows of one row.
posenc_tensor broadcast(float* data, I B, I L, I H, I D) {
  posenc_tensor t{};
  t.data = data;
  t.dtype = POSENC_F32;
  t.ndim = 4;
  const I shape[4] = {B, L, H, D}, strides[4] = {0, 0, 0, 1};
  for (int i = 0; i < 4; ++i) t.shape[i] = shape[i], t.strides[i] = strides[i];
  return t;
}

posenc_tensor contiguous(float* data, I B, I L, I H, I D) {
  posenc_tensor t = broadcast(data, B, L, H, D);
  t.strides[0] = L * H * D, t.strides[1] = H * D, t.strides[2] = D;
  return t;
}

// One forward through the C ABI; its code, and the message in *msg. Must come back at once (nothing
// was allocated for the sizes).
int forward(const char* enc, const posenc_tensor& q, const posenc_tensor& k, const posenc_tensor& out,
            std::string* msg) {
  posenc_attention_params* p = posenc_attention_params_new(enc);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = posenc_attention_forward(p, &q, &k, &k, &out, nullptr);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *msg = posenc_last_error();
  posenc_attention_params_free(p);
  EXPECT_LT(s, 0.5) << *msg;
  return rc;
}

TEST(Limits, TensorsBeyondTwoToTheFortyElementsAreRefused) {
  std::vector<float> row(64, 1.f), outbuf(64);
  const posenc_tensor out = contiguous(outbuf.data(), 1, 1, 1, 64);
  std::string msg;
  // q of 2^41 × 64 elements: to_view refuses it by name
  EXPECT_EQ(forward("rope", broadcast(row.data(), 1, I{1} << 41, 1, 64), broadcast(row.data(), 1, 1, 1, 64), out, &msg),
            POSENC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(msg, "q: shape [1, 2199023255552, 1, 64] has more than 2^40 elements (POSENC_MAX_ELEMENTS)");
  // a product beyond int64: refused, not wrapped around
  EXPECT_EQ(forward("nope", broadcast(row.data(), 1, 1, 1, 64),
                    broadcast(row.data(), I{1} << 40, I{1} << 40, 1, 64), out, &msg),
            POSENC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(msg.rfind("k: shape [1099511627776, 1099511627776, 1, 64] has more than 2^40 elements", 0), 0u) << msg;
}

TEST(Limits, WorkspacesBeyondTheLimitAreRefusedByName) {
  std::vector<float> row(8192, 1.f), outbuf(8192);
  std::string msg;
  // D beyond 4096: the fused kernels' per-thread tiles grow with it
  EXPECT_EQ(forward("nope", broadcast(row.data(), 1, 1, 1, 8192), broadcast(row.data(), 1, 1, 1, 8192),
                    contiguous(outbuf.data(), 1, 1, 1, 8192), &msg),
            POSENC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(msg, "q: head dimension D = 8192 is beyond the limit 4096 (2^12)");
  // k of 2^36 × 8 elements is within the limit, but expanded to 2^21 query heads it is not. (The
  // outputs below describe more memory than their buffers hold: the call is refused before any
  // output is touched.)
  posenc_tensor q = broadcast(row.data(), 1, 1, I{1} << 21, 8), k = broadcast(row.data(), 1, I{1} << 36, 1, 8);
  posenc_tensor out = broadcast(outbuf.data(), 1, 1, I{1} << 21, 8);
  out.strides[2] = 8;  // an output's elements at distinct addresses
  EXPECT_EQ(forward("alibi", q, k, out, &msg), POSENC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(msg.rfind("k: k expanded to the Hq query heads ([B, N, Hq, D]) has more than 2^40 elements", 0), 0u) << msg;
  // the per-head distance tables [Hq, M + N]
  q = broadcast(row.data(), 1, I{1} << 20, I{1} << 20, 1);
  k = broadcast(row.data(), 1, I{1} << 20, 1, 1);
  out = broadcast(outbuf.data(), 1, I{1} << 20, I{1} << 20, 1);
  out.strides[1] = I{1} << 20, out.strides[2] = 1;
  EXPECT_EQ(forward("sandwich", q, k, out, &msg), POSENC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(msg.rfind("k: the distance tables [Hq, M + N] have more than 2^40 elements", 0), 0u) << msg;
}

// The C++ API refuses the same sizes with the same Status (the reference and the fast path alike).
TEST(Limits, TheCppApiRefusesTheSameSizes) {
  std::vector<float> row(8192, 1.f);
  View q = View::contiguous(row.data(), DType::kF32, {1, 1, 1, 8192});
  AttentionParams p;
  const Status fast = attention_forward(p, q, q, q, {}, q, View{});
  const Status ref = reference::attention_forward(p, q, q, q, {}, q, View{});
  EXPECT_EQ(fast.code(), Code::kOutOfRange);
  EXPECT_EQ(fast.message(), "q: head dimension D = 8192 is beyond the limit 4096 (2^12)");
  EXPECT_EQ(ref.message(), fast.message());
}

// The elementwise encodings and the biases refuse what the C ABI refuses, before allocating: more
// than 2^40 elements (a broadcast dimension counted in full), strides reaching past 2^63 bytes, an
// ndim beyond 6 (named, its shape not read); and mrope_positions a grid of more than 2^31 tokens.
TEST(Limits, ElementwiseAndBiasEntryPointsRefuseTheSameSizes) {
  std::vector<float> a(64, 1.f), b(64, 0.f);
  View x = View::contiguous(a.data(), DType::kF32, {1, I{1} << 40, 2, 8}), y = View::contiguous(b.data(), DType::kF32, {1, 1, 2, 8});
  x.strides[0] = x.strides[1] = 0;  // every position the same row
  y.shape = x.shape, y.strides = x.strides;
  Status s = rope2d_forward({}, x, {}, {}, y);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.arg(), "x");
  View x3 = View::contiguous(a.data(), DType::kF32, {I{1} << 20, I{1} << 21, 8}), y3 = x3;
  x3.strides = y3.strides = {0, 0, 1, 0, 0, 0};
  EXPECT_EQ(sinusoidal_forward({}, x3, {}, y3).code(), Code::kOutOfRange);
  View big = View::contiguous(b.data(), DType::kF32, {I{1} << 10, I{1} << 16, I{1} << 16});
  big.strides = {0, 0, 0, 0, 0, 0};
  BiasGeometry g;
  g.heads = I{1} << 10, g.q_len = g.k_len = I{1} << 16;
  EXPECT_EQ(alibi_bias({}, g, {}, {}, big).code(), Code::kOutOfRange);
  // a batch stride of 2^62 floats: the second row's address would wrap
  View w = View::contiguous(a.data(), DType::kF32, {2, 1, 1, 8}), wy = View::contiguous(b.data(), DType::kF32, {2, 1, 1, 8});
  w.strides[0] = I{1} << 62;
  s = rope2d_forward({}, w, {}, {}, wy);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.arg(), "x");
  for (float e : b) EXPECT_EQ(e, 0.f);
  View odd = View::contiguous(a.data(), DType::kF32, {1, 2, 2, 8});
  odd.ndim = 99;
  s = rope2d_forward({}, odd, {}, {}, wy);
  EXPECT_EQ(s.arg(), "x");
  EXPECT_NE(s.message().find("ndim 99"), std::string::npos) << s.message();
  MropeSegment grid{MropeSegment::Kind::kImage, 0, I{1} << 30, I{1} << 30, I{1} << 30};
  auto m = mrope_positions({grid});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().arg(), "segments");
  EXPECT_NE(m.status().message().find("too large"), std::string::npos) << m.status().message();
}

// An allocation that fails on a worker thread inside a parallel region (a region's per-thread tiles
// and buffers) is POSENC_ERR_NOMEM from the call, not std::terminate; the same call succeeds after.
// D = 2000 is used by no other test, so that no worker thread holds tiles of that size already.
TEST(Limits, AllocationFailingOnAWorkerThreadIsAnErrorCode) {
  set_num_threads(2);
  const I M = 256, N = 256, D = 2000;
  std::vector<float> q(static_cast<std::size_t>(M * D)), out(q.size()), dq(q.size()), dk(q.size()), dv(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 37) % 101) / 101.f - 0.5f;
  const posenc_tensor tq = contiguous(q.data(), 1, M, 1, D), to = contiguous(out.data(), 1, M, 1, D),
                      tdq = contiguous(dq.data(), 1, M, 1, D), tdk = contiguous(dk.data(), 1, N, 1, D),
                      tdv = contiguous(dv.data(), 1, N, 1, D);
  std::vector<double> table(static_cast<std::size_t>(8 * D), 0.01), u(static_cast<std::size_t>(D), 0.01),
      rel(static_cast<std::size_t>(D * 4), 0.01);
  auto tensor64 = [](double* data, std::initializer_list<I> shape) {
    posenc_tensor t{};
    t.data = data;
    t.dtype = POSENC_F64;
    t.ndim = static_cast<int>(shape.size());
    I stride = 1, i = t.ndim;
    for (auto it = shape.end(); it != shape.begin();) {
      --it, --i;
      t.shape[i] = *it, t.strides[i] = stride, stride *= *it;
    }
    return t;
  };
  const posenc_tensor ttable = tensor64(table.data(), {8, D}), tu = tensor64(u.data(), {1, D}),
                      trel = tensor64(rel.data(), {1, D, 4});
  for (const char* enc : {"rope", "alibi", "xl", "cope"}) {
    posenc_attention_params* p = posenc_attention_params_new(enc);
    if (std::string(enc) == "cope") {
      ASSERT_EQ(posenc_attention_set_tensor(p, "table", &ttable), POSENC_OK);
    }
    if (std::string(enc) == "xl") {
      ASSERT_EQ(posenc_attention_set_tensor(p, "u", &tu), POSENC_OK);
      ASSERT_EQ(posenc_attention_set_tensor(p, "v_bias", &tu), POSENC_OK);
      ASSERT_EQ(posenc_attention_set_tensor(p, "rel_proj", &trel), POSENC_OK);
    }
    for (bool fail : {true, false})
      for (int backward = 0; backward < 2; ++backward) {
        g_fail_on_workers = fail;
        const int rc = backward ? posenc_attention_backward(p, &tq, &tq, &tq, &tq, &tdq, &tdk, &tdv)
                                : posenc_attention_forward(p, &tq, &tq, &tq, &to, nullptr);
        g_fail_on_workers = false;
        EXPECT_EQ(rc, fail ? POSENC_ERR_NOMEM : POSENC_OK)
            << enc << (backward ? " backward" : " forward") << ": " << posenc_last_error();
      }
    posenc_attention_params_free(p);
  }
  set_num_threads(0);
}

// ---- allocation failure: a child process under an address-space limit -------------------------

long vm_size_kib() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key)
    if (key == "VmSize:") {
      long n = 0;
      f >> n;
      return n;
    }
  return -1;
}

// Runs in the child only (POSENC_OOM_CHILD=<extra KiB>): rope attention, forward and backward, of
// 16 queries over 2^16 keys, whose rotation tables take 16 MiB (broadcast inputs of a few bytes,
// real outputs), after the address space is limited to what the process holds plus the extra.
// Every call must return POSENC_OK or POSENC_ERR_NOMEM ("out of memory"); the exit status says.
TEST(Limits, OomChild) {
  const char* env = std::getenv("POSENC_OOM_CHILD");
  if (env == nullptr) GTEST_SKIP() << "run by AllocationFailureIsAnErrorCode";
  const long extra_kib = std::atol(env);
  set_num_threads(2);
  const I M = 16, N = I{1} << 16, D = 64;
  std::vector<float> row(D, 0.5f), out(static_cast<std::size_t>(M * D)), dq(out.size()),
      dk(static_cast<std::size_t>(N * D)), dv(dk.size());
  const posenc_tensor q = broadcast(row.data(), 1, M, 1, D), k = broadcast(row.data(), 1, N, 1, D);
  const posenc_tensor o = contiguous(out.data(), 1, M, 1, D), tdq = contiguous(dq.data(), 1, M, 1, D),
                      tdk = contiguous(dk.data(), 1, N, 1, D), tdv = contiguous(dv.data(), 1, N, 1, D);
  posenc_attention_params* p = posenc_attention_params_new("rope");
  ASSERT_EQ(posenc_attention_forward(p, &q, &k, &k, &o, nullptr), POSENC_OK);  // the threads exist now
  rlimit lim{};
  lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(vm_size_kib() + extra_kib) * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lim), 0);
  int nomem = 0;
  for (int backward = 0; backward < 2; ++backward) {
    const int rc = backward ? posenc_attention_backward(p, &q, &k, &k, &q, &tdq, &tdk, &tdv)
                            : posenc_attention_forward(p, &q, &k, &k, &o, nullptr);
    ASSERT_TRUE(rc == POSENC_OK || rc == POSENC_ERR_NOMEM) << rc << ": " << posenc_last_error();
    if (rc == POSENC_ERR_NOMEM) {
      ASSERT_STREQ(posenc_last_error(), "out of memory");
      ++nomem;
    }
  }
  posenc_attention_params_free(p);
  std::ofstream(std::getenv("POSENC_OOM_REPORT")) << nomem;  // for the parent
}

// The child above under several limits: from one that leaves almost nothing to one that leaves
// enough. Each must end normally (no std::terminate, no abort); with no room both calls fail
// with POSENC_ERR_NOMEM, with ample room both succeed.
TEST(Limits, AllocationFailureIsAnErrorCode) {
#if defined(__SANITIZE_ADDRESS__)  // GCC
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: RLIMIT_AS cannot apply";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)  // Clang
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: RLIMIT_AS cannot apply";
#endif
#endif
  if (std::getenv("POSENC_OOM_CHILD") != nullptr) GTEST_SKIP();
  const std::string report = testing::TempDir() + "posenc_oom_report";
  for (long extra : {0L, 4096L, 12288L, 14336L, 16384L, 18432L, 20480L, 32768L, 131072L}) {
    const std::string env = "POSENC_OOM_CHILD=" + std::to_string(extra);
    std::string report_env = "POSENC_OOM_REPORT=" + report;
    std::vector<std::string> args = {"/proc/self/exe", "--gtest_filter=Limits.OomChild"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    std::string own = env;
    envp.push_back(own.data());
    envp.push_back(report_env.data());
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    envp.push_back(nullptr);
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "extra " << extra << " KiB: " << (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                                                  : "exit " + std::to_string(WEXITSTATUS(status)));
    int nomem = -1;
    std::ifstream(report) >> nomem;
    std::printf("room %ld KiB: %d of 2 calls out of memory\n", extra, nomem);
    if (extra == 0) {
      EXPECT_EQ(nomem, 2);
    }
    if (extra == 131072L) {
      EXPECT_EQ(nomem, 0);
    }
    std::remove(report.c_str());
  }
}

}  // namespace
}  // namespace posenc
