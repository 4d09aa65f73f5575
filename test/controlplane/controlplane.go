// Package controlplane starts a Kubernetes control plane for tests: etcd and kube-apiserver
// (and, for a cluster whose kubelets run pods, kube-controller-manager and kube-scheduler), each
// a process inside a network namespace the test made, reachable on that namespace's underlay
// addresses only. test/agent runs its agents against it, test/e2e its kubelets, kube-proxies and
// the upstream e2e suite. The binaries come from hack/kubernetes/build.sh's cache (Build).
package controlplane

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// APIPort is the API server's port on the control plane's underlay address.
const APIPort = 6443

// AdminUser is the user of Admin and AdminKubeconfig, in system:masters; every control plane
// has it.
const AdminUser = "admin"

// User is a user of the API server, authenticated by a static bearer token. The names the API
// server's bootstrap RBAC policy binds its roles to (system:kube-proxy, system:node:<name> in
// system:nodes, a ServiceAccount's system:serviceaccount:<ns>:<name>) get those roles.
type User struct {
	Name   string
	Groups []string
}

// Config is what the control plane needs to know of the test's cluster.
type Config struct {
	// Bins is the directory of the binaries (Build's): etcd and kube-apiserver, and with
	// ClusterCIDRs kube-controller-manager and kube-scheduler.
	Bins string
	// Dir receives the certificates, the token file, kubeconfigs, logs and etcd's data.
	Dir string
	// Addrs are the namespace's underlay addresses: the API server listens on the first, its
	// certificate names all of them.
	Addrs []netip.Prefix
	// ServiceCIDRs is --service-cluster-ip-range; the first address of each (the `kubernetes`
	// Service, which in-cluster clients dial) is in the API server's certificate.
	ServiceCIDRs []netip.Prefix
	// ClusterCIDRs, when set, also start kube-controller-manager, which gives each Node a pod
	// CIDR per family from them (a /24 of IPv4, a /64 of IPv6), and kube-scheduler: the control
	// plane of a cluster whose kubelets run pods. Without them etcd and the API server are the
	// whole control plane and the test sets pod CIDRs itself.
	ClusterCIDRs []netip.Prefix
	// Users get a token each, besides AdminUser. The API server reads its token file once, at
	// start: every user the test will need is named here.
	Users []User
	// Nodes each get a kubelet's user, system:node:<name> in system:nodes, which the Node
	// authorizer and NodeRestriction admission require.
	Nodes []string
	// APIServerArgs are appended to kube-apiserver's flags; for a flag given twice the last wins.
	APIServerArgs []string
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	NS   ns.NetNS
	Addr netip.Addr // the API server's address on the underlay
	Dir  string     // Config.Dir
	URL  string
	// AdminKubeconfig is a kubeconfig of AdminUser, for kubectl and the e2e suite.
	AdminKubeconfig string
	// Admin is a client of AdminUser that dials inside the control plane's namespace.
	Admin kubernetes.Interface
	caPEM []byte
	users map[string]string // user name -> token
	procs []*nettest.Process
}

