// study/temp_files.h — the temporaries of atomic writes: every output is written to a hidden
// temporary beside its destination, ".NAME.posenc-tmp-PID-N", then renamed over NAME. A process
// killed before its rename leaves the temporary behind (never a partial NAME); the next write of
// NAME removes those of processes that no longer run (docs/reliability.md, Writes).
#pragma once

#include <string>

namespace posenc::files {

// A fresh temporary path for dest (unique within this process; the pid makes it unique across).
std::string temp_path(const std::string& dest);

// Removes dest's temporaries whose process is gone. A ".old" copy (the CLI's backup of a file it
// replaces) is removed only while dest exists, so that it is never the last copy.
void remove_stale_temps(const std::string& dest);

// Writes text to a temporary, flushes it to disk and renames it over dest; false with errno set on
// failure (the temporary removed, dest untouched).
bool write_atomic(const std::string& dest, const std::string& text);

}  // namespace posenc::files
