// The study's results apart from the CLI (study/results.h, study/run.h, study/progress.h): a result's
// JSON line reads back exactly, results.json/CSV/table hold one entry per encoding with missing values
// shown as null, an empty field and "-", results.json reads back, and the presets and worker plan.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "study/gnuplot.h"
#include "study/progress.h"
#include "study/results.h"
#include "study/run.h"

namespace posenc {
namespace {

namespace fs = std::filesystem;

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

bool same_bits(const std::optional<double>& a, const std::optional<double>& b) {
  return a.has_value() == b.has_value() && (!a || same_bits(*a, *b));
}

// Two encodings at lengths 16 .. 256; learned cannot run past 16 (no value there).
StudyRun sample_run(bool task) {
  StudyRun run;
  run.cfg.train_len = 16;
  run.cfg.steps = 12;
  run.cfg.batch = 4;
  run.cfg.eval_tokens = 512;
  if (task) run.cfg.task = Task::kCopy;
  run.cfg.encodings = {Encoding::kAlibi, Encoding::kLearned};
  run.preset = "quick";
  run.corpus = task ? "task copy" : "corpus.txt";
  run.threads = 2;
  run.workers = 2;
  run.threads_per_worker = 1;
  for (Encoding e : run.cfg.encodings) {
    StudyResult r;
    r.name = encoding_info(e).name;
    r.encoding = e;
    r.seeds = {1};
    r.final_train_loss = 2.5;
    r.train_seconds = 1.25;
    r.tokens_per_second = 12345.6;
    for (std::int64_t m : run.cfg.eval_multiples) {
      EvalPoint p;
      p.len = m * 16;
      if (e == Encoding::kAlibi || m == 1) {
        p.ppl = 3.0 + 0.1 * double(m);
        if (task) p.acc = 1.0 / double(m);
      }
      r.eval.push_back(p);
    }
    r.per_seed = {r.eval};
    run.results.push_back(r);
  }
  return run;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

TEST(StudyResults, JsonRoundTripIsExact) {
  StudyResult r;
  r.name = "rope";
  r.encoding = Encoding::kRope;
  r.seeds = {7};
  r.final_train_loss = 1.0 / 3.0;
  r.train_seconds = 0.1 + 0.2;
  r.tokens_per_second = std::numeric_limits<double>::max();
  const double values[] = {std::nextafter(1.0, 2.0), 4.9e-324, 1e-300, 2.718281828459045, 123456789.123456789};
  std::int64_t len = 16;
  for (double v : values) {
    EvalPoint p;
    p.len = len;
    len *= 2;
    p.ppl = v;
    if (v < 1) p.acc = 1 - v;
    r.eval.push_back(p);
  }
  r.eval.push_back(EvalPoint{});
  r.eval.back().len = len;
  const std::string line = result_to_json(r);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  const Expected<StudyResult> back = result_from_json(line);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->encoding, r.encoding);
  EXPECT_EQ(back->name, "rope");
  EXPECT_EQ(back->seeds, std::vector<std::uint64_t>{7});
  EXPECT_TRUE(same_bits(back->final_train_loss, r.final_train_loss));
  EXPECT_TRUE(same_bits(back->train_seconds, r.train_seconds));
  EXPECT_TRUE(same_bits(back->tokens_per_second, r.tokens_per_second));
  ASSERT_EQ(back->eval.size(), r.eval.size());
  for (std::size_t i = 0; i < r.eval.size(); ++i) {
    EXPECT_EQ(back->eval[i].len, r.eval[i].len);
    EXPECT_TRUE(same_bits(back->eval[i].ppl, r.eval[i].ppl)) << i;
    EXPECT_TRUE(same_bits(back->eval[i].acc, r.eval[i].acc)) << i;
  }
}

TEST(StudyResults, FromJsonRefusesOtherText) {
  for (const char* bad : {"", "not json", "{\"encoding\": 1}", "[1, 2]",
                          "{\"encoding\": 1, \"final_train_loss\": \"x\", \"train_seconds\": 0, "
                          "\"tokens_per_second\": 0, \"eval\": []}"}) {
    const Expected<StudyResult> r = result_from_json(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().arg(), "result") << bad;
    }
  }
  // A line whose numbers no field can hold: an encoding past the registry, a float or 2^63 where an
  // integer belongs, a negative seed.
  StudyResult good;
  good.name = "rope";
  good.encoding = Encoding::kRope;
  good.seeds = {7};
  good.eval.push_back(EvalPoint{});
  good.eval.back().len = 16;
  const std::string line = result_to_json(good);
  ASSERT_TRUE(result_from_json(line).ok());
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = line;
    const std::size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) s.replace(at, from.size(), to);
    return s;
  };
  const std::string enc = "\"encoding\":" + std::to_string(int(Encoding::kRope));
  for (const std::string& bad : {with(enc, "\"encoding\":" + std::to_string(registry().size())),
                                 with(enc, "\"encoding\":-1"), with(enc, "\"encoding\":3.5"),
                                 with("\"len\":16", "\"len\":1e30"),
                                 with("\"len\":16", "\"len\":9223372036854775808"),
                                 with("\"seed\":7", "\"seed\":-7")}) {
    const Expected<StudyResult> r = result_from_json(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_EQ(r.status().arg(), "result") << bad;
  }
}

