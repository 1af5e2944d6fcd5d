// The synthetic tasks of `posenc study --task` (posenc/study.h), generated in code from a seeded
// std::mt19937_64. Each example is a byte string s of len + 1 bytes; the model reads s[0 .. len) and
// is scored only where the next byte is determined by what came before (targets −1 elsewhere).
//   copy            "x|x": a random string over a–h, a bar, the same string again; the copy is scored.
//   flipflop        Liu et al. 2023 (arXiv 2306.00946): pairs "w0"/"w1" (write), "i0"/"i1" (ignore),
//                   "r?" (read: the bit last written); probabilities 0.1 / 0.8 / 0.1, the first a
//                   write, the last a read if none came before; the bit after each r is scored.
//   counting        letters a/b with a query "?" every 4–12 letters, followed by the number of a's
//                   since the previous query (mod 10) — counting, as in the CoPE paper's task family;
//                   the digit is scored.
//   selective-copy  Gu & Dao 2023 / the CoPE paper: data letters A–H scattered among dots, then "|" and
//                   the letters in order; the letters after the bar are scored.
//   passkey         Mohtashami & Jaggi 2023: filler sentences with "K=NNNNN " hidden at a random
//                   place (or, given a depth d, before filler byte round(d · filler)), ending with
//                   "K?NNNNN"; the five digits at the end are scored.
#include <cmath>
#include <string>

#include "study/study.h"

namespace posenc {
namespace {

using I = std::int64_t;

const char* const kTaskNames[] = {"copy", "flipflop", "counting", "selective-copy", "passkey"};

struct Gen {
  std::mt19937_64& r;
  I below(I n) { return I(r() % std::uint64_t(n)); }
};

}  // namespace

const char* task_name(Task t) { return kTaskNames[int(t)]; }

Expected<Task> parse_task(const std::string& s) {
  for (int i = 0; i < 5; ++i)
    if (s == kTaskNames[i]) return Task(i);
  return Status::Invalid("task", "expected copy, flipflop, counting, selective-copy or passkey; got '" + s + "'");
}

const std::vector<double>& passkey_depths() {
  static const std::vector<double> d = {0.0, 0.25, 0.5, 0.75, 1.0};
  return d;
}

namespace {

// An example being written: its bytes, and whether each is predicted and counted.
struct Sequence {
  std::string s;
  std::vector<bool> scored;
  void put(char c, bool score) {
    s.push_back(c);
    scored.push_back(score);
  }
  I size() const { return I(s.size()); }
};

// Copy: the first half repeated after a bar.
void copy(Gen& g, I n, Sequence* q) {
  const I k = (n - 1) / 2;
  std::string x;
  for (I i = 0; i < k; ++i) x.push_back(char('a' + g.below(8)));
  for (char c : x) q->put(c, false);
  q->put('|', false);
  for (char c : x) q->put(c, true);
}

// FlipFlop: writes, ignores and reads of one bit; a read scores the last bit written.
void flip_flop(Gen& g, I n, Sequence* q) {
  char bit = '0';
  bool read = false;
  for (I i = 0; q->size() + 2 <= n; ++i) {
    const I u = g.below(10);
    const bool last = q->size() + 4 > n;
    char op = i == 0 || u == 0 ? 'w' : u == 1 ? 'r' : 'i';
    if (i > 0 && last && !read) op = 'r';  // every example has a read to score
    read = read || op == 'r';
    if (op == 'r') {
      q->put('r', false);
      q->put(bit, true);
    } else {
      const char b = char('0' + g.below(2));
      if (op == 'w') bit = b;
      q->put(op, false);
      q->put(b, false);
    }
  }
}

// Counting: runs of a and b, each followed by ? and its count of a modulo 10.
void counting(Gen& g, I n, Sequence* q) {
  while (q->size() < n) {
    const I m = 4 + g.below(9);
    int count = 0;
    for (I i = 0; i < m; ++i) {
      const bool a = g.below(2) == 0;
      count += a;
      q->put(a ? 'a' : 'b', false);
    }
    q->put('?', false);
    q->put(char('0' + count % 10), true);
  }
}

// SelectiveCopy: letters scattered among dots, then copied in order after a bar.
void selective_copy(Gen& g, I n, Sequence* q) {
  const I k = std::max<I>(1, n / 8), body = n - 1 - k;
  std::vector<bool> is_data(std::size_t(body), false);
  for (I placed = 0; placed < k;) {
    const I at = g.below(body);
    if (!is_data[std::size_t(at)]) is_data[std::size_t(at)] = true, ++placed;
  }
  std::string data;
  for (I i = 0; i < body; ++i) {
    if (is_data[std::size_t(i)]) {
      data.push_back(char('A' + g.below(8)));
      q->put(data.back(), false);
    } else {
      q->put('.', false);
    }
  }
  q->put('|', false);
  for (char c : data) q->put(c, true);
}

// Passkey: a key hidden in filler text at a depth, asked for at the end.
Status passkey(Gen& g, I n, std::optional<double> depth, Sequence* q) {
  std::string key;
  for (int i = 0; i < 5; ++i) key.push_back(char('0' + g.below(10)));
  const std::string tail = "K?" + key, needle = "K=" + key + " ";
  const I filler = n - I(tail.size()) - I(needle.size());
  if (filler < 0) return Status::Invalid("train-len", "passkey needs sequences of at least 15 bytes");
  const std::string grass = "The grass is green. The sky is blue. ";
  const I at = depth ? I(std::llround(*depth * double(filler))) : g.below(filler + 1);
  for (I i = 0; i < filler; ++i) {
    if (i == at)
      for (char c : needle) q->put(c, false);
    q->put(grass[std::size_t(i) % grass.size()], false);
  }
  if (at == filler)
    for (char c : needle) q->put(c, false);
  for (std::size_t i = 0; i < tail.size(); ++i) q->put(tail[i], i >= 2);
  return Status::Ok();
}
}  // namespace

Status make_example(Task task, I len, std::mt19937_64& rng, std::int32_t* tokens, std::int32_t* targets,
                    std::optional<double> depth) {
  if (len < 16) return Status::Invalid("train-len", "tasks need sequences of at least 16 bytes");
  if (depth && task != Task::kPasskey) return Status::Invalid("depth", "only passkey places its key at a depth");
  if (depth && !(*depth >= 0 && *depth <= 1)) return Status::Invalid("depth", "expected a fraction in [0, 1]");
  Gen g{rng};
  Sequence q;
  const I n = len + 1;
  switch (task) {
    case Task::kCopy: copy(g, n, &q); break;
    case Task::kFlipFlop: flip_flop(g, n, &q); break;
    case Task::kCounting: counting(g, n, &q); break;
    case Task::kSelectiveCopy: selective_copy(g, n, &q); break;
    case Task::kPasskey: POSENC_RETURN_IF_ERROR(passkey(g, n, depth, &q)); break;
  }
  while (q.size() < n) q.put(' ', false);  // flip-flop / counting may stop a byte or two short
  q.s.resize(std::size_t(n));
  for (I i = 0; i < len; ++i) {
    tokens[i] = static_cast<unsigned char>(q.s[std::size_t(i)]);
    targets[i] = q.scored[std::size_t(i + 1)] ? static_cast<unsigned char>(q.s[std::size_t(i + 1)]) : -1;
  }
  return Status::Ok();
}

}  // namespace posenc
