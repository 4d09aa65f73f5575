#!/usr/bin/env bash
# Builds cyclonus (github.com/mattfenwick/cyclonus), the community's NetworkPolicy test-case
# generator that `make e2e-cyclonus` runs against the cluster of test/e2e, from the Go module
# proxy into a cache outside the checkout, and prints the binary's path:
#
#   hack/cyclonus/build.sh                           # -> <cache>/kubenet-cyclonus/<version>/cyclonus
#   KUBENET_CYCLONUS_DIR=/x hack/cyclonus/build.sh   # -> /x/cyclonus
#
# Apart from hack/kubernetes/build.sh: its stamp would change with a new binary, and every
# Kubernetes binary would be linked again for a tool only this target runs. The cache's
# directory is named after the version, so a second run only finds the binary. A cold build
# takes a few minutes on 2 cores (client-go); it runs under nice.
set -euo pipefail
CYCLONUS=v0.5.6
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
dir="${KUBENET_CYCLONUS_DIR:-$(dirname "$(go env GOCACHE)")/kubenet-cyclonus/$CYCLONUS}"
mkdir -p "$dir"
# Concurrent runs take turns; the second one finds the binary built.
exec 9>"$dir/.lock"
flock 9
if [ ! -x "$dir/cyclonus" ]; then
  # Written under a temporary name and renamed only when whole.
  tmp="$dir/.tmp.$$"
  rm -rf "$dir"/.tmp.*
  mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  echo "build.sh: building cyclonus $CYCLONUS into $dir" >&2
  (cd / && GOFLAGS=-mod=mod GOBIN="$tmp" nice go install -trimpath \
    -ldflags "-s -w -X github.com/mattfenwick/cyclonus/pkg/cli.version=$CYCLONUS" \
    "github.com/mattfenwick/cyclonus/cmd/cyclonus@$CYCLONUS") >&2
  mv "$tmp/cyclonus" "$dir/cyclonus"
fi
echo "$dir/cyclonus"
