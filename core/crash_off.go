//go:build !kubenet_crashtest

package core

// crashPoint is a no-op in real builds; see crash_on.go.
func crashPoint(string) {}
