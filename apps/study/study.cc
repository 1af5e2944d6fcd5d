// The study (posenc/study.h): corpus loading, training one model per encoding, evaluation by length.
#include "study/study.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>

#include "core/format.h"

namespace posenc {
namespace {

using I = std::int64_t;
inline std::size_t ix(I i) { return static_cast<std::size_t>(i); }

// Whitespace runs (space, tab, newline, carriage return) become one space; the text is trimmed.
std::string fold_whitespace(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  bool space = false;
  for (char ch : s) {
    if (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out.push_back(' ');
    space = false;
    out.push_back(ch);
  }
  return out;
}

// The length of the longest prefix of s that is well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing past U+10FFFF); s.size() when all of it is.
std::size_t utf8_prefix(const std::string& s) {
  std::size_t i = 0;
  const std::size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return i;
    if (i + std::size_t(len) > n) return i;
    const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
    if (c1 < lo || c1 > hi) return i;
    for (int k = 2; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + std::size_t(k)]) & 0xC0) != 0x80) return i;
    i += std::size_t(len);
  }
  return n;
}

}  // namespace

Corpus corpus_from_text(std::string name, const std::string& text) {
  Corpus c;
  c.name = std::move(name);
  const std::string t = fold_whitespace(text);
  const std::size_t cut = t.size() - t.size() / 10;
  for (std::size_t i = 0; i < t.size(); ++i)
    (i < cut ? c.train : c.held).push_back(static_cast<unsigned char>(t[i]));
  return c;
}

Expected<Corpus> load_corpus(const std::string& path) {
  std::string text;
  if (path.empty()) {
    std::unique_ptr<FILE, int (*)(FILE*)> p(popen("bible 'Gen1:1-Rev22:21' 2>/dev/null", "r"), pclose);
    if (p) {
      char buf[1 << 16];
      std::size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, p.get())) > 0) text.append(buf, n);
    }
    if (text.size() < 1000000)
      return Status::Io("corpus", "the built-in corpus needs Debian's bible-kjv (apt-get install "
                                  "bible-kjv); or give a UTF-8 text file with --corpus");
    return corpus_from_text("bible-kjv", text);
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return Status::Invalid("corpus", path + " is a directory");
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::Io("corpus", "cannot read " + path);
  // Read in blocks up to a bound (60 times the Bible; the study's models are tiny): a device or pipe
  // without end (/dev/zero) would grow without one. A regular file says its size first.
  constexpr std::size_t kMaxCorpus = std::size_t{1} << 28;
  const auto too_big = [&] {
    return Status::OutOfRange("corpus", path + " holds more than 2^28 bytes (256 MiB), the most a corpus may");
  };
  if (std::filesystem::is_regular_file(path, ec) && std::filesystem::file_size(path, ec) > kMaxCorpus && !ec)
    return too_big();
  char block[1 << 16];
  while (f.read(block, sizeof block) || f.gcount() > 0) {
    text.append(block, static_cast<std::size_t>(f.gcount()));
    if (text.size() > kMaxCorpus) return too_big();
  }
  if (f.bad()) return Status::Io("corpus", "cannot read " + path);
  if (const std::size_t bad = utf8_prefix(text); bad < text.size())
    return Status::Invalid("corpus", path + " is not UTF-8 text (an invalid byte sequence at offset " +
                                         std::to_string(bad) + ")");
  Corpus c = corpus_from_text(path, text);
  if (c.held.size() < 64 || c.train.size() < 1024)
    return Status::Invalid("corpus", path + " is too short (need at least ~2 KB of text)");
  return c;
}

Batcher::Batcher(const Corpus& c, I len, I batch, std::uint64_t seed)
    : c_(&c), len_(len), batch_(batch), rng_(seed * 0x9E3779B97F4A7C15ull + 1) {}

void Batcher::next(std::int32_t* tok, std::int32_t* tgt) {
  for (I b = 0; b < batch_; ++b) {
    const std::size_t s = rng_() % (c_->train.size() - ix(len_) - 1);
    for (I i = 0; i < len_; ++i) {
      tok[b * len_ + i] = c_->train[s + ix(i)];
      tgt[b * len_ + i] = c_->train[s + ix(i) + 1];
    }
  }
}

Expected<double> train_step(Model<float>& m, AdamW& opt, const std::int32_t* tok, const std::int32_t* tgt,
                            I B, I L, double* grad_norm) {
  Expected<LossSum> r = m.forward_backward(tok, tgt, B, L);
  if (!r.ok()) return r.status();
  const double norm = opt.step(m.params(), m.grads());
  if (grad_norm) *grad_norm = norm;
  const double loss = r.value().nll / double(r.value().count);
  if (!std::isfinite(loss)) return Status::Internal("training diverged (loss " + format_number(loss) + ")");
  return loss;
}

Expected<double> held_out_ppl(Model<float>& model, const Corpus& corpus, I E, I len) {
  // E / len contiguous windows: a [windows, len] view of the held-out bytes, targets one byte on.
  Expected<LossSum> r = model.forward(corpus.held.data(), corpus.held.data() + 1, E / len, len);
  if (!r.ok()) return r.status();
  return std::exp(r.value().nll / double(r.value().count));
}

Status task_batch(Task task, I len, I batch, std::mt19937_64& rng, std::int32_t* tok, std::int32_t* tgt) {
  for (I b = 0; b < batch; ++b) POSENC_RETURN_IF_ERROR(make_example(task, len, rng, &tok[ix(b * len)], &tgt[ix(b * len)]));
  return Status::Ok();
}

