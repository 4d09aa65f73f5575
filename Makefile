# kubenet: make demo | make test | make lint | make bench | make build
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin:/usr/sbin:/sbin
GO ?= go
GOBIN ?= $(shell $(GO) env GOPATH)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
STATICCHECK_VERSION ?= v0.8.2
# The whole suite runs in well under this; the bound only stops a hung kernel call.
TEST_TIMEOUT ?= 20m

.PHONY: all build deps test unit lint fuzz demo bench clean

all: build

# The three binaries: the CNI plugin, the kubelet-flag CLI and the node agent, into bin/. Static
# (no cgo), like the agent image's: bin/kubenet goes to nodes whose C library may be older than
# this machine's.
BINARIES := kubenet kubenetctl kubenet-agent
build:
	@for b in $(BINARIES); do CGO_ENABLED=0 $(GO) build -ldflags "-X main.buildVersion=$(VERSION)" -o bin/$$b ./cmd/$$b || exit 1; done

deps:
	@hack/ensure-deps.sh

# The verb fuzzer's seed (TestVerbFuzz, test/cni): a new one per run, so CI keeps exploring, but
# chosen here and printed before the tests start, so that every run's log says how to replay it,
# also when the run is killed or times out (go test prints a passing package's output only with
# -v). KUBENET_FUZZ_SEED=<n> make test replays one. The seed runs on both netfilter backends,
# KUBENET_FUZZ_STEPS steps on each (KUBENET_FUZZ_BACKEND=nftables or iptables: one of them).
ifndef KUBENET_FUZZ_SEED
KUBENET_FUZZ_SEED := $(shell date +%s)
endif
KUBENET_FUZZ_STEPS ?= 75

# Every test, unit and end-to-end. As root: the end-to-end tests make network namespaces.
test: deps
	@echo "verb fuzzer: KUBENET_FUZZ_SEED=$(KUBENET_FUZZ_SEED) KUBENET_FUZZ_STEPS=$(KUBENET_FUZZ_STEPS) on nftables and iptables (replay: KUBENET_FUZZ_SEED=$(KUBENET_FUZZ_SEED) KUBENET_FUZZ_STEPS=$(KUBENET_FUZZ_STEPS) [KUBENET_FUZZ_BACKEND=nftables|iptables] go test -count=1 -run '^TestVerbFuzz$$' -v ./test/cni/)"
	KUBENET_FUZZ_SEED=$(KUBENET_FUZZ_SEED) KUBENET_FUZZ_STEPS=$(KUBENET_FUZZ_STEPS) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

# Tests that need no root (pure logic): every test of the product packages outside their
# *kernel_test.go files (test/README.md says how kernel tests are named).
unit:
	GO=$(GO) hack/unit.sh -count=1

# Each fuzz target for FUZZTIME on top of its corpus in testdata/fuzz.
FUZZTIME ?= 30s
FUZZ_TARGETS := ./core:FuzzParseConfig ./core:FuzzRuntimeConfig ./core:FuzzTeardownConfig ./core:FuzzGCList ./core:FuzzPrevResult ./cmd/kubenet:FuzzParseCNIArgs ./shaping:FuzzParseRate
fuzz:
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; done

# lint checks the build without tags (which finds code only tagged tests use) and with the tags
# of the test files behind build tags.
LINT_TAGS := e2e,kubenet_e2e_agent,kubenet_crashtest
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	@command -v staticcheck >/dev/null 2>&1 || [ -x $(GOBIN)/staticcheck ] || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	PATH=$(GOBIN):$$PATH staticcheck ./...
	$(GO) vet -tags $(LINT_TAGS) ./...
	PATH=$(GOBIN):$$PATH staticcheck -tags $(LINT_TAGS) ./...

# The demo is TestDemo (test/cni), filtered to what it prints. pipefail: a failing test fails
# make, loudly. The test binary first removes test namespaces that dead runs left (only those whose
# creating process is gone; see test/nettest) and removes its own when interrupted.
demo: deps build
	@set -o pipefail; $(GO) test -count=1 -run "^TestDemo$$" -v ./test/cni/ | grep -v -e "^=== " -e "^--- PASS" -e "^PASS" -e "^ok" \
	  || { echo "make demo: FAILED (the output above says where)" >&2; exit 1; }

