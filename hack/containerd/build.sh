#!/usr/bin/env bash
# Builds containerd 2.x for kubenet's end-to-end runs (the runtime of one `make e2e-kubernetes`
# cluster and of `make e2e-runtimes`' containerd 2 tests) from the Go module proxy into a cache
# directory outside the checkout, and prints that directory:
#
#   hack/containerd/build.sh                          # -> <cache>/kubenet-containerd/<stamp>
#   KUBENET_CONTAINERD_DIR=/x hack/containerd/build.sh   # -> /x
#
# Binaries: containerd, containerd-shim-runc-v2 and ctr, at the version go.mod pins (its tool
# directives; update.sh moves it), static (CGO_ENABLED=0), without the snapshotters and the
# tracing exporter the tests disable anyway (btrfs and zfs need what is not there, devmapper a
# thin pool). runc stays Debian's. The directory is $(dirname $(go env GOCACHE))/kubenet-containerd/<stamp>,
# the stamp a hash of everything that decides the binaries (this script, go.mod, go.sum), as
# hack/kubernetes/build.sh keys its cache: a second run only finds them. A cold build takes
# about 4 minutes on 2 idle cores with empty module and build caches (3 min 27 s and 4 min 10 s
# measured; far more when the cores are busy), seconds when only the binaries are gone; it runs
# under nice.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
module=github.com/containerd/containerd/v2
all=(containerd containerd-shim-runc-v2 ctr)

stamp="$(cat build.sh go.mod go.sum | sha256sum | cut -c1-12)"
dir="${KUBENET_CONTAINERD_DIR:-$(dirname "$(go env GOCACHE)")/kubenet-containerd/$stamp}"
mkdir -p "$dir"
# Concurrent runs (e2e-runtimes and e2e-kubernetes at once) take turns; the second one finds
# the binaries built.
exec 9>"$dir/.lock"
flock 9

missing=()
for name in "${all[@]}"; do
  [ -x "$dir/$name" ] || missing+=("$name")
done
if [ ${#missing[@]} -gt 0 ]; then
  version="$(go list -m -f '{{.Version}}' "$module")"
  # Each binary is written under a temporary name and renamed only when whole, so a build
  # killed half-way is never mistaken for a finished one.
  tmp="$dir/.tmp.$$"
  rm -rf "$dir"/.tmp.*
  mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  pkgs=()
  for name in "${missing[@]}"; do pkgs+=("$module/cmd/$name"); done
  echo "build.sh: building containerd $version (${missing[*]}) into $dir" >&2
  # One go build for all of them: the packages they share compile once. The version is
  # stamped as containerd's own Makefile does, so `containerd --version` and CRI's Version
  # report it.
  nice go build -trimpath -tags "urfave_cli_no_docs no_btrfs no_zfs no_devmapper no_tracing" \
    -ldflags "-s -w -X $module/version.Version=$version -X $module/version.Package=$module" \
    -o "$tmp/" "${pkgs[@]}" >&2
  for name in "${missing[@]}"; do mv "$tmp/$name" "$dir/$name"; done
fi
echo "$dir"
