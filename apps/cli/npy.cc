#include "cli/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include "study/temp_files.h"

namespace posenc::cli {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
// Refuse absurd tensors before allocating (2^40 bytes).
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 40;

std::string errno_text(int e) { return std::strerror(e); }

// Quote a path for a one-line message.
std::string q(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\n' || c == '\r') ? ' ' : c;
  return out + "'";
}

// ---- the header: a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
struct Header {
  std::string descr;
  bool fortran = false;
  std::vector<std::int64_t> shape;
};

class HeaderParser {
 public:
  explicit HeaderParser(const std::string& s) : s_(s) {}

  // Returns an error description, or "" on success.
  std::string parse(Header* h) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    ws();
    if (!eat('{')) return "expected '{'";
    for (;;) {
      ws();
      if (eat('}')) break;
      std::string key;
      if (!str(&key)) return "expected a quoted key";
      ws();
      if (!eat(':')) return "expected ':' after '" + key + "'";
      ws();
      if (key == "descr") {
        if (peek() == '[' || peek() == '(') return "structured dtype";  // reported as unsupported
        if (!str(&h->descr)) return "expected a string for 'descr'";
        have_descr = true;
      } else if (key == "fortran_order") {
        if (word("True"))
          h->fortran = true;
        else if (word("False"))
          h->fortran = false;
        else
          return "expected True or False for 'fortran_order'";
        have_fortran = true;
      } else if (key == "shape") {
        if (!tuple(&h->shape)) return "expected a tuple of non-negative integers for 'shape'";
        have_shape = true;
      } else {
        return "unexpected key '" + key + "'";
      }
      ws();
      if (eat(',')) continue;
      ws();
      if (eat('}')) break;
      return "expected ',' or '}'";
    }
    ws();
    if (i_ != s_.size()) return "trailing characters after the dict";
    if (!have_descr) return "no 'descr'";
    if (!have_fortran) return "no 'fortran_order'";
    if (!have_shape) return "no 'shape'";
    return "";
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    if (peek() != c) return false;
    ++i_;
    return true;
  }
  bool word(const char* w) {
    const std::size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  bool str(std::string* out) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') return false;
    const std::size_t end = s_.find(quote, i_ + 1);
    if (end == std::string::npos) return false;
    *out = s_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    return true;
  }
  bool integer(std::int64_t* v) {
    std::int64_t x = 0;
    std::size_t digits = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int d = peek() - '0';
      if (x > (std::numeric_limits<std::int64_t>::max() - d) / 10) return false;
      x = x * 10 + d;
      ++i_;
      ++digits;
    }
    if (digits == 0) return false;
    eat('L');  // Python 2 longs
    *v = x;
    return true;
  }
  bool tuple(std::vector<std::int64_t>* out) {
    if (!eat('(')) return false;
    out->clear();
    for (;;) {
      ws();
      if (eat(')')) return true;
      std::int64_t v = 0;
      if (!integer(&v)) return false;
      out->push_back(v);
      ws();
      if (eat(',')) continue;
      ws();
      if (eat(')')) return true;
      return false;
    }
  }

  const std::string& s_;
  std::size_t i_ = 0;
};

std::optional<DType> parse_descr(const std::string& d) {
  if (d.size() != 3) return std::nullopt;
  const char order = d[0];
  if (order != '<' && order != '|' && order != '=') return std::nullopt;  // this host is little-endian
  const std::string t = d.substr(1);
  if (t == "f2") return DType::kF16;
  if (t == "f4") return DType::kF32;
  if (t == "f8") return DType::kF64;
  if (t == "i4") return DType::kI32;
  if (t == "i8") return DType::kI64;
  return std::nullopt;
}

std::string shape_tuple(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

std::string parent_dir(const std::string& path) {
  const std::filesystem::path p(path);
  const std::filesystem::path parent = p.parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Writes all of `bytes` to an open descriptor; false with errno set on failure.
bool write_all(int fd, const std::string& bytes) {
  const char* data = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

// Creates a fresh temporary file next to `dest` and writes `bytes` into it. On success *tmp names it.
// Errors name `shown` (the path as the user gave it).
Status write_temp(const std::string& dest, const std::string& shown, const std::string& bytes,
                  const std::string& flag, std::string* tmp) {
  files::remove_stale_temps(dest);
  int fd = -1;
  std::string name;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    name = files::temp_path(dest);
    fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return Status::Io(flag, "cannot write " + q(shown) + ": " + errno_text(errno));
  if (!write_all(fd, bytes) || ::fsync(fd) != 0) {  // on disk before the rename makes it the file
    const int e = errno;
    ::close(fd);
    ::unlink(name.c_str());
    return Status::Io(flag, "cannot write " + q(shown) + ": " + errno_text(e));
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(name.c_str());
    return Status::Io(flag, "cannot write " + q(shown) + ": " + errno_text(e));
  }
  *tmp = name;
  return Status::Ok();
}

}  // namespace

// ---- Tensor -------------------------------------------------------------------------------------

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  const std::size_t words = (nbytes() + 7) / 8;
  storage_.assign(words == 0 ? 1 : words, 0);
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t s : shape_) n *= s;
  return n;
}

