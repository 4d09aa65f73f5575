package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
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

// apiPort is the API server's port on the control plane's underlay address.
const apiPort = 6443

// identity is a user of the API server, authenticated by a static bearer token: the admin,
// each kubelet (system:node:<name> in system:nodes, which the Node authorizer requires),
// kube-proxy, kube-controller-manager and kube-scheduler, each with the name the API server's
// bootstrap RBAC policy binds its role to.
type identity struct {
	user   string
	groups []string
	token  string
}

// ControlPlane is etcd, kube-apiserver, kube-controller-manager and kube-scheduler, each a
// process in the control plane's network namespace, reachable on the underlay. The e2e suite
// and kubectl run in the same namespace.
type ControlPlane struct {
	NS   ns.NetNS
	Addr netip.Addr // the API server's address on the underlay
	Dir  string     // certificates, kubeconfigs, logs
	URL  string
	// AdminKubeconfig is a kubeconfig of system:masters, for kubectl and the e2e suite.
	AdminKubeconfig string
	// Admin is a client of system:masters that dials inside the control plane's namespace.
	Admin kubernetes.Interface
	caPEM []byte
	users map[string]identity
	procs []*nettest.Process
}

// controlPlaneConfig is what the components need to know of the cluster.
type controlPlaneConfig struct {
	bins         KubeBins
	addrs        []netip.Prefix // underlay addresses; the first is the API server's
	serviceCIDRs []netip.Prefix
	clusterCIDRs []netip.Prefix
	nodeNames    []string // each gets a kubelet identity
}

