#!/usr/bin/env bash
# Builds kube-apiserver and etcd (the versions go.mod pins) into a cache directory outside the
# checkout and prints that directory. Repeated runs only compare a stamp: the binaries are rebuilt
# when go.mod or go.sum change. The cold build takes minutes and about 1.7 GiB of memory; the
# test that needs the binaries (test/agent) calls this script.
#
#   hack/apiserver/build.sh            # -> $(dirname $(go env GOCACHE))/kubenet-apiserver/<stamp>
#   KUBENET_APISERVER_DIR=/x build.sh  # -> /x
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
stamp="$(cat go.mod go.sum | sha256sum | cut -c1-12)"
dir="${KUBENET_APISERVER_DIR:-$(dirname "$(go env GOCACHE)")/kubenet-apiserver/$stamp}"
mkdir -p "$dir"
# Parallel test binaries or make runs take turns; the second one finds the binaries built.
exec 9>"$dir/.lock"
flock 9
if [ ! -x "$dir/kube-apiserver" ] || [ ! -x "$dir/etcd" ]; then
  go build -trimpath -o "$dir/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver >&2
  go build -trimpath -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3 >&2
  # Renamed only when whole, so a build killed half-way is never mistaken for a finished one.
  mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
  mv "$dir/etcd.tmp" "$dir/etcd"
fi
echo "$dir"
