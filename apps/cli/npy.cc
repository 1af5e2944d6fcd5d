#include "cli/npy.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <utility>

namespace posenc::cli {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
// Refuse absurd tensors before allocating (2^40 bytes).
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 40;

std::string errno_text(int e) { return std::strerror(e); }

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

}  // namespace

std::string quoted(const std::string& path) {
  std::string out = "'";
  for (char c : path) out += (c == '\n' || c == '\r') ? ' ' : c;
  return out + "'";
}

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
std::vector<std::pair<std::string, std::string>>& inputs_list() {
  static std::vector<std::pair<std::string, std::string>> files;
  return files;
}
}  // namespace

const std::vector<std::pair<std::string, std::string>>& inputs_read() { return inputs_list(); }

void note_input(const std::string& path, const std::string& flag) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  const std::string key = std::filesystem::canonical(path, ec).string();
  if (!ec) inputs_list().emplace_back(flag, key);
}

Expected<Tensor> read_npy(const std::string& path, const std::string& flag) {
  std::error_code ec;
  note_input(path, flag);
  if (std::filesystem::is_directory(path, ec))
    return Status::Io(flag, "cannot read " + quoted(path) + ": is a directory, expected a .npy file");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::Io(
        flag, "cannot open " + quoted(path) + ": " + (errno != 0 ? errno_text(errno) : std::string("unreadable")));
  in.seekg(0, std::ios::end);
  const std::int64_t file_size = static_cast<std::int64_t>(in.tellg());
  in.seekg(0, std::ios::beg);
  return read_npy_stream(in, file_size, path, flag);
}

Expected<Tensor> read_npy_stream(std::istream& in, std::int64_t file_size, const std::string& path,
                                 const std::string& flag) {
  const std::string not_npy = "not a .npy file: " + quoted(path);
  char pre[kMagicLen + 2] = {};
  if (file_size < static_cast<std::int64_t>(sizeof pre) || !in.read(pre, sizeof pre) ||
      std::memcmp(pre, kMagic, kMagicLen) != 0)
    return Status::Invalid(flag, not_npy + " (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(pre[kMagicLen]);
  if (major < 1 || major > 3)
    return Status::Invalid(flag, "unsupported .npy format version " + std::to_string(major) + " in " +
                                     quoted(path) + ", expected 1, 2 or 3");
  std::uint32_t header_len = 0;
  unsigned char len_bytes[4] = {};
  const int len_size = major == 1 ? 2 : 4;
  if (!in.read(reinterpret_cast<char*>(len_bytes), len_size))
    return Status::Invalid(flag, "truncated .npy header in " + quoted(path));
  for (int i = len_size - 1; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  const std::int64_t data_start = static_cast<std::int64_t>(sizeof pre) + len_size + header_len;
  if (data_start > file_size) return Status::Invalid(flag, "truncated .npy header in " + quoted(path));
  std::string text(header_len, '\0');
  if (header_len > 0 && !in.read(text.data(), header_len))
    return Status::Invalid(flag, "truncated .npy header in " + quoted(path));

  Header h;
  const std::string err = HeaderParser(text).parse(&h);
  if (err == "structured dtype")
    return Status::Invalid(flag, "unsupported dtype (structured) in " + quoted(path) +
                                     ", expected float32, float64, float16, int32 or int64");
  if (!err.empty()) return Status::Invalid(flag, "malformed .npy header in " + quoted(path) + ": " + err);
  const std::optional<DType> dtype = parse_descr(h.descr);
  if (!dtype)
    return Status::Invalid(flag, "unsupported dtype '" + h.descr + "' in " + quoted(path) +
                                     ", expected little-endian float32, float64, float16, int32 or int64 "
                                     "('<f4', '<f8', '<f2', '<i4', '<i8')");
  if (h.fortran)
    return Status::Invalid(flag, quoted(path) +
                                     " is in Fortran order, expected C order "
                                     "(save np.ascontiguousarray(a))");
  if (h.shape.size() > static_cast<std::size_t>(kMaxDims))
    return Status::Invalid(flag, quoted(path) + " has " + std::to_string(h.shape.size()) +
                                     " dimensions, at most " + std::to_string(kMaxDims) + " supported");
  std::int64_t bytes = static_cast<std::int64_t>(dtype_size(*dtype));
  for (std::int64_t s : h.shape) {
    if (s != 0 && bytes > kMaxBytes / s)
      return Status::Invalid(flag, quoted(path) + " is too large: shape " + shape_tuple(h.shape));
    bytes *= s;
  }
  if (file_size - data_start < bytes)
    return Status::Invalid(flag, "truncated .npy data in " + quoted(path) + ": shape " + shape_tuple(h.shape) +
                                     " needs " + std::to_string(bytes) + " bytes, found " +
                                     std::to_string(file_size - data_start));
  Tensor t(*dtype, h.shape);
  if (bytes > 0 && !in.read(static_cast<char*>(t.data()), bytes))
    return Status::Io(flag, "cannot read " + quoted(path) + ": " + errno_text(errno));
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

}  // namespace posenc::cli
