// study/extend.cc — RoPE trained at L, evaluated longer with each scaling scheme (study/extend.h).
#include "study/extend.h"

#include <algorithm>
#include <chrono>

namespace posenc {
namespace {

using I = std::int64_t;

// A model of config mc holding `params` (a copy of a trained model's).
Model<float> with_params(const ModelConfig& mc, std::uint64_t seed, const std::vector<float>& params) {
  Model<float> m(mc, seed);
  m.params() = params;
  return m;
}

// The evaluation (study.h, evaluate_at) at every length of `params` under RoPE `rope_at(len)`; a
// task's examples are the same for every row (those of run_one).
template <class RopeAt>
Expected<std::vector<EvalPoint>> evaluate(const StudyConfig& cfg, const Corpus& corpus, ModelConfig mc,
                                          std::uint64_t seed, const std::vector<float>& params, RopeAt rope_at) {
  std::mt19937_64 task_rng(seed * 0x9E3779B97F4A7C15ull + 3);
  std::vector<EvalPoint> out;
  for (I mult : cfg.eval_multiples) {
    const I len = mult * cfg.train_len;
    mc.rope = rope_at(len);
    POSENC_RETURN_IF_ERROR(validate_config(mc));
    Model<float> m = with_params(mc, seed, params);
    Expected<std::vector<EvalPoint>> pts = evaluate_at(cfg, corpus, m, len, seed, task_rng);
    if (!pts.ok()) return pts.status();
    for (const EvalPoint& p : pts.value()) out.push_back(p);
  }
  return out;
}

// Trains `params` (config mc) for `steps` steps of `batch` windows of `len`: the corpus's windows of
// Batcher(window_seed), or a task's examples from std::mt19937_64(window_seed·φ + 2) (run_one's for
// window_seed = seed). The mean loss of the last 20 steps. Progress: `step0` + the step.
Expected<double> train(const ModelConfig& mc, const AdamWConfig& oc, const StudyConfig& cfg, const Corpus& corpus,
                       I len, I batch, I steps, std::uint64_t seed, std::uint64_t window_seed,
                       std::vector<float>& params, std::size_t index, const StudyProgress& progress, I step0) {
  Model<float> model = with_params(mc, seed, params);
  AdamW opt(oc, model.layout(), model.params().size());
  Batcher batches(corpus, len, batch, window_seed);
  std::mt19937_64 task_rng(window_seed * 0x9E3779B97F4A7C15ull + 2);
  std::vector<std::int32_t> tok(std::size_t(batch * len)), tgt(tok.size());
  std::vector<double> recent;
  for (I step = 0; step < steps; ++step) {
    if (cfg.task)
      POSENC_RETURN_IF_ERROR(task_batch(*cfg.task, len, batch, task_rng, tok.data(), tgt.data()));
    else
      batches.next(tok.data(), tgt.data());
    Expected<double> r = train_step(model, opt, tok.data(), tgt.data(), batch, len);
    if (!r.ok()) return r.status();
    recent.push_back(r.value());
    if (recent.size() > 20) recent.erase(recent.begin());
    if (progress) progress(index, step0 + step + 1, r.value());
  }
  params = model.params();
  double mean = 0;
  for (double x : recent) mean += x / double(recent.size());
  return mean;
}

StudyResult row(const std::string& name, std::uint64_t seed, double loss, std::vector<EvalPoint> eval) {
  StudyResult r;
  r.name = name;
  r.encoding = Encoding::kRope;
  r.seeds = {seed};
  r.final_train_loss = loss;
  r.eval = std::move(eval);
  return r;
}

}  // namespace

std::vector<RopeType> extend_schemes() {
  return {RopeType::kLinear, RopeType::kNtk, RopeType::kDynamic, RopeType::kYarn, RopeType::kLlama3};
}

RopeParams extend_rope(RopeType scheme, double s, I L) {
  RopeParams p;
  p.rope_type = scheme;
  p.factor = s;
  if (scheme == RopeType::kDynamic || scheme == RopeType::kYarn || scheme == RopeType::kLlama3)
    p.original_max_position = L;
  return p;
}

Expected<std::vector<StudyResult>> run_extend(const StudyConfig& cfg, const Corpus& corpus, std::uint64_t seed,
                                              std::size_t index, const StudyProgress& progress) {
  const I L = cfg.train_len;
  ModelConfig mc = cfg.model;
  mc.encoding = Encoding::kRope;
  mc.max_len = L;
  POSENC_RETURN_IF_ERROR(validate_config(mc));
  std::vector<float> base = Model<float>(mc, seed).params();
  AdamWConfig oc = cfg.opt;
  oc.total = cfg.steps;
  const auto t0 = std::chrono::steady_clock::now();
  Expected<double> loss = train(mc, oc, cfg, corpus, L, cfg.batch, cfg.steps, seed, seed, base, index, progress, 0);
  if (!loss.ok()) return loss.status();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<StudyResult> rows;
  const auto add = [&](const std::string& name, double l, auto rope_at, const std::vector<float>& params) -> Status {
    Expected<std::vector<EvalPoint>> ev = evaluate(cfg, corpus, mc, seed, params, rope_at);
    if (!ev.ok()) return ev.status();
    rows.push_back(row(name, seed, l, std::move(ev).value()));
    if (progress) progress(index, cfg.steps + 1, l);
    return Status::Ok();
  };
  POSENC_RETURN_IF_ERROR(add("rope", loss.value(), [](I) { return RopeParams{}; }, base));
  for (RopeType t : extend_schemes())
    POSENC_RETURN_IF_ERROR(add(rope_type_name(t), loss.value(),
                               [&](I len) { return extend_rope(t, double(len) / double(L), L); }, base));
  // the fine-tunes: the same steps and windows for every scheme, plain RoPE first
  AdamWConfig ft = cfg.opt;
  ft.total = std::max<I>(1, cfg.steps / 10);
  ft.warmup = ft.total / 10;
  ft.lr = cfg.opt.lr / 3;
  const I fb = std::max<I>(1, cfg.batch / 4);
  std::vector<RopeType> kinds = {RopeType::kDefault};
  for (RopeType t : extend_schemes()) kinds.push_back(t);
  for (RopeType t : kinds) {
    const RopeParams rp = t == RopeType::kDefault ? RopeParams{} : extend_rope(t, 4.0, L);
    ModelConfig fmc = mc;
    fmc.rope = rp;
    POSENC_RETURN_IF_ERROR(validate_config(fmc));
    std::vector<float> params = base;
    Expected<double> fl = train(fmc, ft, cfg, corpus, 4 * L, fb, ft.total, seed, seed + 4096, params, index,
                                StudyProgress{}, 0);
    if (!fl.ok()) return fl.status();
    const std::string name = std::string(t == RopeType::kDefault ? "rope" : rope_type_name(t)) + "+ft";
    POSENC_RETURN_IF_ERROR(add(name, fl.value(), [&](I) { return rp; }, params));
  }
  for (StudyResult& r : rows) {
    r.train_seconds = seconds;
    r.tokens_per_second = double(cfg.steps * cfg.batch * L) / seconds;
  }
  return rows;
}

}  // namespace posenc
