// OutputSet (cli/output_set.h): every output through a temporary beside its destination, then the
// renames, undone on any failure.
#include "cli/output_set.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "study/temp_files.h"

namespace posenc::cli {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

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
  if (fd < 0) return Status::Io(flag, "cannot write " + quoted(shown) + ": " + errno_text(errno));
  if (!write_all(fd, bytes) || ::fsync(fd) != 0) {  // on disk before the rename makes it the file
    const int e = errno;
    ::close(fd);
    ::unlink(name.c_str());
    return Status::Io(flag, "cannot write " + quoted(shown) + ": " + errno_text(e));
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(name.c_str());
    return Status::Io(flag, "cannot write " + quoted(shown) + ": " + errno_text(e));
  }
  *tmp = name;
  return Status::Ok();
}

// An error when key (an output's resolved path) is a file this run read.
Status names_input(const std::string& flag, const std::string& path, const std::string& key) {
  for (const auto& [in_flag, in_key] : inputs_read())
    if (key == in_key)
      return Status::Invalid(flag, "names the same file as the input " + in_flag + " (" + quoted(path) +
                                       "); write the output elsewhere");
  return Status::Ok();
}
}  // namespace

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
    if (hops == 40) return Status::Io(flag, "cannot write " + quoted(path) + ": " + errno_text(ELOOP));
    const fs::path target = fs::read_symlink(resolved, ec);  // a link to a file not there yet
    resolved = fs::weakly_canonical(target.is_absolute() ? target : resolved.parent_path() / target, ec);
  }
  const std::string key = resolved.string();
  if (ec || key.empty()) return Status::Io(flag, "cannot write " + quoted(path) + ": " + ec.message());
  for (const Entry& e : entries_)
    if (e.key == key) return Status::Invalid(flag, "names the same file as " + e.flag + " (" + quoted(path) + ")");
  struct stat sb;
  const bool exists = ::stat(key.c_str(), &sb) == 0;
  if (exists && S_ISREG(sb.st_mode))  // an input read already (inputs read later: commit())
    if (Status st = names_input(flag, path, key); !st.ok()) return st;
  if (exists && S_ISDIR(sb.st_mode)) return Status::Io(flag, "cannot write " + quoted(path) + ": is a directory");
  if (exists && !S_ISREG(sb.st_mode)) {  // a device, a FIFO: written in place
    if (::access(key.c_str(), W_OK) != 0)
      return Status::Io(flag, "cannot write " + quoted(path) + ": " + errno_text(errno));
    entries_.push_back({flag, path, key, true, nullptr, {}, false});
    return Status::Ok();
  }
  const std::string dir = parent_dir(key);
  if (!std::filesystem::is_directory(dir, ec))
    return Status::Io(flag, "cannot write " + quoted(path) + ": " + quoted(dir) +
                                (std::filesystem::exists(dir, ec) ? " is not a directory" : " does not exist"));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return Status::Io(flag, "cannot write " + quoted(path) + ": directory " + quoted(dir) + " is not writable");
  if (const int e = probe_dir_errno(dir); e != 0)
    return Status::Io(flag, "cannot write " + quoted(path) + ": " + errno_text(e));
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
    if (!e.in_place)
      if (Status st = names_input(e.flag, e.path, e.key); !st.ok()) return st;
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
      return Status::Io(e.flag, "cannot write " + quoted(e.path) + ": " + errno_text(e2));
    }
    if (!ok) {
      cleanup();
      return Status::Io(e.flag, "cannot write " + quoted(e.path) + ": " + errno_text(err));
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
        return Status::Io(s.entry->flag, "cannot replace " + quoted(s.entry->path) + ": " + errno_text(e));
      }
      s.displaced = true;
    }
    if (::rename(s.tmp.c_str(), path.c_str()) != 0) {
      const int e = errno;
      cleanup();
      return Status::Io(s.entry->flag, "cannot write " + quoted(s.entry->path) + ": " + errno_text(e));
    }
    s.placed = true;
  }
  for (const Step& s : steps)
    if (s.displaced) ::unlink(s.backup.c_str());
  return Status::Ok();
}

}  // namespace posenc::cli
