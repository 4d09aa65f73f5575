#!/usr/bin/env bash
# Runs the tests that need no root: every test of the product packages (all but test/ and bench/)
# except those in files named kernel_test.go or <topic>_kernel_test.go, which need root
# (test/README.md). Packages without kernel test files run in one `go test`; each package with
# some runs on its own, skipping exactly the Test and Benchmark functions its kernel files
# declare (a name shared with another package's pure test does not skip that one).
#
#   hack/unit.sh [go test flags]...
set -euo pipefail
cd "$(dirname "$0")/.."
GO="${GO:-go}"
module=$($GO list -m)
plain=()
status=0
while read -r pkg dir; do
  shopt -s nullglob
  kernel=("$dir"/*kernel_test.go)
  shopt -u nullglob
  if [ ${#kernel[@]} -eq 0 ]; then
    plain+=("$pkg")
    continue
  fi
  names=$(grep -ho '^func \(Test\|Benchmark\)[A-Za-z0-9_]*' "${kernel[@]}" | sed 's/^func //' | paste -sd'|' -)
  if [ -z "$names" ]; then
    plain+=("$pkg")
    continue
  fi
  $GO test "$@" -skip "^($names)\$" "$pkg" || status=1
done < <($GO list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' ./... |
  grep -v -e "^$module/test/" -e "^$module/bench[/ ]")
if [ ${#plain[@]} -gt 0 ]; then
  $GO test "$@" "${plain[@]}" || status=1
fi
exit $status
