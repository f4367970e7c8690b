#!/bin/bash
# Runs a command and passes only if it exits with the expected status and its output (stdout and
# stderr together) matches a POSIX extended regular expression, in which '.' also matches a
# newline. ctest's PASS_REGULAR_EXPRESSION alone ignores the exit status, so a program that printed
# the expected line and then crashed or failed would pass; tests/CMakeLists.txt and
# bench/CMakeLists.txt run such checks through this script instead.
# Usage: expect_output.sh STATUS REGEX COMMAND [ARGS...]
set -u
if [ $# -lt 3 ]; then
  echo "usage: expect_output.sh STATUS REGEX COMMAND [ARGS...]" >&2
  exit 2
fi
want=$1
re=$2
shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
if [ "$status" -ne "$want" ]; then
  echo "expect_output: exit status $status, expected $want: $*"
  exit 1
fi
if ! [[ "$(cat "$out")" =~ $re ]]; then
  echo "expect_output: the output does not match '$re': $*"
  exit 1
fi
echo "expect_output: exit status $status and the output as expected"
