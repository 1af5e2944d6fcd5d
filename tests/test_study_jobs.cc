// A study as jobs (study/jobs.h): job ids, the merge over seeds (means and sample standard deviations
// against values worked by hand), job rows read back exactly, and a plan directory's merge refusing
// missing, duplicate, foreign and unplanned job files; --extend's RoPE per scheme and factor.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "study/extend.h"
#include "study/jobs.h"
#include "study/results.h"

namespace posenc {
namespace {

namespace fs = std::filesystem;

StudyConfig small_config(std::int64_t seeds) {
  StudyConfig cfg;
  cfg.encodings = {Encoding::kAlibi, Encoding::kLearned};
  cfg.train_len = 16;
  cfg.steps = 12;
  cfg.batch = 4;
  cfg.eval_multiples = {1, 2};
  cfg.eval_tokens = 512;
  cfg.seed = 5;
  cfg.seeds = seeds;
  return cfg;
}

// One seed's row: ppl at 16 and 32 (learned has none at 32).
StudyResult row(Encoding e, std::uint64_t seed, double at16, double at32) {
  StudyResult r;
  r.name = encoding_info(e).name;
  r.encoding = e;
  r.seeds = {seed};
  r.final_train_loss = at16 / 2;
  r.tokens_per_second = 100.0 * double(seed);
  EvalPoint a, b;
  a.len = 16, a.ppl = at16;
  b.len = 32;
  if (e != Encoding::kLearned) b.ppl = at32;
  r.eval = {a, b};
  return r;
}

TEST(StudyJobs, OneJobPerEncodingAndSeedInOrder) {
  const std::vector<StudyJob> jobs = plan_jobs(small_config(3));
  ASSERT_EQ(jobs.size(), 6u);
  const char* ids[] = {"alibi-s5", "alibi-s6", "alibi-s7", "learned-s5", "learned-s6", "learned-s7"};
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(jobs[i].id, ids[i]);
    EXPECT_EQ(jobs[i].seed, 5 + i % 3);
    EXPECT_EQ(jobs[i].encoding, i < 3 ? Encoding::kAlibi : Encoding::kLearned);
  }
}

TEST(StudyJobs, MergeTakesMeanAndSampleSd) {
  const StudyConfig cfg = small_config(3);
  // alibi at 16: 2, 4, 6 → mean 4, sd 2; at 32: 1, 1, 4 → mean 2, sd √3
  const std::vector<std::vector<StudyResult>> rows = {
      {row(Encoding::kAlibi, 5, 2, 1)},   {row(Encoding::kAlibi, 6, 4, 1)},   {row(Encoding::kAlibi, 7, 6, 4)},
      {row(Encoding::kLearned, 5, 3, 0)}, {row(Encoding::kLearned, 6, 3, 0)}, {row(Encoding::kLearned, 7, 3, 0)}};
  const StudyRun run = merge_runs(cfg, "quick", "corpus.txt", rows);
  ASSERT_EQ(run.results.size(), 2u);
  const StudyResult& a = run.results[0];
  EXPECT_EQ(a.name, "alibi");
  EXPECT_EQ(a.seeds, (std::vector<std::uint64_t>{5, 6, 7}));
  ASSERT_EQ(a.per_seed.size(), 3u);
  EXPECT_EQ(*a.per_seed[2][1].ppl, 4.0);
  EXPECT_DOUBLE_EQ(*a.eval[0].ppl, 4.0);
  EXPECT_DOUBLE_EQ(*a.eval[0].ppl_sd, 2.0);
  EXPECT_DOUBLE_EQ(*a.eval[1].ppl, 2.0);
  EXPECT_DOUBLE_EQ(*a.eval[1].ppl_sd, std::sqrt(3.0));
  EXPECT_DOUBLE_EQ(a.final_train_loss, 2.0);
  EXPECT_DOUBLE_EQ(a.tokens_per_second, 600.0);
  const StudyResult& l = run.results[1];
  EXPECT_DOUBLE_EQ(*l.eval[0].ppl, 3.0);
  EXPECT_EQ(*l.eval[0].ppl_sd, 0.0);
  EXPECT_FALSE(l.eval[1].ppl.has_value());  // no seed has a value there
  EXPECT_FALSE(l.eval[1].ppl_sd.has_value());

  const std::string csv = results_csv(run);
  EXPECT_NE(csv.find("encoding,len,ppl,ppl_sd\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find("alibi,32,2.000,1.732\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find("learned,32,,\n"), std::string::npos) << csv;
  const std::string table = results_table(run);
  EXPECT_NE(table.find("4.000±2.000"), std::string::npos) << table;
  EXPECT_NE(table.find("mean ± sd over 3 seeds"), std::string::npos) << table;
  std::vector<std::size_t> widths;  // aligned columns: every line as many characters (not bytes)
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) {
    std::size_t n = 0;
    for (char c : line) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    widths.push_back(n);
  }
  ASSERT_EQ(widths.size(), 4u);
  EXPECT_EQ(widths[1], widths[2]) << table;
  EXPECT_EQ(widths[1], widths[3]) << table;
  const std::string json = results_json(run);
  EXPECT_NE(json.find("\"ppl_seeds\""), std::string::npos);
  EXPECT_NE(json.find("\"ppl_sd\""), std::string::npos);
}

TEST(StudyJobs, OneSeedMergesToItsOwnValues) {
  const StudyConfig cfg = small_config(1);
  const double v = std::nextafter(3.0, 4.0);
  const StudyRun run =
      merge_runs(cfg, "quick", "c", {{row(Encoding::kAlibi, 5, v, 1.0 / 3)}, {row(Encoding::kLearned, 5, v, 0)}});
  EXPECT_EQ(std::memcmp(&*run.results[0].eval[0].ppl, &v, sizeof v), 0);
  EXPECT_FALSE(run.results[0].eval[0].ppl_sd.has_value());
  EXPECT_EQ(results_csv(run).substr(0, 17), "encoding,len,ppl\n");
}

TEST(StudyJobs, RowsAndConfigReadBack) {
  const std::vector<StudyResult> rows = {row(Encoding::kAlibi, 9, 0.1 + 0.2, 1e-300)};
  const Expected<std::vector<StudyResult>> back = job_rows_from_json(job_rows_to_json(rows));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].eval[0].ppl, rows[0].eval[0].ppl);
  EXPECT_EQ((*back)[0].eval[1].ppl, rows[0].eval[1].ppl);
  EXPECT_EQ((*back)[0].seeds, rows[0].seeds);
  EXPECT_FALSE(job_rows_from_json("[]").ok());
  EXPECT_FALSE(job_rows_from_json("{}").ok());

  StudyConfig cfg = small_config(2);
  cfg.task = Task::kCopy;
  const Expected<PlannedStudy> ps = study_config_from_json(study_config_json(cfg, "quick", "task copy"));
  ASSERT_TRUE(ps.ok()) << ps.status().message();
  EXPECT_EQ(ps->preset, "quick");
  EXPECT_EQ(ps->corpus, "task copy");
  EXPECT_EQ(study_config_json(ps->cfg, ps->preset, ps->corpus), study_config_json(cfg, "quick", "task copy"));
  const Expected<PlannedStudy> bad = study_config_from_json("{\"preset\": \"quick\"}");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().arg(), "plan");
  const std::string plan = study_config_json(cfg, "quick", "task copy");
  const std::string steps = "\"steps\":" + std::to_string(cfg.steps);
  ASSERT_NE(plan.find(steps), std::string::npos) << plan;
  for (const char* to : {"\"steps\":1e30", "\"steps\":9223372036854775808", "\"steps\":\"5\""}) {
    std::string p = plan;
    p.replace(p.find(steps), steps.size(), to);
    const Expected<PlannedStudy> refused = study_config_from_json(p);
    EXPECT_FALSE(refused.ok()) << to;
    if (!refused.ok()) EXPECT_EQ(refused.status().arg(), "plan") << to;
  }
}

class PlanDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("posenc-study-jobs-" + std::to_string(getpid()))).string();
    fs::remove_all(dir_);
    cfg_ = small_config(2);
    jobs_ = plan_jobs(cfg_);
    std::vector<std::string> lines;
    for (const StudyJob& j : jobs_) lines.push_back("echo " + j.id);
    ASSERT_TRUE(write_plan(dir_, cfg_, "quick", "c", jobs_, lines).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  void finish(std::size_t i, double at16) {
    const StudyJob& j = jobs_[i];
    ASSERT_TRUE(write_job_file(dir_, cfg_, "quick", "c", j, {row(j.encoding, j.seed, at16, at16 + 1)}).ok());
  }
  std::string merge_error() {
    const Expected<StudyRun> r = merge_plan_dir(dir_);
    EXPECT_FALSE(r.ok());
    if (r.ok()) return {};
    EXPECT_EQ(r.status().arg(), "merge");
    return r.status().what();
  }
  std::string dir_;
  StudyConfig cfg_;
  std::vector<StudyJob> jobs_;
};

TEST_F(PlanDir, WritesOneLinePerJobAndAnArrayScript) {
  std::ifstream f(dir_ + "/jobs.txt");
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[3], "echo learned-s6");
  std::stringstream sb;
  sb << std::ifstream(dir_ + "/slurm.sbatch").rdbuf();
  EXPECT_NE(sb.str().find("#SBATCH --array=1-4\n"), std::string::npos) << sb.str();
  EXPECT_NE(sb.str().find("SLURM_ARRAY_TASK_ID"), std::string::npos);
}

