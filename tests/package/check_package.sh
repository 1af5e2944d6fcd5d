#!/usr/bin/env bash
# posenc as other projects consume it: the README's examples built against an installed package
# (find_package and pkg-config; static and shared) and against posenc as a subproject.
#   check_package.sh static       SRC WORK BUILD   installs the tests' own (static) build tree
#   check_package.sh shared       SRC WORK         builds and installs libposenc.so
#   check_package.sh subdirectory SRC WORK         add_subdirectory(posenc) in a consumer project
# Each variant's examples must run and print the same lines. Exit 0 when all hold.
set -euo pipefail
mode=$1 src=$(cd "$2" && pwd) work=$3
rm -rf "$work" && mkdir -p "$work"
config=$src/tests/data/rope/llama-3.1-8b.json
fail() { echo "package $mode: $*" >&2; exit 1; }
quiet() { "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log" >&2; fail "failed: $*"; }; }

# Runs the examples of one build ($1 = folder, $2 = label) and checks they agree with the first run.
run_examples() {
  local out="$work/$2.out"
  LD_LIBRARY_PATH="${prefix:-}/lib" "$1/llama_alibi" "$config" >"$out" || fail "$2: llama_alibi failed"
  LD_LIBRARY_PATH="${prefix:-}/lib" "$1/rope_alibi_c" >>"$out" || fail "$2: rope_alibi_c failed"
  [[ -s "$out" ]] || fail "$2: the examples printed nothing"
  if [[ -f "$work/first.out" ]]; then
    cmp -s "$work/first.out" "$out" || fail "$2 printed other numbers than $(cat "$work/first.label")"
  else
    cp "$out" "$work/first.out" && echo "$2" >"$work/first.label"
  fi
  echo "package $mode: $2 ok"
}

# The examples against an installed prefix: CMake's find_package, then pkg-config with the compilers.
consume() {
  quiet cmake -S "$src/examples" -B "$work/ex-cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix"
  quiet ninja -C "$work/ex-cmake"
  run_examples "$work/ex-cmake" "find_package"
  export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
  mkdir -p "$work/ex-pc"
  # shellcheck disable=SC2046
  quiet g++ -std=c++20 "$src/examples/cpp/llama_alibi.cc" -o "$work/ex-pc/llama_alibi" $(pkg-config --cflags --libs posenc)
  # shellcheck disable=SC2046
  quiet gcc -std=c11 "$src/examples/c/rope_alibi.c" -o "$work/ex-pc/rope_alibi_c" $(pkg-config --cflags --libs posenc)
  run_examples "$work/ex-pc" "pkg-config"
  local want
  want=$(sed -n 's/^project(posenc VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
  [[ "$(pkg-config --modversion posenc)" == "$want" ]] || fail "pkg-config --modversion is not $want"
}

case "$mode" in
  static)
    build=$4 prefix=$work/prefix
    quiet cmake --install "$build" --prefix "$prefix"
    [[ -f "$prefix/lib/libposenc.a" ]] || fail "no lib/libposenc.a installed"
    [[ ! -e "$prefix/lib/libposenc.so" ]] || fail "a static build installed a shared library"
    consume ;;
  shared)
    prefix=$work/prefix
    quiet cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
      -DPOSENC_BUILD_APPS=OFF -DPOSENC_BUILD_TESTS=OFF
    quiet ninja -C "$work/build"
    quiet cmake --install "$work/build" --prefix "$prefix"
    soname=$(objdump -p "$prefix/lib/libposenc.so" | awk '$1 == "SONAME" {print $2}')
    [[ "$soname" == libposenc.so.0 ]] || fail "SONAME is '$soname', expected libposenc.so.0"
    [[ -L "$prefix/lib/libposenc.so" && -e "$prefix/lib/$soname" ]] || fail "no libposenc.so -> $soname links"
    consume ;;
  subdirectory)
    # The flags of the test command's top-level build (-O2, -std=c++20, -fPIC: it builds the Python module),
    # so that ccache finds its objects.
    quiet cmake -S "$src/tests/package/subdirectory" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG -fPIC" -DCMAKE_CXX_EXTENSIONS=OFF -DPOSENC_SOURCE_DIR="$src"
    quiet ninja -C "$work/build"
    run_examples "$work/build/examples" "add_subdirectory" ;;
  *) fail "unknown mode (static, shared, subdirectory)" ;;
esac
echo "package $mode: passed"
