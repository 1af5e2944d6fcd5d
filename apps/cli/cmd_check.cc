// posenc check — the articles' four properties of a positional encoding, measured per encoding of the
// catalogue and printed as a table (“语言模型为什么需要位置编码”,
// docs/articles.md, lists them):
//   unique     a distinct code per position: the smallest distance between the codes of two positions
//              in [0, --len) (absolute: table rows; rope: R(p)·x for a fixed x; rope2d, mrope, xpos: their
//              rotation of x at positions p in every component, xpos as queries). Bias encodings have
//              no per-position code: they only see offsets.
//   relative   offsets as a fixed relation. Absolute encodings: is PE(p + k) a fixed linear map of PE(p)?
//              the worst relative residual of the least-squares map over k ∈ {1, 7, 31}. Encodings
//              inside attention: does the output depend on offsets only? max |Δout| when every position
//              shifts by 1000 (random q, k, v; 0 up to rounding means yes).
//   extrapolate  from the last study (--study DIR, default study-out): perplexity at the longest
//              evaluated length over perplexity at the training length. A missing default folder
//              prints "no study in study-out"; a --study DIR that is missing, not a folder or without a
//              results.json is an error, and so is a results.json that is not the study's shape (checked
//              whole before any output).
//   dims       the position dimensions the encoding takes here (rope2d: 2D (x, y); mrope: 3D (t, h, w)).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include "cli/cli_common.h"
#include "study/results.h"