TEST(StudyResults, CsvHasOneRowPerEncodingAndLength) {
  const std::vector<std::string> csv = lines(results_csv(sample_run(false)));
  ASSERT_EQ(csv.size(), 1u + 2 * 5);
  EXPECT_EQ(csv[0], "encoding,len,ppl");
  EXPECT_EQ(csv[1], "alibi,16,3.100");
  EXPECT_EQ(csv[5], "alibi,256,4.600");
  EXPECT_EQ(csv[6], "learned,16,3.100");
  EXPECT_EQ(csv[7], "learned,32,");  // cannot run there: an empty field
  const std::vector<std::string> task = lines(results_csv(sample_run(true)));
  ASSERT_EQ(task.size(), 1u + 2 * 5);
  EXPECT_EQ(task[0], "encoding,len,ppl,acc");
  EXPECT_EQ(task[2], "alibi,32,3.200,0.500");
  EXPECT_EQ(task[10], "learned,256,,");
}

TEST(StudyResults, TableShowsMissingValuesAsADash) {
  const std::vector<std::string> t = lines(results_table(sample_run(false)));
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0], "perplexity per byte on 512 held-out bytes (corpus.txt), trained at length 16");
  EXPECT_EQ(words(t[1]), (std::vector<std::string>{"encoding", "16", "32", "64", "128", "256", "last/1x", "tok/s"}));
  EXPECT_EQ(words(t[2]),
            (std::vector<std::string>{"alibi", "3.100", "3.200", "3.400", "3.800", "4.600", "1.484", "12346"}));
  EXPECT_EQ(words(t[3]), (std::vector<std::string>{"learned", "3.100", "-", "-", "-", "-", "-", "12346"}));
  EXPECT_EQ(t[1].size(), t[2].size());  // aligned columns
  const std::vector<std::string> task = lines(results_table(sample_run(true)));
  EXPECT_EQ(task[0], "accuracy on 64 fresh examples per length (task copy), trained at length 16");
  EXPECT_EQ(words(task[2])[2], "0.500");
}

// A passkey run: two seeds, a row at random places and one per depth at each length.
StudyRun passkey_run() {
  StudyRun run = sample_run(true);
  run.cfg.task = Task::kPasskey;
  run.cfg.seeds = 2;
  run.corpus = "task passkey";
  for (StudyResult& r : run.results) {
    std::vector<EvalPoint> eval;
    for (const EvalPoint& p : r.eval) {
      eval.push_back(p);
      if (p.acc) eval.back().acc_sd = eval.back().ppl_sd = 0.125;
      for (double d : passkey_depths()) {
        EvalPoint q = eval.back();
        q.depth = d;
        if (q.acc) q.acc = d / double(q.len);
        eval.push_back(q);
      }
    }
    r.eval = eval;
    r.per_seed = {eval, eval};
  }
  return run;
}

