#!/usr/bin/env bash
# Builds the Debian package (cpack -G DEB) from a configured build folder, unpacks it into a fresh
# root (dpkg -x: nothing is installed on this machine), checks that its Depends name the Debian
# package of every library its programs load, and trains the Fashion-MNIST example for 50 steps
# with the unpacked popart-run.
# Usage: scripts/package.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, BUILD_DIR/package)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
out=$(realpath -m "${2:-$build/package}")
fail() {
  echo "package: $*" >&2
  exit 1
}
[[ -f "$build/CPackConfig.cmake" ]] || fail "$build/CPackConfig.cmake is missing: configure the build first (scripts/build.sh)"
cmake --build "$build" -j2 >/dev/null
rm -rf "$out"
mkdir -p "$out"
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$out" >"$out/cpack.log" 2>&1 || { cat "$out/cpack.log"; fail "cpack failed"; }
rm -rf "$out/_CPack_Packages"
debs=("$out"/*.deb)
[[ ${#debs[@]} == 1 && -f "${debs[0]}" ]] || fail "expected one .deb in $out, found: ${debs[*]}"
deb="${debs[0]}"
echo "package: $deb ($(du -k "$deb" | cut -f1) KiB)"
dpkg-deb -I "$deb" | grep -E "^ (Package|Version|Architecture|Maintainer|Installed-Size|Depends):"

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
dpkg -x "$deb" "$root"
run="$root/usr/bin/popart-run"
[[ -x "$run" ]] || fail "the package has no usr/bin/popart-run"

# Every library the package's programs and libraries need (their NEEDED entries), other than its
# own, must come from a package named in Depends (checked independently of dpkg-shlibdeps).
depends=$(dpkg-deb -f "$deb" Depends)
depends_names=$(tr ',|' '\n' <<<"$depends" | sed 's/([^)]*)//; s/ //g')
checked=0
while IFS= read -r elf; do
  ldd_out=$(ldd "$elf")
  for soname in $(objdump -p "$elf" | awk '$1 == "NEEDED" {print $2}'); do
    # ldd prints "soname => path", or the loader's path alone.
    path=$(awk -v n="$soname" '$1 == n && $2 == "=>" {print $3} $1 ~ "/" n "$" {print $1}' <<<"$ldd_out")
    [[ -n "$path" && "$path" != "not" ]] || fail "$elf needs $soname, which is not found"
    [[ "$(realpath "$path")" == "$root"/* ]] && continue
    owner=$(dpkg -S "$(realpath "$path")" 2>/dev/null | head -1 | cut -d: -f1) ||
      owner=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1) || true
    [[ -n "$owner" ]] || fail "no Debian package owns $path ($soname, needed by $elf)"
    # A library package may be depended on through a name it provides (libspdlog1.10-fmt9).
    mapfile -t names < <(echo "$owner"; dpkg-query -W -f='${Provides}' "$owner" | sed 's/([^)]*)//g; s/ //g' | tr ',' '\n')
    named=0
    for name in "${names[@]}"; do
      if grep -Fxq "$name" <<<"$depends_names"; then named=1; fi
    done
    ((named)) || fail "$soname ($path, needed by $elf) comes from $owner, which Depends does not name: $depends"
    checked=$((checked + 1))
  done
done < <(find "$root" -type f -exec sh -c 'file -b "$1" | grep -q "^ELF"' _ {} \; -print)
((checked > 0)) || fail "found no libraries the package's programs need"
echo "package: Depends names the packages of all $checked libraries its programs need"

where=$(realpath -m "$(ldd "$run" | awk '$1 == "libpopart-cpu.so.0" {print $3}')")
[[ "$where" == "$root"/usr/lib*/libpopart-cpu.so.* ]] || fail "the unpacked popart-run loads libpopart-cpu.so.0 from '$where'"
echo "== $run --example fashion-mnist --steps 50 =="
"$run" --example fashion-mnist --steps 50
