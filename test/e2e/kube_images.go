package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// The images the cluster runs, by the exact names the Kubernetes release's e2e framework and
// kubelet use (test/utils/image/manifest.go; kubelet's default pause image), so that kubelet
// finds each present and never pulls: no registry is reachable. WriteKubeImages checks the e2e
// images against the list the e2e binary prints, so a version bump that renames one fails there.
const (
	KubePauseImage = "registry.k8s.io/pause:3.10.1"
	AgnhostImage   = "registry.k8s.io/e2e-test-images/agnhost:2.56"
	// CyclonusAgnhostImage is the agnhost cyclonus v0.5.6 runs its servers and probes in (its
	// pkg/connectivity/probe/pod.go; the tag is fixed there, only the registry is a flag). The
	// agnhost image above carries this name too: cyclonus runs only `agnhost serve-hostname` and
	// `agnhost connect`, whose flags 2.56 keeps.
	CyclonusAgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.43"
	KubeBusyboxImage     = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
	// CoreDNSImage's tag is COREDNS of hack/kubernetes/versions.env.
	coreDNSRepo = "registry.k8s.io/coredns/coredns"
	// AgentImage is the name the test gives the kubenet-agent image it builds and writes into
	// deploy/kubenet.yaml, as a user sets the image they pushed.
	AgentImage = "localhost/kubenet-agent:e2e"
)

// agnhostPath is the PATH of the agnhost image (Alpine's).
const agnhostPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// pauseScript is the pause image's /pause: it holds the pod's namespaces and ends on SIGTERM.
const pauseScript = "#!/bin/sh\ntrap 'exit 0' TERM INT\nwhile :; do sleep 3600 & wait $!; done\n"

// WriteKubeImages writes a docker-archive of every image the cluster runs:
//
//   - pause: busybox-static's shell running /pause;
//   - busybox: busybox-static's applets, `sh` by default, as upstream's;
//   - agnhost: the agnhost binary of the release (also named as cyclonus names it) with what its
//     specs run in it besides:
//     busybox applets, curl, OpenBSD netcat (`nc -u`, which the HostPort spec uses) and GNU wget
//     (Debian busybox's `wget -T` crashes), each with its shared libraries; /bin/sh is dash, not
//     busybox ash, whose built-in nc would shadow the real one; the porter's TLS pair;
//   - CoreDNS at COREDNS of versions.env;
//   - kubenet-agent, built by BuildDockerfile from cmd/kubenet-agent/Dockerfile in repo, the
//     recipe users build.
func WriteKubeImages(ctx context.Context, file string, bins KubeBins, repo, work string) error {
	coreDNS := coreDNSRepo + ":" + bins.Versions["COREDNS"]
	if err := checkImageNames(ctx, bins, KubePauseImage, AgnhostImage, KubeBusyboxImage); err != nil {
		return err
	}
	busybox, err := BusyboxLayer("/bin/busybox")
	if err != nil {
		return err
	}
	pause, err := BusyboxLayer("/bin/busybox")
	if err != nil {
		return err
	}
	pause.File("pause", []byte(pauseScript), 0o755)

	agnhost, err := BusyboxLayer("/bin/busybox", "sh", "nc", "wget")
	if err != nil {
		return err
	}
	for _, p := range []struct{ src, dst string }{
		{"/bin/dash", "bin/sh"},
		{"/usr/bin/curl", "usr/bin/curl"},
		{"/usr/bin/nc.openbsd", "usr/bin/nc"},
		{"/usr/bin/wget", "usr/bin/wget"},
	} {
		if err := agnhost.CopyProgram(p.src, p.dst); err != nil {
			return fmt.Errorf("agnhost image: %w (hack/ensure-deps.sh installs dash, curl, netcat-openbsd and wget)", err)
		}
	}
	for _, f := range []struct{ src, dst string }{
		{bins.Path("agnhost"), "agnhost"},
		{bins.Path("localhost.crt"), "localhost.crt"},
		{bins.Path("localhost.key"), "localhost.key"},
	} {
		if err := agnhost.CopyFile(f.src, f.dst); err != nil {
			return fmt.Errorf("agnhost image: %w", err)
		}
	}
	agnhost.Symlink("agnhost-2", "agnhost")
	agnhost.Dir("uploads", 0o755)
	agnhost.File("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"), 0o644)
	agnhost.File("etc/group", []byte("root:x:0:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"), 0o644)
	agnhost.File("etc/nsswitch.conf", []byte("hosts: files dns\n"), 0o644)

	coredns := NewLayer()
	if err := coredns.CopyFile(bins.Path("coredns"), "coredns"); err != nil {
		return fmt.Errorf("coredns image: %w", err)
	}
	coredns.Dir("tmp", 0o1777)

	out := filepath.Join(work, "agent-image")
	agent, err := BuildDockerfile(ctx, filepath.Join(repo, "cmd/kubenet-agent/Dockerfile"), repo, AgentImage,
		map[string]string{"OUT": out, "VERSION": "e2e"})
	if err != nil {
		return fmt.Errorf("kubenet-agent image: %w", err)
	}
	return WriteArchive(file,
		Image{Ref: KubePauseImage, Entrypoint: []string{"/pause"}, Layers: []*Layer{pause}},
		Image{Ref: KubeBusyboxImage, Cmd: []string{"sh"}, Layers: []*Layer{busybox}},
		Image{Ref: AgnhostImage, Aliases: []string{CyclonusAgnhostImage}, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: []string{agnhostPath}, Layers: []*Layer{agnhost}},
		Image{Ref: coreDNS, Entrypoint: []string{"/coredns"}, Layers: []*Layer{coredns}},
		agent,
	)
}

// checkImageNames fails unless the e2e binary names every one of refs among its images.
func checkImageNames(ctx context.Context, bins KubeBins, refs ...string) error {
	out, err := exec.CommandContext(ctx, bins.Path("e2e-network.test"), "--list-images").Output()
	if err != nil {
		return fmt.Errorf("e2e-network.test --list-images: %w", err)
	}
	known := strings.Fields(string(out))
	for _, ref := range refs {
		if !slices.Contains(known, ref) {
			return fmt.Errorf("the e2e framework of this release names no image %s (test/e2e/kube_images.go must follow the release's names)", ref)
		}
	}
	return nil
}

// KubeBins is the directory hack/kubernetes/build.sh built the binaries into, and the versions
// it built (hack/kubernetes/versions.env).
type KubeBins struct {
	Dir      string
	Versions map[string]string
}

// Path is the file of binary name.
func (b KubeBins) Path(name string) string { return filepath.Join(b.Dir, name) }

// LoadKubeBins reads versions.env of the checkout at repo and checks that dir holds every
// binary the cluster runs.
func LoadKubeBins(repo, dir string) (KubeBins, error) {
	b := KubeBins{Dir: dir, Versions: map[string]string{}}
	env, err := os.ReadFile(filepath.Join(repo, "hack/kubernetes/versions.env"))
	if err != nil {
		return b, err
	}
	for _, line := range strings.Split(string(env), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(k, "#") {
			b.Versions[k] = v
		}
	}
	for _, name := range []string{"kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kubelet",
		"kube-proxy", "kubectl", "agnhost", "coredns", "ginkgo", "e2e-network.test", "localhost.crt", "localhost.key"} {
		if _, err := os.Stat(b.Path(name)); err != nil {
			return b, fmt.Errorf("%w (hack/kubernetes/build.sh builds it)", err)
		}
	}
	return b, nil
}
