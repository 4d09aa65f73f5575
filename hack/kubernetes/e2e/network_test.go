// Package e2e is the Kubernetes e2e suite cut down to its network specs: the TestMain of
// upstream's test/e2e/e2e_test.go (flags, embedded manifests, the suite's setup through
// k8s.io/kubernetes/test/e2e) with only k8s.io/kubernetes/test/e2e/network linked in. The full
// suite does not build from the module proxy (test/e2e/apimachinery needs k8s.io/sample-apiserver,
// which it does not serve), and kubenet's cluster runs only network specs anyway.
// hack/kubernetes/build.sh compiles it with `go test -c` into e2e-network.test.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	conformancetestdata "k8s.io/kubernetes/test/conformance/testdata"
	e2esuite "k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// Freezes the feature names before the specs use them, as upstream's suite does.
	_ "k8s.io/kubernetes/test/e2e/feature"

	// The specs: sig-network only.
	_ "k8s.io/kubernetes/test/e2e/network"

	// The framework's pluggable parts, as upstream's suite configures them.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	showVersion := flag.Bool("version", false, "Displays version information.")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown additional command line arguments: %s\n", flag.Args())
		os.Exit(1)
	}
	// The manifests and fixtures some specs read are embedded in the binary.
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	testfiles.AddFileSource(conformancetestdata.GetConformanceTestdataFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// TestE2E runs the specs through ginkgo, with the suite's setup and reporting from upstream.
func TestE2E(t *testing.T) { e2esuite.RunE2ETests(t) }
