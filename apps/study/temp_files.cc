#include "study/temp_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace posenc::files {
namespace {

std::atomic<unsigned> g_counter{0};

void split(const std::string& dest, std::string* dir, std::string* name) {
  const std::filesystem::path p(dest);
  *dir = p.parent_path().empty() ? std::string(".") : p.parent_path().string();
  *name = p.filename().string();
}

std::string prefix_of(const std::string& name) { return "." + name + ".posenc-tmp-"; }

bool process_gone(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

}  // namespace

std::string temp_path(const std::string& dest) {
  std::string dir, name;
  split(dest, &dir, &name);
  return dir + "/" + prefix_of(name) + std::to_string(::getpid()) + "-" + std::to_string(g_counter++);
}

void remove_stale_temps(const std::string& dest) {
  std::string dir, name;
  split(dest, &dir, &name);
  const std::string prefix = prefix_of(name);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string entry = e->d_name;
    if (entry.compare(0, prefix.size(), prefix) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(entry.c_str() + prefix.size(), &end, 10);
    if (end == entry.c_str() + prefix.size() || *end != '-' || !process_gone(pid)) continue;
    stale.push_back(entry);
  }
  ::closedir(d);
  struct stat sb;
  const bool dest_there = ::lstat(dest.c_str(), &sb) == 0;
  for (const std::string& entry : stale) {
    const bool backup = entry.size() > 4 && entry.compare(entry.size() - 4, 4, ".old") == 0;
    if (!backup || dest_there) ::unlink((dir + "/" + entry).c_str());
  }
}

bool write_atomic(const std::string& dest, const std::string& text) {
  remove_stale_temps(dest);
  const std::string tmp = temp_path(dest);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return false;
  const char* p = text.data();
  std::size_t left = text.size();
  bool ok = true;
  while (ok && left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) p += n, left -= static_cast<std::size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  int err = errno;
  ok = ::close(fd) == 0 && ok;
  if (ok && ::rename(tmp.c_str(), dest.c_str()) == 0) return true;
  if (ok) err = errno;
  ::unlink(tmp.c_str());
  errno = err;
  return false;
}

}  // namespace posenc::files