namespace {

// Accuracy (argmax) and perplexity of `model` on n task examples of len bytes from rng.
Expected<EvalPoint> task_point(Model<float>& model, Task task, I len, I n, std::mt19937_64& rng,
                               std::optional<double> depth) {
  EvalPoint pt;
  pt.len = len;
  pt.depth = depth;
  std::vector<std::int32_t> et(ix(n * len)), eg(ix(n * len));
  for (I b = 0; b < n; ++b)
    POSENC_RETURN_IF_ERROR(make_example(task, len, rng, &et[ix(b * len)], &eg[ix(b * len)], depth));
  Expected<LossSum> r = model.forward(et.data(), eg.data(), n, len);
  if (!r.ok()) return r.status();
  const std::vector<float>& p = model.probs();
  const I V = model.config().vocab;
  I right = 0, total = 0;
  for (I i = 0; i < n * len; ++i) {
    if (eg[ix(i)] < 0) continue;
    const float* row = &p[ix(i * V)];
    right += std::max_element(row, row + V) - row == eg[ix(i)];
    ++total;
  }
  pt.acc = double(right) / double(std::max<I>(total, 1));
  pt.ppl = std::exp(r.value().nll / double(std::max<I>(r.value().count, 1)));
  return pt;
}

}  // namespace

Expected<std::vector<EvalPoint>> evaluate_at(const StudyConfig& cfg, const Corpus& corpus, Model<float>& model, I len,
                                             std::uint64_t seed, std::mt19937_64& task_rng, bool runs) {
  std::vector<EvalPoint> out(1);
  out[0].len = len;
  if (cfg.task && *cfg.task == Task::kPasskey)
    for (double d : passkey_depths()) {
      out.emplace_back();
      out.back().len = len;
      out.back().depth = d;
    }
  if (!runs) return out;
  if (!cfg.task) {
    const I E = std::min<I>(cfg.eval_tokens, I(corpus.held.size()) - 1);
    if (len > E) return Status::Invalid("eval-tokens", "fewer held-out bytes than the longest evaluation length");
    Expected<double> ppl = held_out_ppl(model, corpus, E, len);
    if (!ppl.ok()) return ppl.status();
    out[0].ppl = ppl.value();
    return out;
  }
  for (EvalPoint& pt : out) {
    std::mt19937_64 depth_rng(seed * 0x9E3779B97F4A7C15ull + 4);
    Expected<EvalPoint> r = task_point(model, *cfg.task, len, cfg.eval_examples, pt.depth ? depth_rng : task_rng, pt.depth);
    if (!r.ok()) return r.status();
    pt = r.value();
  }
  return out;
}

Expected<StudyResult> run_one(const StudyConfig& cfg, const Corpus& corpus, Encoding e, std::uint64_t seed,
                              std::size_t index, const StudyProgress& progress) {
  ModelConfig mc = cfg.model;
  mc.encoding = e;
  mc.max_len = cfg.train_len;
  POSENC_RETURN_IF_ERROR(validate_config(mc));
  const I L = cfg.train_len, B = cfg.batch;
  if (!cfg.task && I(corpus.train.size()) < L + 2) return Status::Invalid("train-len", "longer than the training text");
  Model<float> model(mc, seed);
  AdamWConfig oc = cfg.opt;
  oc.total = cfg.steps;
  AdamW opt(oc, model.layout(), model.params().size());
  Batcher batches(corpus, L, B, seed);
  std::mt19937_64 task_rng(seed * 0x9E3779B97F4A7C15ull + 2);
  std::vector<std::int32_t> tok(ix(B * L)), tgt(ix(B * L));
  std::vector<double> recent;
  const auto t0 = std::chrono::steady_clock::now();
  for (I step = 0; step < cfg.steps; ++step) {
    if (cfg.task) {
      POSENC_RETURN_IF_ERROR(task_batch(*cfg.task, L, B, task_rng, tok.data(), tgt.data()));
    } else {
      batches.next(tok.data(), tgt.data());
    }
    Expected<double> r = train_step(model, opt, tok.data(), tgt.data(), B, L);
    if (!r.ok()) return r.status();
    const double loss = r.value();
    recent.push_back(loss);
    if (recent.size() > 20) recent.erase(recent.begin());
    if (progress) progress(index, step + 1, loss);
  }
  StudyResult res;
  res.name = encoding_info(e).name;
  res.encoding = e;
  res.seeds = {seed};
  res.train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.tokens_per_second = double(cfg.steps * B * L) / res.train_seconds;
  for (double x : recent) res.final_train_loss += x / double(recent.size());

  std::mt19937_64 eval_rng(seed * 0x9E3779B97F4A7C15ull + 3);  // a task's examples, the same for every encoding
  if (!cfg.task && cfg.eval_multiples.back() * L > std::min<I>(cfg.eval_tokens, I(corpus.held.size()) - 1))
    return Status::Invalid("eval-tokens", "fewer held-out bytes than the longest evaluation length");
  for (I mult : cfg.eval_multiples) {
    const I len = mult * L;
    const bool runs = !(e == Encoding::kLearned && len > mc.max_len);
    Expected<std::vector<EvalPoint>> pts = evaluate_at(cfg, corpus, model, len, seed, eval_rng, runs);
    if (!pts.ok()) return pts.status();
    for (EvalPoint& p : pts.value()) res.eval.push_back(p);
    if (progress && runs) progress(index, cfg.steps + 1, res.final_train_loss);
  }
  return res;
}

}  // namespace posenc
