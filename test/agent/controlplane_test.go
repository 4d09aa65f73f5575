//go:build kubenet_e2e_agent

package agent

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

// token is one line of the API server's static token file.
type token struct {
	value, user string
	groups      []string
}

// controlPlane is etcd and kube-apiserver running inside a namespace of their own, reachable
// only on the underlay. Nothing else of a control plane runs: no controller-manager, so the test
// sets pod CIDRs itself, and no scheduler or kubelet.
type controlPlane struct {
	ns    ns.NetNS
	url   string
	caPEM []byte
	admin kubernetes.Interface
}

// startControlPlane starts etcd and the API server in a new namespace attached to u with addr,
// waits until /readyz answers, and returns an admin client (system:masters) that dials inside
// that namespace. Both processes are stopped by pid at cleanup.
func startControlPlane(t testing.TB, u *nettest.Underlay, addr netip.Prefix, tokens []token) *controlPlane {
	t.Helper()
	dir := t.TempDir()
	cp := &controlPlane{ns: nettest.NewNS(t), url: fmt.Sprintf("https://%s", net.JoinHostPort(addr.Addr().String(), fmt.Sprint(apiPort)))}
	u.Attach(t, cp.ns, "eth0", addr)

	var err error
	cp.caPEM, err = writeCerts(dir, addr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, tok := range tokens {
		lines = append(lines, fmt.Sprintf("%s,%s,%s,%q", tok.value, tok.user, tok.user, strings.Join(tok.groups, ",")))
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	etcd := nettest.StartProcess(t, cp.ns, filepath.Join(dir, "etcd.log"), testBins.etcd,
		"--name=cp",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379",
		"--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380",
		"--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=cp=http://127.0.0.1:2380",
		"--unsafe-no-fsync", // a test's data need not survive a power cut
		"--log-level=warn",
	)
	api := nettest.StartProcess(t, cp.ns, filepath.Join(dir, "kube-apiserver.log"), testBins.apiserver,
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address="+addr.Addr().String(),
		"--advertise-address="+addr.Addr().String(),
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--cert-dir="+dir,
		"--tls-cert-file="+filepath.Join(dir, "apiserver.crt"),
		"--tls-private-key-file="+filepath.Join(dir, "apiserver.key"),
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--allow-privileged=true", // as kubeadm sets it: the DaemonSet is privileged
		"--anonymous-auth=false",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range="+serviceCIDR.String(),
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	)

	cfg := cp.restConfig(tokens[0].value)
	cfg.Dial = nettest.DialIn(cp.ns)
	// The test is the only client: no need for client-go's default 5 requests per second.
	cfg.QPS, cfg.Burst = 200, 400
	if cp.admin, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	err = nettest.WhileRunning(90*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := cp.admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}, etcd, api)
	if err != nil {
		t.Fatalf("kube-apiserver not ready: %v", err)
	}
	// The kube-system namespace is made by the API server itself shortly after /readyz.
	err = nettest.Eventually(30*time.Second, func() error {
		_, err := cp.admin.CoreV1().Namespaces().Get(context.Background(), "kube-system", metav1.GetOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("kube-system namespace: %v", err)
	}
	return cp
}

// startCluster starts a control plane on a new underlay, creates the objects of
// deploy/kubenet.yaml through it, and returns the token the agents authenticate with: the
// manifest's ServiceAccount, so they run with exactly the manifest's RBAC.
func startCluster(t testing.TB) (*nettest.Underlay, *controlPlane, string) {
	t.Helper()
	objs := manifestObjects(t)
	agentTok := serviceAccountUser(t, objs)
	adminTok := token{value: "admin-token", user: "admin", groups: []string{"system:masters"}}
	u := nettest.NewUnderlay(t, 0)
	cp := startControlPlane(t, u, controlPlaneAddr, []token{adminTok, agentTok})
	applyManifest(t, cp.admin, objs)
	return u, cp, agentTok.value
}

func (cp *controlPlane) restConfig(bearer string) *rest.Config {
	return &rest.Config{Host: cp.url, BearerToken: bearer, TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM}}
}

// writeKubeconfig writes a kubeconfig for bearer, as an operator would hand it to the agent.
func (cp *controlPlane) writeKubeconfig(file, bearer string) error {
	c := clientcmdapi.NewConfig()
	c.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.url, CertificateAuthorityData: cp.caPEM}
	c.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: bearer}
	c.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "agent"}
	c.CurrentContext = "test"
	return clientcmd.WriteToFile(*c, file)
}

// writeCerts makes a CA, the API server's serving certificate for addr and a service-account
// signing key pair in dir, and returns the CA certificate (PEM).
func writeCerts(dir string, addr netip.Addr) ([]byte, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubenet-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{addr.AsSlice(), net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)},
		DNSNames:     []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	files := map[string][]byte{
		"ca.crt":        caPEM,
		"apiserver.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
	}
	for name, key := range map[string]*ecdsa.PrivateKey{"apiserver.key": srvKey, "sa.key": saKey} {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		files[name] = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
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