const char* npy_descr(DType t) {
  switch (t) {
    case DType::kF32:
      return "<f4";
    case DType::kF64:
      return "<f8";
    case DType::kI32:
      return "<i4";
    case DType::kI64:
      return "<i8";
    case DType::kF16:
      return "<f2";
    case DType::kBF16:
      return nullptr;  // NumPy has no bfloat16
  }
  return nullptr;
}

// ---- reading -----------------------------------------------------------------------------------

namespace {
// The regular files this run read as inputs (flag, resolved path): an output may not replace one.
std::vector<std::pair<std::string, std::string>>& inputs_read() {
  static std::vector<std::pair<std::string, std::string>> files;
  return files;
}
}  // namespace

Expected<Tensor> read_npy(const std::string& path, const std::string& flag) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) {
    const std::string key = std::filesystem::canonical(path, ec).string();
    if (!ec) inputs_read().emplace_back(flag, key);
  }
  if (std::filesystem::is_directory(path, ec))
    return Status::Io(flag, "cannot read " + q(path) + ": is a directory, expected a .npy file");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::Io(
        flag, "cannot open " + q(path) + ": " + (errno != 0 ? errno_text(errno) : std::string("unreadable")));
  in.seekg(0, std::ios::end);
  const std::int64_t file_size = static_cast<std::int64_t>(in.tellg());
  in.seekg(0, std::ios::beg);
  return read_npy_stream(in, file_size, path, flag);
}