TEST(StudyResults, PasskeyHasARowPerLengthAndDepth) {
  const StudyRun run = passkey_run();
  const std::vector<std::string> csv = lines(results_csv(run));
  ASSERT_EQ(csv.size(), 1u + 2 * 5 * 6);
  EXPECT_EQ(csv[0], "encoding,len,depth,ppl,ppl_sd,acc,acc_sd");
  EXPECT_EQ(csv[1], "alibi,16,,3.100,0.125,1.000,0.125");  // the random placement: no depth
  EXPECT_EQ(csv[2], "alibi,16,0,3.100,0.125,0.000,0.125");
  EXPECT_EQ(csv[11], "alibi,32,0.75,3.200,0.125,0.023,0.125");  // 0.75 / 32
  EXPECT_EQ(csv[60], "learned,256,1,,,,");
  // the table: lengths of the random placement, then one row per encoding and depth
  const std::vector<std::string> t = lines(results_table(run));
  ASSERT_EQ(t.size(), 4u + 3 + 2 * 5);
  EXPECT_EQ(words(t[2])[0], "alibi");
  EXPECT_EQ(words(t[2]).size(), 1u + 5 + 2);  // five lengths, last/1x, tok/s
  EXPECT_EQ(words(t[2])[2], "0.500±0.125");
  EXPECT_NE(t[5].find("passkey accuracy by depth"), std::string::npos) << t[5];
  EXPECT_EQ(words(t[6]), (std::vector<std::string>{"encoding", "depth", "16", "32", "64", "128", "256", "last/1x"}));
  EXPECT_EQ(words(t[9]), (std::vector<std::string>{"alibi", "0.50", "0.031±0.125", "0.016±0.125", "0.008±0.125",
                                                   "0.004±0.125", "0.002±0.125", "0.062"}));
  EXPECT_EQ(words(t[16]), (std::vector<std::string>{"learned", "1.00", "0.062±0.125", "-", "-", "-", "-", "-"}));
  const auto chars = [](const std::string& x) {  // "±" is two bytes
    return std::count_if(x.begin(), x.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
  };
  EXPECT_EQ(chars(t[6]), chars(t[9]));  // aligned columns
  // results.json: "depth" on the rows at a depth; read back, the rows at random places
  const std::string text = results_json(run);
  EXPECT_NE(text.find("\"depth\": 0.25"), std::string::npos);
  const fs::path dir = fs::temp_directory_path() / ("posenc-study-passkey-" + std::to_string(getpid()));
  fs::create_directories(dir);
  ASSERT_TRUE(write_file((dir / "results.json").string(), text));
  const Expected<std::vector<StudyEntry>> back = read_results_json((dir / "results.json").string());
  fs::remove_all(dir);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ((*back)[0].eval.size(), 5u);
  EXPECT_EQ((*back)[0].eval[1].len, 32);
  // a job's line keeps the depth
  const Expected<StudyResult> r = result_from_json(result_to_json(run.results[0]));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->eval.size(), run.results[0].eval.size());
  for (std::size_t i = 0; i < r->eval.size(); ++i) EXPECT_EQ(r->eval[i].depth, run.results[0].eval[i].depth) << i;
  // the plot draws the random placement alone: five points per curve
  const std::string gp = study_plot_script(run, "x.png");
  const std::size_t d0 = gp.find("$d0 << EOD\n"), end = gp.find("EOD\n", d0 + 11);
  EXPECT_EQ(std::count(gp.begin() + std::ptrdiff_t(d0), gp.begin() + std::ptrdiff_t(end), '\n'), 1 + 5);
}

TEST(StudyResults, ResultsJsonReadsBack) {
  const fs::path dir = fs::temp_directory_path() / ("posenc-study-results-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "results.json").string();
  ASSERT_TRUE(write_file(path, results_json(sample_run(false))));
  const Expected<std::vector<StudyEntry>> back = read_results_json(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].encoding, "alibi");
  EXPECT_EQ((*back)[1].encoding, "learned");
  ASSERT_EQ((*back)[1].eval.size(), 5u);
  EXPECT_EQ((*back)[1].eval[4].len, 256);
  EXPECT_DOUBLE_EQ(*(*back)[0].eval[4].ppl, 4.6);
  EXPECT_FALSE((*back)[1].eval[1].ppl.has_value());

  ASSERT_TRUE(write_file(path, "{\"encodings\": [{\"encoding\": \"rope\", \"eval\": []}]}"));
  const Expected<std::vector<StudyEntry>> bad = read_results_json(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().arg(), "study");
  EXPECT_EQ(bad.status().what(), path + ": \"rope\" has no \"eval\" rows (expected posenc study's results.json)");
  ASSERT_TRUE(write_file(path, "{"));
  EXPECT_FALSE(read_results_json(path).ok());
  fs::remove_all(dir);
}

