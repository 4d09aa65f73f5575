// Package e2e holds kubenet's end-to-end runs against real container runtimes and against a
// simulated multi-node cluster, and the helpers they need: a jail (private mount and PID
// namespace inside a node's network namespace) for each runtime daemon, locally built images,
// private runtime configurations, and a residue audit.
//
// The tests carry the build tag e2e, so `go test ./...` compiles the helpers but does not run
// them: `make e2e-runtimes` installs containerd, runc and podman when missing and runs
// TestRuntime*, `make e2e-cluster` runs TestCluster. See docs/e2e.md.
package e2e