namespace posenc::cli {
namespace {

using I = std::int64_t;

struct CheckState {
  std::string len, dim, study = "study-out";
  CLI::Option* study_opt = nullptr;
};

std::vector<double> randn(std::size_t n, std::uint64_t seed, double sd = 1.0) {
  std::mt19937_64 r(seed);
  std::vector<double> v(n);
  for (double& x : v) {  // Box–Muller on our own uniforms: the same numbers on every platform
    const double u1 = (double(r() >> 11) + 0.5) * 0x1.0p-53, u2 = (double(r() >> 11) + 0.5) * 0x1.0p-53;
    x = sd * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
  }
  return v;
}

// Smallest pairwise L2 distance between rows of codes [N, D].
double min_distance(const std::vector<double>& codes, I N, I D) {
  double best = INFINITY;
  for (I i = 0; i < N; ++i)
    for (I j = i + 1; j < N; ++j) {
      double s = 0;
      for (I c = 0; c < D; ++c) s += (codes[std::size_t(i * D + c)] - codes[std::size_t(j * D + c)]) *
                                     (codes[std::size_t(i * D + c)] - codes[std::size_t(j * D + c)]);
      best = std::min(best, std::sqrt(s));
    }
  return best;
}

// Worst relative residual ‖Y − X·M‖/‖Y‖ of the least-squares linear map M from rows p to rows p + k.
double linear_map_residual(const std::vector<double>& codes, I N, I D) {
  double worst = 0;
  for (I k : {1, 7, 31}) {
    const I R = N - k;
    if (R < D + 1) continue;
    // normal equations (XᵀX + εI) M = XᵀY, solved by Cholesky
    std::vector<double> A(std::size_t(D * D), 0.0), Bm(std::size_t(D * D), 0.0);
    for (I r = 0; r < R; ++r)
      for (I a = 0; a < D; ++a) {
        const double xa = codes[std::size_t(r * D + a)];
        for (I b = 0; b < D; ++b) {
          A[std::size_t(a * D + b)] += xa * codes[std::size_t(r * D + b)];
          Bm[std::size_t(a * D + b)] += xa * codes[std::size_t((r + k) * D + b)];
        }
      }
    for (I a = 0; a < D; ++a) A[std::size_t(a * D + a)] += 1e-9;
    for (I j = 0; j < D; ++j) {  // A = LLᵀ in place (lower)
      for (I t = 0; t < j; ++t) A[std::size_t(j * D + j)] -= A[std::size_t(j * D + t)] * A[std::size_t(j * D + t)];
      const double djj = std::sqrt(std::max(A[std::size_t(j * D + j)], 1e-300));
      A[std::size_t(j * D + j)] = djj;
      for (I i = j + 1; i < D; ++i) {
        double s = A[std::size_t(i * D + j)];
        for (I t = 0; t < j; ++t) s -= A[std::size_t(i * D + t)] * A[std::size_t(j * D + t)];
        A[std::size_t(i * D + j)] = s / djj;
      }
    }
    for (I col = 0; col < D; ++col) {  // forward then back substitution, column by column of B
      std::vector<double> y(static_cast<std::size_t>(D));
      for (I i = 0; i < D; ++i) {
        double s = Bm[std::size_t(i * D + col)];
        for (I t = 0; t < i; ++t) s -= A[std::size_t(i * D + t)] * y[std::size_t(t)];
        y[std::size_t(i)] = s / A[std::size_t(i * D + i)];
      }
      for (I i = D - 1; i >= 0; --i) {
        double s = y[std::size_t(i)];
        for (I t = i + 1; t < D; ++t) s -= A[std::size_t(t * D + i)] * Bm[std::size_t(t * D + col)];
        Bm[std::size_t(i * D + col)] = s / A[std::size_t(i * D + i)];
      }
    }
    double err = 0, norm = 0;
    for (I r = 0; r < R; ++r)
      for (I b = 0; b < D; ++b) {
        double pred = 0;
        for (I a = 0; a < D; ++a) pred += codes[std::size_t(r * D + a)] * Bm[std::size_t(a * D + b)];
        const double yv = codes[std::size_t((r + k) * D + b)];
        err += (yv - pred) * (yv - pred);
        norm += yv * yv;
      }
    worst = std::max(worst, std::sqrt(err / norm));
  }
  return worst;
}

// max |out(positions + 1000) − out(positions)| of the attention with this encoding.
double shift_error(Encoding e) {
  const I B = 1, L = 24, H = 4, D = 16, R = 8, npos = 12;
  std::vector<double> q = randn(std::size_t(B * L * H * D), 1), k = randn(q.size(), 2), v = randn(q.size(), 3);
  std::vector<double> w = randn(std::size_t(32 * H), 4, 0.5), u = randn(std::size_t(H * D), 5, 0.3),
                      vb = randn(std::size_t(H * D), 6, 0.3), W = randn(std::size_t(H * D * R), 7, 0.3),
                      tab = randn(std::size_t(npos * D), 8, 0.5);
  AttentionParams p;
  p.encoding = e;
  p.causal = true;
  p.mrope.mrope_section = {D / 2 - 2 * (D / 6), D / 6, D / 6};  // Qwen2-VL's proportions, about
  EncodingTensors t;
  if (e == Encoding::kT5) t.weights = View::contiguous(w.data(), DType::kF64, {32, H});
  if (e == Encoding::kXL) {
    t.u = View::contiguous(u.data(), DType::kF64, {H, D});
    t.v = View::contiguous(vb.data(), DType::kF64, {H, D});
    t.rel_proj = View::contiguous(W.data(), DType::kF64, {H, D, R});
  }
  if (e == Encoding::kCope) t.table = View::contiguous(tab.data(), DType::kF64, {npos, D});
  // kerple: log kernel, r1, r2 positive; fire: width 8, the paper's initial c = 0.1 and L = 512 (its
  // normaliser ψ(max(L, i)) sees the query's position: a shift past L changes the output).
  std::vector<double> r1 = {0.5, 1.0, 1.5, 2.0}, r2 = {0.1, 0.3, 0.6, 0.9};
  const I FW = 8;
  std::vector<double> fw1 = randn(std::size_t(FW), 9), fb1 = randn(std::size_t(FW), 10, 0.5),
                      fw2 = randn(std::size_t(H * FW), 11, 0.5), fb2 = randn(std::size_t(H), 12, 0.5),
                      fc = {0.1}, fL = {512.0};
  if (e == Encoding::kKerple) {
    t.r1 = View::contiguous(r1.data(), DType::kF64, {H});
    t.r2 = View::contiguous(r2.data(), DType::kF64, {H});
  }
  if (e == Encoding::kFire) {
    t.fire.w1 = View::contiguous(fw1.data(), DType::kF64, {FW});
    t.fire.b1 = View::contiguous(fb1.data(), DType::kF64, {FW});
    t.fire.w2 = View::contiguous(fw2.data(), DType::kF64, {H, FW});
    t.fire.b2 = View::contiguous(fb2.data(), DType::kF64, {H});
    t.fire.c = View::contiguous(fc.data(), DType::kF64, {1});
    t.fire.threshold = View::contiguous(fL.data(), DType::kF64, {1});
  }
  std::vector<double> o1(q.size()), o2(q.size());
  const auto view = [&](std::vector<double>& x) { return View::contiguous(x.data(), DType::kF64, {B, L, H, D}); };
  check_lib(attention_forward(p, view(q), view(k), view(v), t, view(o1)));
  p.q_offset = 1000;
  p.k_offset = 1000;
  check_lib(attention_forward(p, view(q), view(k), view(v), t, view(o2)));
  double m = 0;
  for (std::size_t i = 0; i < o1.size(); ++i) m = std::max(m, std::fabs(o1[i] - o2[i]));
  return m;
}

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

// One line of the table: columns padded to their widths (a longer cell pushes the rest right).
std::string row(const std::string& a, const std::string& b, const std::string& c, const std::string& d,
                const std::string& e) {
  std::string line;
  const auto cell = [&](const std::string& text, std::size_t width) {
    line += text;
    line.append(text.size() < width ? width - text.size() : 0, ' ');
    line += ' ';
  };
  cell(a, 11);
  cell(b, 46);
  cell(c, 44);
  cell(d, 28);
  return line + e + "\n";
}

// The extrapolation column from a study's results.json, read and checked whole before the table is
// printed: `missing` says why there is no study (the default folder absent), else by_name holds one
// cell per encoding. A malformed file is an error naming --study and the field.
struct StudyColumn {
  std::string missing;
  std::map<std::string, std::string> by_name;
};

StudyColumn read_study(const std::string& dir, bool named) {
  const std::string path = dir + "/results.json";
  StudyColumn out;
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::status(path, ec))) {
    if (named)  // a folder the user names must hold a study
      fail(Status::Io("--study", "no results.json in " + dir + " (expected posenc study's output directory)"));
    out.missing = "no study in " + dir;
    return out;
  }
  for (const StudyEntry& r : take_study(read_results_json(path))) {
    const EvalPoint& a = r.eval.front();
    const EvalPoint& b = r.eval.back();
    const std::string bl = std::to_string(b.len), al = std::to_string(a.len);
    std::string cell;
    if (!a.ppl)
      cell = "cannot run at " + al;
    else if (!b.ppl)
      cell = "cannot run at " + bl;
    else
      cell = num(*b.ppl / *a.ppl) + "x ppl at " + bl + " vs " + al;
    out.by_name[r.encoding] = cell;
  }
  return out;
}

