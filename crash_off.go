//go:build !kubenet_crashtest

package kubenet

// crashPoint is a no-op in real builds; see crash_on.go.
func crashPoint(string) {}