# kubenet against the reference CNI chain (bridge + host-local, portmap, bandwidth of
# containernetworking/plugins, go-installed into a temporary dir), both through libcni in one
# node netns, plus ipam's BenchmarkAllocateRelease; writes the table into docs/bench.md; then the
# same workloads (without datapath and IPAM) with kubenet's and the reference's iptables backends
# into docs/bench.md's "(iptables)" block. As root, about 20 minutes on 2 cores; not part of
# `make test`. BENCH_ARGS=-bench.quick tries it in a minute and a half.
BENCH_ARGS ?=
bench: deps
	refdir=$$(mktemp -d /tmp/kubenet-refplugins-XXXXXX) && trap 'rm -rf "$$refdir"' EXIT && \
	KUBENET_REFPLUGINS_DIR=$$refdir $(GO) test -count=1 -run '^$$' -bench '^BenchmarkKubenetVsReference$$' \
	  -benchtime 1x -timeout 30m ./bench/ -args -bench.out ../docs/bench.md $(BENCH_ARGS) && \
	KUBENET_REFPLUGINS_DIR=$$refdir $(GO) test -count=1 -run '^$$' -bench '^BenchmarkKubenetVsReference$$' \
	  -benchtime 1x -timeout 30m ./bench/ -args -bench.out ../docs/bench.md -bench.section iptables \
	  -bench.kubenet-backend iptables -bench.ref-backend iptables -bench.ipam=false \
	  -bench.only sequential,hostports,parallel,status,scale $(BENCH_ARGS)
	$(MAKE) bench-netpol

# NetworkPolicy's cost (docs/networkpolicy.md): new connections and throughput between two pods
# with and without 100 policies, and with kube-network-policies v0.8.0 (built from hack/knp), and
# one policy with 100 to 50000 ipBlock peers (its passes, ADDs meanwhile, new connections), in
# bench/; and, in test/agent against a real API server (hack/kubernetes), a policy change's way to
# the node with 1000 pods and 200 policies and the agent's memory. As root, about 12 minutes;
# both write their tables into docs/networkpolicy.md. NETPOL_BENCH_ARGS="-bench.netpol-parts big"
# (or datapath) runs one part of bench/'s.
NETPOL_BENCH_ARGS ?=
.PHONY: bench-netpol
bench-netpol: deps
	hack/kubernetes/build.sh kube-apiserver etcd >/dev/null
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkNetworkPolicy$$' -benchtime 1x -timeout 30m ./bench/ \
	  -args -bench.netpol-out ../docs/networkpolicy.md $(NETPOL_BENCH_ARGS)
	$(GO) vet -tags kubenet_e2e_agent ./test/agent/
	$(GO) test -count=1 -tags kubenet_e2e_agent -run '^$$' -bench '^BenchmarkNetworkPolicyScale$$' -benchtime 1x -timeout 20m \
	  ./test/agent/ -args -netpol.out ../../docs/networkpolicy.md

# BenchmarkNetworkPolicyScale at issue 27's size (test/agent): 10 000 pods in 500 namespaces, 100
# of them on the node, 2 000 policies, in a real API server; pod and policy changes to the node's
# rules, the agent's CPU while 50 pods change a second for a minute, its first pass and memory.
# Prints its table (docs/networkpolicy.md has the figures with the load they were taken at);
# 9 to 12 minutes measured at a load average of 30 to 40.
.PHONY: bench-netpol-large
bench-netpol-large: deps
	hack/kubernetes/build.sh kube-apiserver etcd >/dev/null
	$(GO) test -count=1 -tags kubenet_e2e_agent -run '^$$' -bench '^BenchmarkNetworkPolicyScale$$' -benchtime 1x -timeout 40m \
	  ./test/agent/ -args -netpol.size large