void run_check(const CheckState& st) {
  const I N = st.len.empty() ? 256 : parse_int("--len", st.len);
  if (N < 40 || N > 4096) fail(Status::Invalid("--len", "expected 40 .. 4096, got " + std::to_string(N)));
  const I D = st.dim.empty() ? 64 : parse_int("--dim", st.dim);
  if (D < 2 || D > 512 || D % 2)
    fail(Status::Invalid("--dim", "expected an even number in 2 .. 512, got " + std::to_string(D)));
  // The default folder may well not exist yet (no study run): the column says so. A folder the user
  // names must exist.
  if (st.study_opt->count() > 0) {
    std::error_code ec;
    if (!std::filesystem::exists(st.study, ec))
      fail(Status::Io("--study", "no such directory: '" + st.study + "' (expected posenc study's output directory)"));
    if (!std::filesystem::is_directory(st.study, ec))
      fail(Status::Io("--study", "'" + st.study + "' is not a directory (expected posenc study's output directory)"));
  }
  const StudyColumn study = read_study(st.study, st.study_opt->count() > 0);
  // The whole table is built before any of it is printed: a failure leaves stdout empty.
  std::string table = row("encoding", "unique code per position", "relative offsets", "extrapolation (study)", "dims");
  for (const EncodingInfo& info : registry()) {
    const Encoding e = info.id;
    std::string uniq, rel;
    std::vector<double> codes(std::size_t(N * D));
    if (e == Encoding::kSinusoidal || e == Encoding::kLearned || e == Encoding::kRope) {
      if (e == Encoding::kSinusoidal)
        check_lib(sinusoidal_table(SinusoidalParams{}, Positions{}, View::contiguous(codes.data(), DType::kF64, {N, D})));
      else if (e == Encoding::kLearned)
        codes = randn(codes.size(), 9, 0.02);  // a freshly initialised table: any trained one differs
      else {  // R(p)·x for x = (1, …, 1)
        std::vector<double> x(codes.size(), 1.0);
        check_lib(rope_forward(RopeParams{}, View::contiguous(x.data(), DType::kF64, {1, N, 1, D}), Positions{},
                               View::contiguous(codes.data(), DType::kF64, {1, N, 1, D})));
      }
      uniq = "yes: min distance " + num(min_distance(codes, N, D));
      if (e == Encoding::kLearned) uniq += " (only rows < max_len)";
    } else if (e == Encoding::kRope2d || e == Encoding::kMrope || e == Encoding::kXpos) {
      // The rotation of x = (1, …, 1) at positions p (in every component), default parameters.
      std::vector<double> x(codes.size(), 1.0);
      const View xv = View::contiguous(x.data(), DType::kF64, {1, N, 1, D});
      const View cv = View::contiguous(codes.data(), DType::kF64, {1, N, 1, D});
      Status s;
      if (e == Encoding::kRope2d) {
        Rope2dParams p2;
        p2.rope.rotary_dim = D - D % 4;
        s = D >= 4 ? rope2d_forward(p2, xv, Positions{}, View{}, cv) : Status::Invalid("--dim", "rope2d needs D >= 4");
      } else if (e == Encoding::kMrope) {
        MropeParams pm;
        pm.mrope_section = {D / 2 - 2 * (D / 6), D / 6, D / 6};
        s = mrope_forward(pm, xv, Positions{}, cv);
      } else {
        s = xpos_forward(XposParams{}, XposRole::kQuery, xv, Positions{}, cv);
      }
      uniq = s.ok() ? "yes: min distance " + num(min_distance(codes, N, D)) : "n/a: " + s.message();
    } else if (e == Encoding::kNope) {
      uniq = "no: no position at all";
    } else if (e == Encoding::kCope) {
      uniq = "no: counts of gated tokens";
    } else if (e == Encoding::kFire) {
      uniq = "no: offsets over psi(max(L, query))";
    } else {
      uniq = "no: sees offsets only";
    }
    if (e == Encoding::kSinusoidal || e == Encoding::kLearned) {
      const double r = linear_map_residual(codes, N, D);
      rel = (r < 1e-6 ? "yes: PE(p+k) = M_k PE(p), residual " : "no: best linear map leaves ") + num(r);
    } else if (e == Encoding::kNope) {
      rel = "n/a (order only through the mask)";
    } else {
      const double s = shift_error(e);
      rel = (s < 1e-9 ? "yes: shift by 1000 changes out by " : "no: shift by 1000 changes out by ") + num(s);
    }
    std::string ext = study.missing;
    if (ext.empty()) {
      const auto it = study.by_name.find(info.name);
      ext = it == study.by_name.end() ? "not in the study" : it->second;
    }
    const char* dims = e == Encoding::kRope2d ? "2D (x, y)" : e == Encoding::kMrope ? "3D (t, h, w)" : "1D";
    table += row(info.name, uniq, rel, ext, dims);
  }
  std::fputs(table.c_str(), stdout);
}

}  // namespace

Command add_check_command(CLI::App& root) {
  auto st = std::make_shared<CheckState>();
  CLI::App* app = root.add_subcommand("check", "measure the articles' four properties for every encoding");
  add_text(app, "--len", &st->len, "positions compared, 40 .. 4096 (default 256)", "INT");
  add_text(app, "--dim", &st->dim, "code dimension, even, 2 .. 512 (default 64)", "INT");
  st->study_opt = add_text(app, "--study", &st->study, "the study's output directory (default study-out)", "DIR");
  return {app, [st] { run_check(*st); }};
}

}  // namespace posenc::cli
