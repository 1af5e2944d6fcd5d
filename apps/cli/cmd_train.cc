// posenc train — train one model of the study (posenc/model.h) and print one JSON line per logged
// step, then a summary line with tokens per second: over the steps after the first when there are
// two or more (the first also sizes the activation and gradient buffers, 17 ms against ~11 ms; it is
// reported apart, as first_step_seconds), the warm-up step that scripts/train_speed.py leaves out of
// PyTorch's rate too. --save writes the trained checkpoint, --init-out the initial one,
// --dump-batches the token windows as an int32 .npy [steps, batch, len + 1]: what an independent
// implementation needs to replay the same run (scripts/train_speed.py, tests/e2e/test_train_torch.py).
// The three are written together once training has succeeded (cli/output_set.h), none otherwise.
#include <chrono>
#include <cstdio>
#include <memory>
#include <utility>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/output_set.h"
#include "study/study.h"
#include "posenc/threads.h"

namespace posenc::cli {
namespace {

struct TrainState {
  std::string encoding = "rope", d_model, n_layers, n_heads, d_ff, train_len = "64", batch = "16",
              steps = "100", lr, warmup, threads, seed = "1", corpus, save, init_out, dump, log_every = "1";
};

std::int64_t positive(const std::string& flag, const std::string& text) {
  const std::int64_t v = parse_int(flag, text);
  if (v < 1) fail(Status::Invalid(flag, "expected a positive integer, got " + text));
  return v;
}

void run_train(const TrainState& st, const CLI::App& app) {
  const std::pair<const char*, const std::string*> paths[] = {
      {"--save", &st.save}, {"--init-out", &st.init_out}, {"--dump-batches", &st.dump}, {"--corpus", &st.corpus}};
  for (const auto& [flag, value] : paths)  // given, but empty (an empty --corpus is not the built-in one)
    if (app.count(flag) > 0 && value->empty()) fail(Status::Invalid(flag, "expected a path, got an empty string"));
  Expected<EncodingInfo> info = find_encoding(st.encoding);
  if (!info.ok()) fail(Status::Invalid("--encoding", "unknown encoding '" + st.encoding + "' (see posenc list)"));
  ModelConfig mc;
  mc.encoding = info.value().id;
  if (!st.d_model.empty()) mc.d_model = positive("--d-model", st.d_model);
  if (!st.n_layers.empty()) mc.n_layers = positive("--layers", st.n_layers);
  if (!st.n_heads.empty()) mc.n_heads = positive("--heads", st.n_heads);
  if (!st.d_ff.empty()) mc.d_ff = positive("--d-ff", st.d_ff);
  const std::int64_t L = positive("--train-len", st.train_len), B = positive("--batch", st.batch),
                     steps = positive("--steps", st.steps), every = positive("--log-every", st.log_every);
  if (L < 2 || L > 4096)  // as the study's
    fail(Status::OutOfRange("--train-len", "expected 2 .. 4096, got " + std::to_string(L)));
  mc.max_len = L;
  if (Status s = validate_config(mc); !s.ok())
    fail(Status::Invalid(s.arg() == "n_heads" ? "--heads" : s.arg() == "d_model" ? "--d-model" : "--" + s.arg(),
                         s.what()));
  AdamWConfig oc;
  oc.total = steps;
  oc.warmup = std::min<std::int64_t>(50, steps / 10);
  if (!st.lr.empty()) {
    oc.lr = parse_float("--lr", st.lr);
    if (!(oc.lr > 0)) fail(Status::Invalid("--lr", "expected a positive number"));
  }
  if (!st.warmup.empty()) {
    oc.warmup = parse_int("--warmup", st.warmup);
    if (oc.warmup < 0 || oc.warmup > steps)
      fail(Status::Invalid("--warmup", "expected 0 .. --steps (" + std::to_string(steps) + "), got " + st.warmup));
  }
  const std::int64_t seed = parse_int("--seed", st.seed);
  if (seed < 0) fail(Status::Invalid("--seed", "expected a non-negative integer"));
  if (!st.threads.empty()) {
    const std::int64_t t = parse_int("--threads", st.threads);
    if (t < 1 || t > 1024) fail(Status::Invalid("--threads", "expected 1 .. 1024, got " + st.threads));
    set_num_threads(int(t));
  }
  if (Status s = training_fits(mc, B, L); !s.ok())
    fail(s.arg() == "batch" ? Status::OutOfRange("--batch", s.what() + " (--batch × --train-len)")
                            : Status::OutOfRange("--" + std::string(s.arg() == "d_ff" ? "d-ff" : "d-model"), s.what()));
  // destinations checked (distinct, writable) before any work; all written together at the end, or
  // none if training fails
  OutputSet outs;
  if (!st.corpus.empty()) note_input(st.corpus, "--corpus");  // so that no output may name it
  if (!st.save.empty()) check(outs.reserve("--save", st.save));
  if (!st.init_out.empty()) check(outs.reserve("--init-out", st.init_out));
  if (!st.dump.empty()) check(outs.reserve("--dump-batches", st.dump));
  const Corpus corpus = corpus_or_fail(st.corpus);

  Model<float> model(mc, std::uint64_t(seed));
  if (!st.init_out.empty()) outs.attach_bytes("--init-out", take(checkpoint_bytes(mc, model.params())));
  AdamW opt(oc, model.layout(), model.params().size());
  Batcher batches(corpus, L, B, std::uint64_t(seed));
  std::vector<std::int32_t> tok(std::size_t(B * L)), tgt(std::size_t(B * L));
  Tensor dump;
  if (!st.dump.empty()) {  // [steps, batch, len + 1] int32, bounded before training
    const std::vector<SizeFactor> size = {
        {"--steps", steps}, {"--batch", B}, {"--train-len", L + 1, "(--train-len + 1)"}};
    check_product(size);
    dump = within_memory(size, [&] { return Tensor(DType::kI32, {steps, B, L + 1}); });
  }
  double seconds = 0, first = 0;  // seconds: the steps after the first
  for (std::int64_t s = 0; s < steps; ++s) {
    batches.next(tok.data(), tgt.data());
    if (!st.dump.empty()) {
      auto* d = static_cast<std::int32_t*>(dump.data()) + s * B * (L + 1);
      for (std::int64_t b = 0; b < B; ++b) {
        for (std::int64_t i = 0; i < L; ++i) d[b * (L + 1) + i] = tok[std::size_t(b * L + i)];
        d[b * (L + 1) + L] = tgt[std::size_t(b * L + L - 1)];
      }
    }
    const double lr = opt.lr_at(s);
    double norm = 0;
    const auto t0 = std::chrono::steady_clock::now();
    Expected<double> step = train_step(model, opt, tok.data(), tgt.data(), B, L, &norm);
    if (!step.ok() && step.status().message().find("diverged") != std::string::npos) {  // the usual cause
      char at[96];
      std::snprintf(at, sizeof at, " at step %lld with lr %g", (long long)(s + 1), lr);
      fail(Status::OutOfRange("--lr", step.status().what() + at + "; expected a learning rate it can train with"));
    }
    const double loss = take(std::move(step));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (s == 0 ? first : seconds) += dt;
    if ((s + 1) % every == 0 || s + 1 == steps)
      std::printf("%s\n", nlohmann::json{{"step", s + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm}}.dump().c_str());
  }
  if (!st.save.empty()) outs.attach_bytes("--save", take(checkpoint_bytes(mc, model.params())));
  if (!st.dump.empty()) outs.attach("--dump-batches", &dump);
  check(outs.commit());
  std::printf("%s\n", nlohmann::json{{"encoding", info.value().name},
                                     {"steps", steps},
                                     {"batch", B},
                                     {"len", L},
                                     {"threads", num_threads()},
                                     {"seconds", first + seconds},
                                     {"first_step_seconds", first},
                                     {"tokens_per_second", steps >= 2 ? double((steps - 1) * B * L) / seconds
                                                                      : double(B * L) / first}}
                          .dump()
                          .c_str());
}

}  // namespace

Command add_train_command(CLI::App& root) {
  auto st = std::make_shared<TrainState>();
  CLI::App* app = root.add_subcommand("train", "train one study model; one JSON line per step, then tokens/s");
  add_text(app, "--encoding", &st->encoding, "the encoding (default rope)", "NAME");
  add_text(app, "--d-model", &st->d_model, "model width (default 64)", "INT");
  add_text(app, "--layers", &st->n_layers, "layers (default 2)", "INT");
  add_text(app, "--heads", &st->n_heads, "attention heads (default 4)", "INT");
  add_text(app, "--d-ff", &st->d_ff, "MLP width (default 256)", "INT");
  add_text(app, "--train-len", &st->train_len, "sequence length, 2 .. 4096 (default 64)", "INT");
  add_text(app, "--batch", &st->batch, "sequences per step (default 16)", "INT");
  add_text(app, "--steps", &st->steps, "steps (default 100)", "INT");
  add_text(app, "--lr", &st->lr, "peak learning rate (default 3e-3)", "FLOAT");
  add_text(app, "--warmup", &st->warmup, "warm-up steps (default min(50, steps/10))", "INT");
  add_text(app, "--threads", &st->threads, "threads (default: all cores)", "INT");
  add_text(app, "--seed", &st->seed, "seed of the parameters and the windows (default 1)", "INT");
  add_text(app, "--corpus", &st->corpus, "a UTF-8 text file (default: the King James Bible)", "FILE");
  add_text(app, "--log-every", &st->log_every, "print every N-th step (default 1)", "INT");
  add_text(app, "--save", &st->save, "write the trained model (safetensors)", "FILE");
  add_text(app, "--init-out", &st->init_out, "write the initial model (safetensors)", "FILE");
  add_text(app, "--dump-batches", &st->dump, "write the windows as int32 .npy [steps, batch, len+1]", "FILE");
  return {app, [st, app] { run_train(*st, *app); }};
}

}  // namespace posenc::cli