// Start starts the control plane of cfg in n and waits until the API server is ready and
// kube-system exists, failing t when that takes more than a few minutes or a component exits.
// Every process is stopped by pid at t's cleanup.
func Start(t testing.TB, n ns.NetNS, cfg Config) *ControlPlane {
	t.Helper()
	if len(cfg.Addrs) == 0 || len(cfg.ServiceCIDRs) == 0 {
		t.Fatalf("controlplane.Start: Addrs (%v) and ServiceCIDRs (%v) must not be empty", cfg.Addrs, cfg.ServiceCIDRs)
	}
	dir := cfg.Dir
	addr := cfg.Addrs[0].Addr()
	cp := &ControlPlane{NS: n, Addr: addr, Dir: dir, URL: "https://" + net.JoinHostPort(addr.String(), fmt.Sprint(APIPort)),
		users: map[string]string{}}
	var sans []netip.Addr
	for _, a := range cfg.Addrs {
		sans = append(sans, a.Addr())
	}
	for _, c := range cfg.ServiceCIDRs {
		sans = append(sans, c.Masked().Addr().Next())
	}
	var err error
	if cp.caPEM, err = writeCerts(dir, sans); err != nil {
		t.Fatal(err)
	}
	users := append([]User{{Name: AdminUser, Groups: []string{"system:masters"}}}, cfg.Users...)
	if len(cfg.ClusterCIDRs) > 0 {
		users = append(users, User{Name: "system:kube-controller-manager"}, User{Name: "system:kube-scheduler"})
	}
	for _, node := range cfg.Nodes {
		users = append(users, User{Name: "system:node:" + node, Groups: []string{"system:nodes"}})
	}
	if err := cp.writeTokens(users); err != nil {
		t.Fatal(err)
	}
	cp.AdminKubeconfig = cp.Kubeconfig(t, AdminUser)

	start := func(name string, args ...string) *nettest.Process {
		p := nettest.StartProcess(t, n, filepath.Join(dir, name+".log"), filepath.Join(cfg.Bins, name), args...)
		cp.procs = append(cp.procs, p)
		return p
	}
	start("etcd",
		"--name=cp",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379",
		"--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380",
		"--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=cp=http://127.0.0.1:2380",
		"--listen-metrics-urls=http://127.0.0.1:2381",
		"--unsafe-no-fsync", // a test cluster's data need not survive a power cut
		"--log-level=warn",
	)
	file := func(name string) string { return filepath.Join(dir, name) }
	start("kube-apiserver", append([]string{
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=" + addr.String(),
		"--advertise-address=" + addr.String(),
		fmt.Sprintf("--secure-port=%d", APIPort),
		"--cert-dir=" + dir,
		"--tls-cert-file=" + file("apiserver.crt"),
		"--tls-private-key-file=" + file("apiserver.key"),
		"--client-ca-file=" + file("ca.crt"),
		"--kubelet-client-certificate=" + file("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + file("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--token-auth-file=" + file("tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true", // as kubeadm sets it: the agent's DaemonSet is privileged
		"--anonymous-auth=false",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + file("sa.pub"),
		"--service-account-signing-key-file=" + file("sa.key"),
		"--service-cluster-ip-range=" + nettest.JoinPrefixes(cfg.ServiceCIDRs),
		"--profiling=false",
	}, cfg.APIServerArgs...)...)
	cp.Admin = cp.Client(t, AdminUser)
	err = nettest.WhileRunning(2*time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := cp.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}, cp.procs...)
	if err != nil {
		t.Fatalf("kube-apiserver not ready: %v", err)
	}
	if len(cfg.ClusterCIDRs) > 0 {
		cp.startControllers(t, cfg, start)
	}
	// The kube-system namespace is made by the API server itself shortly after /readyz.
	err = nettest.WhileRunning(time.Minute, func() error {
		_, err := cp.Admin.CoreV1().Namespaces().Get(context.Background(), "kube-system", metav1.GetOptions{})
		return err
	}, cp.procs...)
	if err != nil {
		t.Fatalf("kube-system namespace: %v", err)
	}
	return cp
}

// startControllers starts kube-controller-manager, with node IPAM from cfg.ClusterCIDRs, and
// kube-scheduler.
func (cp *ControlPlane) startControllers(t testing.TB, cfg Config, start func(name string, args ...string) *nettest.Process) {
	t.Helper()
	// The mask of a family the cluster does not have is refused.
	var masks []string
	for _, c := range cfg.ClusterCIDRs {
		if c.Addr().Is4() {
			masks = append(masks, "--node-cidr-mask-size-ipv4=24")
		} else {
			masks = append(masks, "--node-cidr-mask-size-ipv6=64")
		}
	}
	start("kube-controller-manager", append(masks,
		"--kubeconfig="+cp.Kubeconfig(t, "system:kube-controller-manager"),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+filepath.Join(cp.Dir, "sa.key"),
		"--root-ca-file="+filepath.Join(cp.Dir, "ca.crt"),
		"--allocate-node-cidrs=true",
		"--cluster-cidr="+nettest.JoinPrefixes(cfg.ClusterCIDRs),
		"--service-cluster-ip-range="+nettest.JoinPrefixes(cfg.ServiceCIDRs),
		"--configure-cloud-routes=false", // no cloud: the agent makes the routes
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--profiling=false",
	)...)
	scheduler := start("kube-scheduler",
		"--kubeconfig="+cp.Kubeconfig(t, "system:kube-scheduler"),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--profiling=false",
	)
	// Without leader election kube-scheduler ends every run, SIGTERM included, with exit status
	// 1 and "finished without leader elect": that is its clean stop. Stopped here, before the
	// generic stop (which would call it a failure), and judged by its log.
	t.Cleanup(func() {
		if err := scheduler.Stop(); err != nil {
			if b, _ := os.ReadFile(scheduler.Log); !strings.Contains(string(b), "finished without leader elect") {
				t.Errorf("stop kube-scheduler: %v", err)
			}
		}
	})
}

