#!/usr/bin/env bash
# Builds the Kubernetes binaries of kubenet's end-to-end runs into a cache directory outside the
# checkout and prints that directory:
#
#   hack/kubernetes/build.sh                          # everything below
#   hack/kubernetes/build.sh kube-apiserver etcd      # only these (test/agent needs no more)
#   KUBENET_KUBERNETES_DIR=/x hack/kubernetes/build.sh   # -> /x
#
# Binaries: kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kubelet, kube-proxy,
# kubectl, agnhost, coredns, ginkgo and e2e-network.test (the e2e suite with only the
# sig-network specs, e2e/network_test.go); and localhost.crt/.key, agnhost's TLS pair, which
# its image holds. All but CoreDNS come from this one module (go.mod, at
# the versions of versions.env), so the packages they share compile once; CoreDNS is
# `go install`ed at its own release. The directory is $(dirname $(go env GOCACHE))/kubenet-kubernetes/<stamp>,
# the stamp a hash of everything that decides the binaries (this script, go.mod, go.sum,
# versions.env, the test main): a second run only finds them. A cold build takes about
# 10 minutes on 2 cores (9 min 34 s measured, kube-apiserver and etcd 3 min 15 s of it; more when
# the cores are busy) and 2 GiB of memory at its peak; it runs under nice.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
# shellcheck source=versions.env
. ./versions.env
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0
all=(kube-apiserver etcd kube-controller-manager kube-scheduler kubelet kube-proxy kubectl agnhost coredns ginkgo e2e-network.test localhost.crt localhost.key)
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${all[@]}")

stamp="$(cat build.sh go.mod go.sum versions.env e2e/*.go | sha256sum | cut -c1-12)"
dir="${KUBENET_KUBERNETES_DIR:-$(dirname "$(go env GOCACHE)")/kubenet-kubernetes/$stamp}"
mkdir -p "$dir"
# Concurrent runs (parallel make targets, two test binaries) take turns; the second one finds
# the binaries built.
exec 9>"$dir/.lock"
flock 9

minor="${KUBERNETES#v1.}"; minor="${minor%%.*}"
stampflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stampflags+=" -X $pkg.gitVersion=$KUBERNETES -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

# The Go package of each binary built from this module.
declare -A pkg=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
  [agnhost]=k8s.io/kubernetes/test/images/agnhost
  [etcd]=go.etcd.io/etcd/server/v3
  [ginkgo]=github.com/onsi/ginkgo/v2/ginkgo
)
missing=()
for name in "${wanted[@]}"; do
  case " ${all[*]} " in *" $name "*) ;; *) echo "build.sh: unknown binary $name (known: ${all[*]})" >&2; exit 2 ;; esac
  [ -x "$dir/$name" ] || missing+=("$name")
done

# Each binary is written under a temporary name and renamed only when whole, so a build killed
# half-way is never mistaken for a finished one.
tmp="$dir/.tmp.$$"
rm -rf "$dir"/.tmp.*
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
pkgs=()
for name in "${missing[@]}"; do
  [ -z "${pkg[$name]:-}" ] || pkgs+=("${pkg[$name]}")
done
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "build.sh: building ${pkgs[*]} into $dir" >&2
  # One go build for all of them: shared packages compile once.
  nice go build -trimpath -ldflags "-s -w$stampflags" -o "$tmp/" "${pkgs[@]}" >&2
  # etcd's main package is its module's root, go.etcd.io/etcd/server/v3: go names it "server".
  [ ! -e "$tmp/server" ] || mv "$tmp/server" "$tmp/etcd"
fi
for name in "${missing[@]}"; do
  case "$name" in
  e2e-network.test)
    echo "build.sh: building the e2e test binary into $dir" >&2
    nice go test -c -trimpath -ldflags "-s -w$stampflags" -o "$tmp/$name" ./e2e/ >&2 ;;
  localhost.crt | localhost.key)
    # The TLS pair of agnhost's porter, which its image carries at /.
    cp "$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/porter/$name" "$tmp/$name" ;;
  coredns)
    echo "build.sh: building coredns $COREDNS into $dir" >&2
    (cd / && GOFLAGS=-mod=mod GOBIN="$tmp" nice go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS") >&2 ;;
  esac
  mv "$tmp/$name" "$dir/$name"
done
echo "$dir"