# The differential NetworkPolicy tester's long run (test/netpoldiff, docs/networkpolicy.md):
# NETPOL_DIFF_CASES random cases from NETPOL_DIFF_FIRST_SEED (default: chosen from the clock and
# printed), then the figures: cases, probes, mismatches by class and kind, the seeds, the time.
# `make test` runs the package's fixed seed set. About 0.6 s a case on 2 cores; as root.
#   NETPOL_DIFF_CLASSES   a regexp of probe classes, e.g. '^(pod-pod|host-pod)/' or '-ll/'
#   NETPOL_DIFF_PROBES    probes per case (192)
NETPOL_DIFF_CASES ?= 2000
NETPOL_DIFF_FIRST_SEED ?=
NETPOL_DIFF_CLASSES ?=
NETPOL_DIFF_PROBES ?=
.PHONY: netpol-diff
netpol-diff: deps
	@set -o pipefail; KUBENET_NETPOL_CASES=$(NETPOL_DIFF_CASES) KUBENET_NETPOL_FIRST_SEED=$(NETPOL_DIFF_FIRST_SEED) \
	  KUBENET_NETPOL_CLASSES='$(NETPOL_DIFF_CLASSES)' KUBENET_NETPOL_PROBES=$(NETPOL_DIFF_PROBES) \
	  $(GO) test -count=1 -timeout 6h -run '^TestNetpolDifferential$$' -v ./test/netpoldiff/ \
	  | grep -v -e '^=== ' -e '^    --- PASS' -e '^    --- FAIL: TestNetpolDifferential/seed='

clean:
	rm -rf bin

# End-to-end runs kept out of `make test` (build tag e2e; docs/e2e.md says what each checks).
# Both run as root inside namespaces they create. The tagged test files are vetted first:
# `make lint` does not see them.
.PHONY: e2e-runtimes e2e-cluster
E2E_FLAGS := -tags e2e -count=1 -v

# Real runtimes drive kubenet: Debian's containerd 1.6 and containerd 2.2 (through their CRI
# sockets) and podman 4 (CNI backend), each in a jail inside a node netns; installs Debian's with
# apt-get when missing, and builds containerd 2.2 into a cache outside the checkout
# (hack/containerd/build.sh: about 4 minutes once on a fresh machine, then nothing). As root.
e2e-runtimes: deps
	@test/e2e/install-runtimes.sh
	$(GO) vet -tags e2e ./test/e2e/...
	@set -o pipefail; ctrd=$$(hack/containerd/build.sh) && \
	$(GO) test $(E2E_FLAGS) -timeout 15m -run '^TestRuntime' ./test/e2e/ -args -containerd.bins="$$ctrd" | grep -v -e '^=== '

# A simulated three-node dual-stack cluster: the pod/node/external/hostPort/service traffic
# matrix, MTU, and zero residue on every node after the pods are deleted.
e2e-cluster: deps
	$(GO) vet -tags e2e ./test/e2e/...
	@set -o pipefail; $(GO) test $(E2E_FLAGS) -timeout 10m -run '^TestCluster$$' ./test/e2e/ | grep -v -e '^=== '

# The node agent (cmd/kubenet-agent) against a real kube-apiserver and etcd in a simulated
# three-node cluster (test/agent, build tag kubenet_e2e_agent, so `make test` leaves it out).
# The first run builds kube-apiserver and etcd from source into the cache e2e-kubernetes uses
# (hack/kubernetes/build.sh: minutes and about 2 GiB of memory); later runs reuse them. As root.
.PHONY: e2e-agent
e2e-agent: deps
	hack/kubernetes/build.sh kube-apiserver etcd >/dev/null
	$(GO) vet -tags kubenet_e2e_agent ./test/agent/
	$(GO) test -count=1 -tags kubenet_e2e_agent -timeout $(TEST_TIMEOUT) ./agent/... ./cmd/kubenet-agent/ ./test/agent/