// Processes are the control plane's processes, for a test that watches them exit.
func (cp *ControlPlane) Processes() []*nettest.Process { return slices.Clone(cp.procs) }

// writeTokens gives every user a random token and writes the API server's static token file.
func (cp *ControlPlane) writeTokens(users []User) error {
	var lines []string
	for _, u := range users {
		if _, dup := cp.users[u.Name]; dup {
			return fmt.Errorf("user %q named twice", u.Name)
		}
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		token := fmt.Sprintf("%x", b)
		cp.users[u.Name] = token
		lines = append(lines, fmt.Sprintf("%s,%s,%s,%q", token, u.Name, u.Name, strings.Join(u.Groups, ",")))
	}
	return os.WriteFile(filepath.Join(cp.Dir, "tokens.csv"), []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// token is user's bearer token.
func (cp *ControlPlane) token(user string) (string, error) {
	tok, ok := cp.users[user]
	if !ok {
		return "", fmt.Errorf("the control plane has no user %q (name it in Config.Users)", user)
	}
	return tok, nil
}

// RESTConfig is a client configuration of user that dials inside the control plane's namespace.
func (cp *ControlPlane) RESTConfig(t testing.TB, user string) *rest.Config {
	t.Helper()
	tok, err := cp.token(user)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: cp.URL, BearerToken: tok, TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM}}
	cfg.Dial = nettest.DialIn(cp.NS)
	// The test is the API server's main client: no need for client-go's default 5 requests per
	// second.
	cfg.QPS, cfg.Burst = 200, 400
	return cfg
}

// Client is a client of user that dials inside the control plane's namespace.
func (cp *ControlPlane) Client(t testing.TB, user string) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cp.RESTConfig(t, user))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteKubeconfig writes a kubeconfig of user into file, as an operator hands one to a component.
func (cp *ControlPlane) WriteKubeconfig(file, user string) error {
	tok, err := cp.token(user)
	if err != nil {
		return err
	}
	c := clientcmdapi.NewConfig()
	c.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.caPEM}
	c.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: tok}
	c.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	c.CurrentContext = "test"
	return clientcmd.WriteToFile(*c, file)
}

// KubeconfigPath is where Kubeconfig puts the kubeconfig of user.
func (cp *ControlPlane) KubeconfigPath(user string) string {
	return filepath.Join(cp.Dir, strings.ReplaceAll(user, ":", "-")+".kubeconfig")
}

// Kubeconfig writes the kubeconfig of user to KubeconfigPath(user) and returns that path.
func (cp *ControlPlane) Kubeconfig(t testing.TB, user string) string {
	t.Helper()
	file := cp.KubeconfigPath(user)
	if err := cp.WriteKubeconfig(file, user); err != nil {
		t.Fatal(err)
	}
	return file
}

// Build runs hack/kubernetes/build.sh of the checkout at repo for the binaries names (all of
// them when none) and returns the directory it built them into: a cache outside the checkout,
// shared by every run, so seconds when warm.
func Build(repo string, names ...string) (string, error) {
	out, err := exec.Command(filepath.Join(repo, "hack", "kubernetes", "build.sh"), names...).Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		return "", fmt.Errorf("hack/kubernetes/build.sh %s: %w\n%s", strings.Join(names, " "), err, stderr)
	}
	return strings.TrimSpace(string(out)), nil
}
