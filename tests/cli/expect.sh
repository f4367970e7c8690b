# Sourced by the command-line test scripts: expect STATUS PATTERN -- command... runs the command
# and counts a pass if it exits with STATUS and its output (stdout and stderr) matches PATTERN,
# else prints the failure and counts it (the caller's failures and passes variables).
expect() {
  local want="$1" pattern="$2"
  shift 3
  local out status
  out=$("$@" 2>&1)
  status=$?
  if [[ $status -ne $want ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: $* -> status $status (want $want), output:"
    echo "$out" | head -30
    echo "  (expected pattern: $pattern)"
    failures=$((failures + 1))
  else
    passes=$((passes + 1))
  fi
}