TEST_F(PlanDir, MergesFinishedJobsAsRunsInPlanOrder) {
  for (std::size_t i : {3, 1, 0, 2}) finish(i, 2.0 + double(i));
  const Expected<StudyRun> r = merge_plan_dir(dir_);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::vector<std::vector<StudyResult>> rows;
  for (std::size_t i = 0; i < 4; ++i) rows.push_back({row(jobs_[i].encoding, jobs_[i].seed, 2.0 + double(i), 3.0 + double(i))});
  EXPECT_EQ(results_json(r.value()), results_json(merge_runs(cfg_, "quick", "c", rows)));
  EXPECT_EQ(results_csv(r.value()), results_csv(merge_runs(cfg_, "quick", "c", rows)));
}

TEST_F(PlanDir, ListsMissingJobs) {
  finish(0, 2);
  finish(2, 2);
  const std::string e = merge_error();
  EXPECT_NE(e.find("2 of 4 jobs have no file"), std::string::npos) << e;
  EXPECT_NE(e.find("alibi-s6, learned-s6"), std::string::npos) << e;
}

TEST_F(PlanDir, RefusesDuplicatesForeignAndUnplannedJobs) {
  for (std::size_t i = 0; i < 4; ++i) finish(i, 2);
  fs::copy_file(dir_ + "/jobs/alibi-s5.json", dir_ + "/jobs/copy.json");
  EXPECT_NE(merge_error().find("a duplicate"), std::string::npos);
  fs::remove(dir_ + "/jobs/copy.json");

  StudyConfig other = cfg_;
  other.steps = 13;
  ASSERT_TRUE(write_job_file(dir_, other, "quick", "c", jobs_[1], {row(jobs_[1].encoding, 6, 2, 3)}).ok());
  EXPECT_NE(merge_error().find("ran another configuration"), std::string::npos);
  finish(1, 2);

  StudyJob stray = jobs_[0];
  stray.id = "alibi-s9";
  ASSERT_TRUE(write_job_file(dir_, cfg_, "quick", "c", stray, {row(stray.encoding, 9, 2, 3)}).ok());
  EXPECT_NE(merge_error().find("not in the plan"), std::string::npos);
  fs::remove(dir_ + "/jobs/alibi-s9.json");

  std::ofstream(dir_ + "/jobs/broken.json") << "{";
  EXPECT_NE(merge_error().find("is not a study job's file"), std::string::npos);
  fs::remove(dir_ + "/jobs/broken.json");
  EXPECT_TRUE(merge_plan_dir(dir_).ok());
  EXPECT_NE(merge_plan_dir(dir_ + "/nowhere").status().what().find("no plan.json"), std::string::npos);
}

TEST(StudyExtend, SchemesAtFactorOneAreTheTrainedRope) {
  const std::int64_t D = 16, L = 64;
  const Expected<RopeFrequencies> plain = rope_frequencies(RopeParams{}, D, L);
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(extend_schemes().size(), 5u);
  for (RopeType t : extend_schemes()) {
    const Expected<RopeFrequencies> one = rope_frequencies(extend_rope(t, 1.0, L), D, L);
    ASSERT_TRUE(one.ok()) << rope_type_name(t) << ": " << one.status().message();
    EXPECT_EQ(one->attention_factor, 1.0) << rope_type_name(t);
    for (std::size_t k = 0; k < plain->inv_freq.size(); ++k)
      EXPECT_NEAR(one->inv_freq[k], plain->inv_freq[k], 1e-15 * plain->inv_freq[k]) << rope_type_name(t) << " " << k;
  }
  // at s = 4: linear divides every frequency by 4 (Chen et al.); YaRN's attention factor 0.1 ln 4 + 1
  const Expected<RopeFrequencies> lin = rope_frequencies(extend_rope(RopeType::kLinear, 4.0, L), D, 4 * L);
  ASSERT_TRUE(lin.ok());
  for (std::size_t k = 0; k < plain->inv_freq.size(); ++k)
    EXPECT_NEAR(lin->inv_freq[k], plain->inv_freq[k] / 4, 1e-15 * plain->inv_freq[k]);
  const Expected<RopeFrequencies> yarn = rope_frequencies(extend_rope(RopeType::kYarn, 4.0, L), D, 4 * L);
  ASSERT_TRUE(yarn.ok());
  EXPECT_NEAR(yarn->attention_factor, 0.1 * std::log(4.0) + 1, 1e-12);
  // the model takes a scheme; a checkpoint does not store one
  ModelConfig mc;
  mc.encoding = Encoding::kRope;
  mc.rope = extend_rope(RopeType::kYarn, 4.0, L);
  EXPECT_TRUE(validate_config(mc).ok());
  EXPECT_EQ(checkpoint_bytes(mc, std::vector<float>(Model<float>(mc, 1).params())).status().arg(), "rope");
}

}  // namespace
}  // namespace posenc