# The agent at scale: 1000 Nodes (objects only, with a kubelet's status) in a real API server,
# one agent; reports its RSS, CPU and the time from a Node change to the route in the kernel
# (BenchmarkAgentScale in test/agent; docs/agent.md has the numbers). Then the VXLAN overlay:
# 1000 Nodes appearing at once, half of them reached through the overlay, until every route,
# forwarding and neighbour entry is in the kernel, and the agent's peak memory
# (BenchmarkAgentScaleOverlay); and pod-to-pod TCP throughput and request/response between two
# nodes, their agents routing directly and through the overlay in turn
# (BenchmarkAgentOverlayDatapath). Both write their tables into docs/agent.md. As root, about
# 5 minutes.
.PHONY: bench-agent
bench-agent: deps
	hack/kubernetes/build.sh kube-apiserver etcd >/dev/null
	$(GO) vet -tags kubenet_e2e_agent ./test/agent/
	$(GO) test -count=1 -tags kubenet_e2e_agent -run '^$$' -bench '^BenchmarkAgent(Scale|ScaleOverlay|OverlayDatapath)$$' -benchtime 1x \
	  -timeout 20m ./test/agent/ -args -agent.out ../../docs/agent.md

# kubenet in a real Kubernetes cluster (test/e2e/kube_*.go, docs/e2e.md): per kube-proxy mode a
# control plane and two nodes (containerd, kubelet, kube-proxy in jails inside network
# namespaces), kubenet installed with `kubectl apply -f deploy/kubenet.yaml`, the upstream
# sig-network e2e specs run by ginkgo, and kubenet's own checks (readiness, shaping, restarts, a
# reboot, residue). The first run builds Kubernetes from source into a cache outside the
# checkout (hack/kubernetes/build.sh: about 10 minutes on 2 cores, more when they are busy;
# docs/e2e.md); later runs reuse it. As root.
#   E2E_PROXY_MODES  kube-proxy modes, one cluster each (iptables,nftables)
#   E2E_STACK        ipv4 or dual (dual-stack, IPv4 primary)
#   E2E_TOPOLOGY     one-link (every host on one subnet), two-subnets (node2 behind a router
#                    that has no route to pod CIDRs: pods talk through kubenet's VXLAN overlay),
#                    or per kube-proxy mode, mode=topology,... (modes not named: one-link); the
#                    default: the nftables cluster on two subnets, the iptables one on one link
#   E2E_SPECS        a named spec set of test/e2e/kube_specs.go (network, sig-network, netpol, dual-stack)
#   E2E_FOCUS        a ginkgo focus regexp instead, e.g. E2E_FOCUS='\[sig-network\] Netpol'
#   E2E_PROCS        specs run at once, per cluster
#   E2E_PARALLEL     false: one cluster after the other instead of all at once
#   E2E_CHECKS       false: the specs only, without kubenet's own checks
#   E2E_AGENT_ARGS   flags appended to the agent's in deploy/kubenet.yaml (they override its own)
#   E2E_NETFILTER    kubenet's netfilter backend: paired (iptables in the cluster whose kube-proxy
#                    runs iptables, unless the specs need NetworkPolicy), nftables or iptables
#   E2E_CONTAINERD   the nodes' containerd per kube-proxy mode (mode=release,...; release 1.6 is
#                    Debian's, 2.2 is built by hack/containerd/build.sh; a mode not named runs
#                    1.6), or one release for every cluster, e.g. E2E_CONTAINERD=2.2
E2E_PROXY_MODES ?= iptables,nftables
E2E_STACK ?= ipv4
E2E_TOPOLOGY ?= nftables=two-subnets
E2E_SPECS ?= network
E2E_FOCUS ?=
E2E_PROCS ?= 4
E2E_PARALLEL ?= true
E2E_CHECKS ?= true
E2E_AGENT_ARGS ?=
E2E_NETFILTER ?= paired
E2E_CONTAINERD ?= iptables=1.6,nftables=2.2
KUBE_DEPS := containerd:containerd ctr:containerd containerd-shim-runc-v2:containerd runc:runc \
  busybox-static dash:dash curl:curl wget:wget nc.openbsd:netcat-openbsd nsenter:util-linux unshare:util-linux