// startControlPlane starts the control plane in n and waits until the API server is ready and
// kube-system exists. Every process is stopped by pid at cleanup.
func startControlPlane(t *testing.T, n ns.NetNS, dir string, cfg controlPlaneConfig) *ControlPlane {
	t.Helper()
	addr := cfg.addrs[0].Addr()
	cp := &ControlPlane{NS: n, Addr: addr, Dir: dir, URL: "https://" + net.JoinHostPort(addr.String(), fmt.Sprint(apiPort)), users: map[string]identity{}}
	var sans []netip.Addr
	for _, a := range cfg.addrs {
		sans = append(sans, a.Addr())
	}
	for _, c := range cfg.serviceCIDRs {
		// The `kubernetes` Service's address, which in-cluster clients (the agent) dial.
		sans = append(sans, c.Masked().Addr().Next())
	}
	var err error
	if cp.caPEM, err = writeClusterCerts(dir, sans); err != nil {
		t.Fatal(err)
	}
	for _, id := range []identity{
		{user: "admin", groups: []string{"system:masters"}},
		{user: "system:kube-proxy"},
		{user: "system:kube-controller-manager"},
		{user: "system:kube-scheduler"},
	} {
		cp.addUser(id)
	}
	for _, node := range cfg.nodeNames {
		cp.addUser(identity{user: "system:node:" + node, groups: []string{"system:nodes"}})
	}
	if err := cp.writeTokens(); err != nil {
		t.Fatal(err)
	}
	cp.AdminKubeconfig = cp.writeKubeconfig(t, "admin")

	cidrs := func(ps []netip.Prefix) string {
		var s []string
		for _, p := range ps {
			s = append(s, p.String())
		}
		return strings.Join(s, ",")
	}
	start := func(name string, args ...string) *nettest.Process {
		p := nettest.StartProcess(t, n, filepath.Join(dir, name+".log"), cfg.bins.Path(name), args...)
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
	cert := func(name string) string { return filepath.Join(dir, name) }
	start("kube-apiserver",
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address="+addr.String(),
		"--advertise-address="+addr.String(),
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--cert-dir="+dir,
		"--tls-cert-file="+cert("apiserver.crt"),
		"--tls-private-key-file="+cert("apiserver.key"),
		"--client-ca-file="+cert("ca.crt"),
		"--kubelet-client-certificate="+cert("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+cert("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--token-auth-file="+cert("tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true", // as kubeadm sets it: the agent's DaemonSet is privileged
		"--anonymous-auth=false",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+cert("sa.pub"),
		"--service-account-signing-key-file="+cert("sa.key"),
		"--service-cluster-ip-range="+cidrs(cfg.serviceCIDRs),
		"--profiling=false",
	)
	cp.Admin = cp.client(t, "admin")
	err = nettest.WhileRunning(2*time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := cp.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}, cp.procs...)
	if err != nil {
		t.Fatalf("kube-apiserver not ready: %v", err)
	}

	// Node IPAM: each Node gets a pod CIDR per family (a /24 of IPv4, a /64 of IPv6), the CIDRs
	// kubenet's agent writes into the conflist. The mask of a family the cluster does not have
	// is refused.
	var masks []string
	for _, c := range cfg.clusterCIDRs {
		if c.Addr().Is4() {
			masks = append(masks, "--node-cidr-mask-size-ipv4=24")
		} else {
			masks = append(masks, "--node-cidr-mask-size-ipv6=64")
		}
	}
	start("kube-controller-manager", append(masks,
		"--kubeconfig="+cp.writeKubeconfig(t, "system:kube-controller-manager"),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+cert("sa.key"),
		"--root-ca-file="+cert("ca.crt"),
		"--allocate-node-cidrs=true",
		"--cluster-cidr="+cidrs(cfg.clusterCIDRs),
		"--service-cluster-ip-range="+cidrs(cfg.serviceCIDRs),
		"--configure-cloud-routes=false", // no cloud: the agent makes the routes
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--profiling=false",
	)...)
	scheduler := start("kube-scheduler",
		"--kubeconfig="+cp.writeKubeconfig(t, "system:kube-scheduler"),
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
	err = nettest.WhileRunning(time.Minute, func() error {
		_, err := cp.Admin.CoreV1().Namespaces().Get(context.Background(), "kube-system", metav1.GetOptions{})
		return err
	}, cp.procs...)
	if err != nil {
		t.Fatalf("kube-system namespace: %v", err)
	}
	return cp
}

// addUser gives id a random token. The API server reads its token file once: add every user
// before writeTokens.
func (cp *ControlPlane) addUser(id identity) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id.token = fmt.Sprintf("%x", b)
	cp.users[id.user] = id
}

// writeTokens writes the API server's static token file.
func (cp *ControlPlane) writeTokens() error {
	var lines []string
	for _, id := range cp.users {
		lines = append(lines, fmt.Sprintf("%s,%s,%s,%q", id.token, id.user, id.user, strings.Join(id.groups, ",")))
	}
	return os.WriteFile(filepath.Join(cp.Dir, "tokens.csv"), []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// kubeconfigPath is where writeKubeconfig puts the kubeconfig of user.
func (cp *ControlPlane) kubeconfigPath(user string) string {
	return filepath.Join(cp.Dir, strings.ReplaceAll(user, ":", "-")+".kubeconfig")
}

// writeKubeconfig writes a kubeconfig of user, as an operator hands one to a component.
func (cp *ControlPlane) writeKubeconfig(t testing.TB, user string) string {
	t.Helper()
	id, ok := cp.users[user]
	if !ok {
		t.Fatalf("no user %s", user)
	}
	c := clientcmdapi.NewConfig()
	c.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.caPEM}
	c.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: id.token}
	c.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	c.CurrentContext = "e2e"
	file := cp.kubeconfigPath(user)
	if err := clientcmd.WriteToFile(*c, file); err != nil {
		t.Fatal(err)
	}
	return file
}

// client is a client of user that dials inside the control plane's namespace.
func (cp *ControlPlane) client(t testing.TB, user string) kubernetes.Interface {
	t.Helper()
	cfg := &rest.Config{Host: cp.URL, BearerToken: cp.users[user].token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM}}
	cfg.Dial = nettest.DialIn(cp.NS)
	cfg.QPS, cfg.Burst = 100, 200
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writeClusterCerts makes in dir: a CA (ca.crt, ca.key), the API server's serving certificate
// for sans (apiserver.crt/.key), its client certificate towards kubelets
// (apiserver-kubelet-client.crt/.key, in system:masters so kubelets' webhook authorization
// admits it), and the service-account signing key pair (sa.key, sa.pub). It returns the CA
// certificate (PEM).
func writeClusterCerts(dir string, sans []netip.Addr) ([]byte, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubenet-e2e-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	files := map[string][]byte{"ca.crt": caPEM}
	keyPEM := func(k *ecdsa.PrivateKey) ([]byte, error) {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
	}
	if files["ca.key"], err = keyPEM(caKey); err != nil {
		return nil, err
	}
	issue := func(name string, tmpl *x509.Certificate) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		var serial [8]byte
		_, _ = rand.Read(serial[:])
		tmpl.SerialNumber = new(big.Int).SetBytes(serial[:])
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(7*24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		files[name+".crt"] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		files[name+".key"], err = keyPEM(key)
		return err
	}
	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}
	for _, a := range sans {
		serving.IPAddresses = append(serving.IPAddresses, a.AsSlice())
	}
	if err := issue("apiserver", serving); err != nil {
		return nil, err
	}
	kubeletClient := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := issue("apiserver-kubelet-client", kubeletClient); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if files["sa.key"], err = keyPEM(saKey); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	files["sa.pub"] = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	return caPEM, nil
}