TEST(StudyResults, ResultsJsonHoldsTheRunsSettings) {
  const std::string text = results_json(sample_run(true));
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  for (const char* key : {"\"train_len\": 16", "\"task\": \"copy\"", "\"corpus\": \"task copy\"", "\"seeds\": 1",
                          "\"acc\": 0.5", "\"acc\": null", "\"encoding\": \"learned\""})
    EXPECT_NE(text.find(key), std::string::npos) << key;
  // nothing of the machine it ran on: a local run and a merged sweep write the same file
  for (const char* key : {"\"workers\"", "\"threads", "\"train_seconds\"", "\"tokens_per_second\"", "_sd\""})
    EXPECT_EQ(text.find(key), std::string::npos) << key;
  EXPECT_EQ(results_json(sample_run(false)).find("\"acc\""), std::string::npos);  // only for a task
}

TEST(StudyRun, PresetsAndWorkerPlan) {
  const Expected<StudyConfig> quick = study_preset("quick"), full = study_preset("full");
  ASSERT_TRUE(quick.ok() && full.ok());
  EXPECT_EQ(quick->steps, 1000);
  EXPECT_EQ(full->model.d_model, 128);
  EXPECT_TRUE(quick->encodings.empty());
  const Expected<StudyConfig> huge = study_preset("huge");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().message(), "preset: expected quick or full, got 'huge'");
  EXPECT_FALSE(study_encodings().empty());
  const WorkerPlan two = plan_workers(2, 14), one = plan_workers(8, 1), some = plan_workers(7, 3);
  EXPECT_EQ(two.workers, 2);
  EXPECT_EQ(two.threads_per_worker, 1);
  EXPECT_EQ(one.workers, 1);
  EXPECT_EQ(one.threads_per_worker, 8);
  EXPECT_EQ(some.workers, 3);
  EXPECT_EQ(some.threads_per_worker, 2);
}

TEST(StudyRun, PlotScriptDrawsOneCurvePerEncoding) {
  const std::string s = study_plot_script(sample_run(false), "/tmp/x.png");
  EXPECT_NE(s.find("set output '/tmp/x.png'"), std::string::npos);
  EXPECT_NE(s.find("title 'alibi'"), std::string::npos);
  EXPECT_NE(s.find("title 'learned'"), std::string::npos);
  EXPECT_EQ(study_files(sample_run(true).cfg)[2], "acc_vs_length.png");
}

TEST(StudyRun, WritesItsFilesTogether) {
  if (!gnuplot_found()) GTEST_SKIP() << "no gnuplot";
  const fs::path dir = fs::temp_directory_path() / ("posenc-study-write-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const StudyRun run = sample_run(false);
  const Status s = write_study(dir.string(), run);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ppl_vs_length.png", "results.csv", "results.json"}));
  std::ifstream png(dir / "ppl_vs_length.png", std::ios::binary);
  EXPECT_TRUE(is_whole_png(std::string(std::istreambuf_iterator<char>(png), {})));
  fs::remove_all(dir);
  // a directory that cannot be made: an error naming "out", nothing left behind
  const Status bad = write_study((dir / "no" / "such").string(), run);
  EXPECT_EQ(bad.code(), Code::kIo);
  EXPECT_EQ(bad.arg(), "out");
  EXPECT_FALSE(fs::exists(dir));
}

TEST(StudyProgress, NotATerminalALineEveryQuarter) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar(f, {"alibi", "rope"}, 8);
    for (std::int64_t s = 1; s <= 9; ++s) bar.update(0, s, 2.0);
    bar.finish();
  }
  std::rewind(f);
  std::string text;
  for (int c; (c = std::fgetc(f)) != EOF;) text.push_back(char(c));
  std::fclose(f);
  const std::vector<std::string> ls = lines(text);
  ASSERT_EQ(ls.size(), 5u) << text;  // steps 2, 4, 6, 8, then evaluating
  EXPECT_NE(ls[0].find("step 2/8"), std::string::npos) << ls[0];
  EXPECT_NE(ls[4].find("evaluating"), std::string::npos) << ls[4];
  EXPECT_EQ(format_seconds(187), "3m07s");
  EXPECT_EQ(format_seconds(42), "42s");
}

}  // namespace
}  // namespace posenc