Expected<Tensor> read_npy_stream(std::istream& in, std::int64_t file_size, const std::string& path,
                                 const std::string& flag) {
  const std::string not_npy = "not a .npy file: " + q(path);
  char pre[kMagicLen + 2] = {};
  if (file_size < static_cast<std::int64_t>(sizeof pre) || !in.read(pre, sizeof pre) ||
      std::memcmp(pre, kMagic, kMagicLen) != 0)
    return Status::Invalid(flag, not_npy + " (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(pre[kMagicLen]);
  if (major < 1 || major > 3)
    return Status::Invalid(flag, "unsupported .npy format version " + std::to_string(major) + " in " +
                                     q(path) + ", expected 1, 2 or 3");
  std::uint32_t header_len = 0;
  unsigned char len_bytes[4] = {};
  const int len_size = major == 1 ? 2 : 4;
  if (!in.read(reinterpret_cast<char*>(len_bytes), len_size))
    return Status::Invalid(flag, "truncated .npy header in " + q(path));
  for (int i = len_size - 1; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  const std::int64_t data_start = static_cast<std::int64_t>(sizeof pre) + len_size + header_len;
  if (data_start > file_size) return Status::Invalid(flag, "truncated .npy header in " + q(path));
  std::string text(header_len, '\0');
  if (header_len > 0 && !in.read(text.data(), header_len))
    return Status::Invalid(flag, "truncated .npy header in " + q(path));

  Header h;
  const std::string err = HeaderParser(text).parse(&h);
  if (err == "structured dtype")
    return Status::Invalid(flag, "unsupported dtype (structured) in " + q(path) +
                                     ", expected float32, float64, float16, int32 or int64");
  if (!err.empty()) return Status::Invalid(flag, "malformed .npy header in " + q(path) + ": " + err);
  const std::optional<DType> dtype = parse_descr(h.descr);
  if (!dtype)
    return Status::Invalid(flag, "unsupported dtype '" + h.descr + "' in " + q(path) +
                                     ", expected little-endian float32, float64, float16, int32 or int64 "
                                     "('<f4', '<f8', '<f2', '<i4', '<i8')");
  if (h.fortran)
    return Status::Invalid(flag, q(path) +
                                     " is in Fortran order, expected C order "
                                     "(save np.ascontiguousarray(a))");
  if (h.shape.size() > static_cast<std::size_t>(kMaxDims))
    return Status::Invalid(flag, q(path) + " has " + std::to_string(h.shape.size()) +
                                     " dimensions, at most " + std::to_string(kMaxDims) + " supported");
  std::int64_t bytes = static_cast<std::int64_t>(dtype_size(*dtype));
  for (std::int64_t s : h.shape) {
    if (s != 0 && bytes > kMaxBytes / s)
      return Status::Invalid(flag, q(path) + " is too large: shape " + shape_tuple(h.shape));
    bytes *= s;
  }
  if (file_size - data_start < bytes)
    return Status::Invalid(flag, "truncated .npy data in " + q(path) + ": shape " + shape_tuple(h.shape) +
                                     " needs " + std::to_string(bytes) + " bytes, found " +
                                     std::to_string(file_size - data_start));
  Tensor t(*dtype, h.shape);
  if (bytes > 0 && !in.read(static_cast<char*>(t.data()), bytes))
    return Status::Io(flag, "cannot read " + q(path) + ": " + errno_text(errno));
  return t;
}

// ---- writing -----------------------------------------------------------------------------------

std::string npy_bytes(const Tensor& t) {
  std::string dict = std::string("{'descr': '") + npy_descr(t.dtype()) +
                     "', 'fortran_order': False, 'shape': " + shape_tuple(t.shape()) + ", }";
  // Pad with spaces and a final newline so that the data starts on a 64-byte boundary.
  std::size_t pre = kMagicLen + 2 + 2;
  int major = 1;
  if (dict.size() + 1 + 64 > 65535) {
    major = 2;
    pre = kMagicLen + 2 + 4;
  }
  const std::size_t total = ((pre + dict.size() + 1 + 63) / 64) * 64;
  dict.append(total - pre - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string out(kMagic, kMagicLen);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  const std::uint32_t len = static_cast<std::uint32_t>(dict.size());
  for (std::size_t i = 0; i < pre - kMagicLen - 2; ++i)
    out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += dict;
  out.append(static_cast<const char*>(t.data()), t.nbytes());
  return out;
}

int probe_dir_errno(const std::string& dir) {
  // A temporary like every output's (study/temp_files.h), so that a probe left by a killed process
  // is removed by the next one.
  const std::string name = dir + "/posenc-probe";
  files::remove_stale_temps(name);
  const std::string probe = files::temp_path(name);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT, 0600);
  if (fd < 0) return errno;
  ::close(fd);
  ::unlink(probe.c_str());
  return 0;
}

Status write_npy(const std::string& path, const Tensor& t, const std::string& flag) {
  OutputSet set;
  POSENC_RETURN_IF_ERROR(set.reserve(flag, path));
  set.attach(flag, &t);
  return set.commit();
}

Status OutputSet::reserve(const std::string& flag, const std::string& path) {
  if (path.empty()) return Status::Invalid(flag, "expected an output path, got an empty string");
  if (path[0] == '-')  // "--out --theta": a flag taken for the path
    return Status::Invalid(flag, "expected an output path, got '" + path + "', which looks like a flag (write ./" +
                                     path + " for such a file)");
  std::error_code ec;
  // links resolved: a symbolic link's target is the file replaced, not the link
  namespace fs = std::filesystem;
  fs::path resolved = fs::weakly_canonical(fs::absolute(path, ec), ec);
  struct stat lb;
  for (int hops = 0; !ec && ::lstat(resolved.c_str(), &lb) == 0 && S_ISLNK(lb.st_mode); ++hops) {
    if (hops == 40) return Status::Io(flag, "cannot write " + q(path) + ": " + errno_text(ELOOP));
    const fs::path target = fs::read_symlink(resolved, ec);  // a link to a file not there yet
    resolved = fs::weakly_canonical(target.is_absolute() ? target : resolved.parent_path() / target, ec);
  }
  const std::string key = resolved.string();
  if (ec || key.empty()) return Status::Io(flag, "cannot write " + q(path) + ": " + ec.message());
  for (const Entry& e : entries_)
    if (e.key == key) return Status::Invalid(flag, "names the same file as " + e.flag + " (" + q(path) + ")");
  struct stat sb;
  const bool exists = ::stat(key.c_str(), &sb) == 0;
  if (exists && S_ISDIR(sb.st_mode)) return Status::Io(flag, "cannot write " + q(path) + ": is a directory");
  if (exists && !S_ISREG(sb.st_mode)) {  // a device, a FIFO: written in place
    if (::access(key.c_str(), W_OK) != 0)
      return Status::Io(flag, "cannot write " + q(path) + ": " + errno_text(errno));
    entries_.push_back({flag, path, key, true, nullptr, {}, false});
    return Status::Ok();
  }
  const std::string dir = parent_dir(key);
  if (!std::filesystem::is_directory(dir, ec))
    return Status::Io(flag, "cannot write " + q(path) + ": " + q(dir) +
                                (std::filesystem::exists(dir, ec) ? " is not a directory" : " does not exist"));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return Status::Io(flag, "cannot write " + q(path) + ": directory " + q(dir) + " is not writable");
  if (const int e = probe_dir_errno(dir); e != 0)
    return Status::Io(flag, "cannot write " + q(path) + ": " + errno_text(e));
  entries_.push_back({flag, path, key, false, nullptr, {}, false});
  return Status::Ok();
}

void OutputSet::attach(const std::string& flag, const Tensor* t) {
  for (Entry& e : entries_)
    if (e.flag == flag) e.tensor = t;
}

void OutputSet::attach_bytes(const std::string& flag, std::string bytes) {
  for (Entry& e : entries_)
    if (e.flag == flag) {
      e.bytes = std::move(bytes);
      e.has_bytes = true;
    }
}

Status OutputSet::commit() {
  struct Step {
    const Entry* entry;
    std::string tmp, backup;
    bool displaced = false, linked = false, placed = false;
  };
  std::vector<Step> steps;
  auto cleanup = [&steps]() {
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      if (it->linked) {  // the old file is still at the destination unless the new one replaced it
        if (it->placed) ::rename(it->backup.c_str(), it->entry->key.c_str());
        else ::unlink(it->backup.c_str());
      } else {
        if (it->placed) ::unlink(it->entry->key.c_str());
        if (it->displaced) ::rename(it->backup.c_str(), it->entry->key.c_str());
      }
      if (!it->placed && !it->tmp.empty()) ::unlink(it->tmp.c_str());
    }
  };
  auto bytes_of = [](const Entry& e, std::string* out) -> Status {
    if (e.has_bytes) {
      *out = e.bytes;
      return Status::Ok();
    }
    if (npy_descr(e.tensor->dtype()) == nullptr)
      return Status::Invalid(e.flag, std::string(dtype_name(e.tensor->dtype())) + " has no .npy dtype");
    *out = npy_bytes(*e.tensor);
    return Status::Ok();
  };
  // 0. no output replaces a file this run read (its input would be gone; write elsewhere)
  for (const Entry& e : entries_)
    for (const auto& [in_flag, in_key] : inputs_read())
      if (!e.in_place && e.key == in_key)
        return Status::Invalid(e.flag, "names the same file as the input " + in_flag + " (" + q(e.path) +
                                           "); write the output elsewhere");
  // 1. every temporary (regular destinations)
  std::string bytes;
  for (const Entry& e : entries_) {
    if ((e.tensor == nullptr && !e.has_bytes) || e.in_place) continue;
    Step s{&e, "", "", false, false};
    Status st = bytes_of(e, &bytes);
    if (st.ok()) st = write_temp(e.key, e.path, bytes, e.flag, &s.tmp);
    if (!st.ok()) {
      cleanup();
      return st;
    }
    steps.push_back(std::move(s));
  }
  // 2. devices and FIFOs, written in place
  for (const Entry& e : entries_) {
    if ((e.tensor == nullptr && !e.has_bytes) || !e.in_place) continue;
    Status st = bytes_of(e, &bytes);
    if (!st.ok()) {
      cleanup();
      return st;
    }
    const int fd = ::open(e.key.c_str(), O_WRONLY | O_CLOEXEC);
    const bool ok = fd >= 0 && write_all(fd, bytes);
    const int err = errno;
    if (fd >= 0 && ::close(fd) != 0 && ok) {
      const int e2 = errno;
      cleanup();
      return Status::Io(e.flag, "cannot write " + q(e.path) + ": " + errno_text(e2));
    }
    if (!ok) {
      cleanup();
      return Status::Io(e.flag, "cannot write " + q(e.path) + ": " + errno_text(err));
    }
  }
  // 3. the renames. A file already at a destination gets a second name (a hard link) first, so that
  // it can be put back if a later output fails, while the rename replaces it in one step: a process
  // killed at any point leaves the old file or the new one there, never neither. Where no hard link
  // can be made (not a regular file, a file system without them) it is moved aside instead.
  for (Step& s : steps) {
    const std::string& path = s.entry->key;
    struct stat sb;
    if (::lstat(path.c_str(), &sb) == 0) {
      s.backup = s.tmp + ".old";
      s.linked = S_ISREG(sb.st_mode) && ::link(path.c_str(), s.backup.c_str()) == 0;
      if (!s.linked && ::rename(path.c_str(), s.backup.c_str()) != 0) {
        const int e = errno;
        cleanup();
        return Status::Io(s.entry->flag, "cannot replace " + q(s.entry->path) + ": " + errno_text(e));
      }
      s.displaced = true;
    }
    if (::rename(s.tmp.c_str(), path.c_str()) != 0) {
      const int e = errno;
      cleanup();
      return Status::Io(s.entry->flag, "cannot write " + q(s.entry->path) + ": " + errno_text(e));
    }
    s.placed = true;
  }
  for (const Step& s : steps)
    if (s.displaced) ::unlink(s.backup.c_str());
  return Status::Ok();
}

}  // namespace posenc::cli
