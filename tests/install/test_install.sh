#!/usr/bin/env bash
# Installs the build into a temporary prefix (then moves it, so that nothing may point back to
# where it was installed), checks the layout, the SONAME and that the public headers stand alone,
# and builds examples/ (infer and the custom_op plugins) against it as a user would: with
# find_package(PopartCpu) and with pkg-config. Both programs run on examples/mlp.onnx and must
# match numpy; the plugins run under the installed popart-run (tests/plugins/test_custom_op_cli.py).
# Usage: test_install.sh BUILD_DIR SOURCE_DIR LIBDIR   (LIBDIR: CMAKE_INSTALL_LIBDIR, e.g. lib)
set -euo pipefail
build="$1"
src="$2"
libdir="$3"
python=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "test_install: $*" >&2
  exit 1
}

cmake --install "$build" --prefix "$tmp/staged" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install failed"; }
mv "$tmp/staged" "$tmp/prefix"
prefix="$tmp/prefix"
lib="$prefix/$libdir"

# The library: real file, SONAME link, development link; the SONAME carries the major version.
[[ -f "$lib/libpopart-cpu.so.0.1.0" && ! -L "$lib/libpopart-cpu.so.0.1.0" ]] || fail "no $libdir/libpopart-cpu.so.0.1.0"
[[ $(readlink "$lib/libpopart-cpu.so.0") == libpopart-cpu.so.0.1.0 ]] || fail "libpopart-cpu.so.0 is not a link to libpopart-cpu.so.0.1.0"
[[ $(readlink "$lib/libpopart-cpu.so") == libpopart-cpu.so.0 ]] || fail "libpopart-cpu.so is not a link to libpopart-cpu.so.0"
soname=$(objdump -p "$lib/libpopart-cpu.so.0.1.0" | awk '$1 == "SONAME" {print $2}')
[[ "$soname" == libpopart-cpu.so.0 ]] || fail "SONAME is '$soname', expected libpopart-cpu.so.0"
for f in bin/popart-run "$libdir/cmake/PopartCpu/PopartCpuConfig.cmake" \
  "$libdir/cmake/PopartCpu/PopartCpuConfigVersion.cmake" "$libdir/cmake/PopartCpu/PopartCpuTargets.cmake" \
  "$libdir/pkgconfig/popart-cpu.pc"; do
  [[ -f "$prefix/$f" ]] || fail "$f is not installed"
done

# Exactly the public headers are installed, and each compiles on its own.
diff <(cd "$src/include" && find popart -name '*.hpp' | sort) <(cd "$prefix/include" && find . -type f | sed 's|^\./||' | sort) ||
  fail "the installed include/ differs from the source's include/popart headers (above)"
bash "$src/tests/install/check_headers.sh" "$prefix/include"

# The installed popart-run uses the installed library.
where=$(realpath -m "$(ldd "$prefix/bin/popart-run" | awk '$1 == "libpopart-cpu.so.0" {print $3}')")
[[ "$where" == "$(realpath "$lib/libpopart-cpu.so.0")" ]] || fail "installed popart-run loads libpopart-cpu.so.0 from '$where', not $lib"
"$prefix/bin/popart-run" --list-ops >/dev/null || fail "installed popart-run --list-ops failed"

# Runs an example program on mlp.onnx; its output must match numpy and it must use the install.
run_example() {
  local program="$1" out where
  where=$(realpath -m "$(ldd "$program" | awk '$1 == "libpopart-cpu.so.0" {print $3}')")
  [[ "$where" == "$(realpath "$lib/libpopart-cpu.so.0")" ]] || fail "$program loads libpopart-cpu.so.0 from '$where', not $lib"
  out=$("$program" "$src/examples/mlp.onnx") || fail "$program failed: $out"
  "$python" "$src/tests/install/compare_probs.py" "$src/examples/mlp.onnx" "$out"
}

# find_package(PopartCpu) from examples/CMakeLists.txt, outside this project's build.
cmake -S "$src/examples" -B "$tmp/examples" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "configuring examples/ failed"; }
grep -q "PopartCpu_DIR:PATH=$lib/cmake/PopartCpu" "$tmp/examples/CMakeCache.txt" ||
  fail "examples/ found PopartCpu elsewhere: $(grep PopartCpu_DIR "$tmp/examples/CMakeCache.txt")"
cmake --build "$tmp/examples" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "building examples/ failed"; }
echo "find_package(PopartCpu):"
run_example "$tmp/examples/infer"

# The custom-op plugins of examples/custom_op, built against the install, loaded by the installed
# popart-run: a model using both, its forward against numpy, training, the refusals.
for plugin in leaky_relu_op cube_op; do
  [[ -f "$tmp/examples/custom_op/lib$plugin.so" ]] || fail "examples/custom_op did not build lib$plugin.so"
done
echo "examples/custom_op plugins with the installed popart-run:"
"$python" "$src/tests/plugins/test_custom_op_cli.py" "$prefix/bin/popart-run" \
  "$tmp/examples/custom_op/libleaky_relu_op.so" "$tmp/examples/custom_op/libcube_op.so" ||
  fail "the installed plugins failed tests/plugins/test_custom_op_cli.py"

# pkg-config, with the compiler alone.
export PKG_CONFIG_PATH="$lib/pkgconfig"
version=$(pkg-config --modversion popart-cpu)
[[ "$version" == 0.1.0 ]] || fail "pkg-config says version '$version', expected 0.1.0"
pc_libdir=$(pkg-config --variable=libdir popart-cpu)
# shellcheck disable=SC2046 # the flags are words
c++ -std=c++20 $(pkg-config --cflags popart-cpu) "$src/examples/infer.cpp" -o "$tmp/infer_pc" \
  $(pkg-config --libs popart-cpu) -Wl,-rpath,"$pc_libdir" || fail "compiling with pkg-config's flags failed"
echo "pkg-config popart-cpu:"
run_example "$tmp/infer_pc"
echo "test_install: PASSED"