.PHONY: e2e-kubernetes
e2e-kubernetes: deps
	@hack/ensure-deps.sh $(KUBE_DEPS)
	$(GO) vet -tags e2e ./test/e2e/...
	@set -o pipefail; dir=$$(hack/kubernetes/build.sh) && \
	ctrd=$$(case '$(E2E_CONTAINERD)' in *2.2*) hack/containerd/build.sh ;; esac) && \
	$(GO) test $(E2E_FLAGS) -timeout 150m -run '^TestKubernetes$$' ./test/e2e/ -args \
	  -kube.bins="$$dir" -kube.proxy-modes='$(E2E_PROXY_MODES)' -kube.dual-stack=$(if $(filter dual,$(E2E_STACK)),true,false) \
	  -kube.topology='$(E2E_TOPOLOGY)' \
	  -kube.specs='$(E2E_SPECS)' -kube.focus='$(E2E_FOCUS)' -kube.procs=$(E2E_PROCS) -kube.checks=$(E2E_CHECKS) \
	  -kube.parallel=$(E2E_PARALLEL) -kube.containerd='$(E2E_CONTAINERD)' -containerd.bins="$$ctrd" \
	  -kube.agent-args='$(E2E_AGENT_ARGS)' -kube.netfilter='$(E2E_NETFILTER)' | grep -v -e '^=== '

# cyclonus (github.com/mattfenwick/cyclonus, built by hack/cyclonus/build.sh), the community's
# NetworkPolicy test-case generator, against kubenet in the cluster of e2e-kubernetes with
# policies on nftables (TestCyclonus, docs/e2e.md): its default case set over TCP and UDP, every
# pod probed from every pod through its Service after each change. Over an hour on 2 cores, so a
# target of its own, not part of CI. As root.
#   CYCLONUS_PROXY_MODES  kube-proxy modes, one cluster each (nftables; iptables,nftables for both)
#   CYCLONUS_PROTOCOLS    the pods' server protocols (TCP,UDP; add SCTP where the kernel has it)
#   CYCLONUS_INCLUDE      run only the cases with one of these tags, e.g. conflict,peer-ipblock
#   CYCLONUS_EXCLUDE      leave out the cases with these tags (default: cyclonus's own exclusions)
#   CYCLONUS_ARGS         more flags of `cyclonus generate`; the default probe timeout is 2 s,
#                         as cyclonus's own CI runs it (its built-in 10 s triples the run)
#   CYCLONUS_RESULTS      directory for cyclonus's log and JUnit report (default: a new one in /tmp)
#   E2E_STACK, E2E_AGENT_ARGS, E2E_CONTAINERD as for e2e-kubernetes (containerd 2.2 is built
#                         by the test when a cluster needs it)
CYCLONUS_PROXY_MODES ?= nftables
CYCLONUS_PROTOCOLS ?= TCP,UDP
CYCLONUS_INCLUDE ?=
CYCLONUS_EXCLUDE ?=
CYCLONUS_ARGS ?= --job-timeout-seconds=2
CYCLONUS_RESULTS ?=
.PHONY: e2e-cyclonus
e2e-cyclonus: deps
	@hack/ensure-deps.sh $(KUBE_DEPS)
	$(GO) vet -tags e2e ./test/e2e/...
	@set -o pipefail; dir=$$(hack/kubernetes/build.sh) && cyclonus=$$(hack/cyclonus/build.sh) && \
	$(GO) test $(E2E_FLAGS) -timeout 6h -run '^TestCyclonus$$' ./test/e2e/ -args \
	  -kube.bins="$$dir" -kube.proxy-modes='$(CYCLONUS_PROXY_MODES)' -kube.dual-stack=$(if $(filter dual,$(E2E_STACK)),true,false) \
	  -kube.agent-args='$(E2E_AGENT_ARGS)' -kube.containerd='$(E2E_CONTAINERD)' -cyclonus.bin="$$cyclonus" -cyclonus.results='$(CYCLONUS_RESULTS)' \
	  -cyclonus.args='--server-protocol=$(CYCLONUS_PROTOCOLS) $(if $(CYCLONUS_INCLUDE),--include=$(CYCLONUS_INCLUDE)) $(if $(CYCLONUS_EXCLUDE),--exclude=$(CYCLONUS_EXCLUDE)) $(CYCLONUS_ARGS)' \
	  | grep -v -e '^=== '
