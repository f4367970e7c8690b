#!/usr/bin/env bash
# Compiles each header under INCLUDE_DIR/popart on its own, with nothing but INCLUDE_DIR and the
# system's include paths: a public header that needs an internal one (or a missing include of its
# own) fails here, naming the header. Usage: check_headers.sh INCLUDE_DIR [CXX]
set -uo pipefail
include_dir="$1"
cxx="${2:-c++}"
mapfile -t headers < <(cd "$include_dir" && find popart -name '*.hpp' | sort)
if ((${#headers[@]} == 0)); then
  echo "check_headers: no headers under $include_dir/popart" >&2
  exit 1
fi
failed=0
for h in "${headers[@]}"; do
  if ! out=$(printf '#include <%s>\n' "$h" |
    "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Werror -I "$include_dir" -x c++ - 2>&1); then
    echo "check_headers: $h does not compile on its own:" >&2
    grep -m 3 -E "error" <<<"$out" >&2
    failed=1
  fi
done
if ((failed)); then exit 1; fi
echo "check_headers: ${#headers[@]} headers compile on their own"
