package controlplane

import (
	"crypto/x509"
	"encoding/csv"
	"encoding/pem"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// TestCertsServeEveryName checks the serving certificate against the CA for every name a
// client of the test clusters dials: the underlay addresses, loopback, the `kubernetes`
// Service's address and its DNS names; and that no other address passes.
func TestCertsServeEveryName(t *testing.T) {
	dir := t.TempDir()
	sans := []netip.Addr{netip.MustParseAddr("192.168.77.10"), netip.MustParseAddr("fd00:77::10"), netip.MustParseAddr("10.96.0.1")}
	caPEM, err := writeCerts(dir, sans)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("the CA PEM holds no certificate")
	}
	serving := readCert(t, filepath.Join(dir, "apiserver.crt"))
	cases := []struct {
		name string
		ok   bool
	}{
		{"192.168.77.10", true},
		{"fd00:77::10", true},
		{"10.96.0.1", true},
		{"127.0.0.1", true},
		{"kubernetes.default.svc", true},
		{"kubernetes.default.svc.cluster.local", true},
		{"192.168.77.11", false},
		{"example.com", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := serving.Verify(x509.VerifyOptions{DNSName: tc.name, Roots: roots})
			if (err == nil) != tc.ok {
				t.Errorf("verify for %s: %v, want ok=%v", tc.name, err, tc.ok)
			}
		})
	}
	// The API server's client certificate towards kubelets is a client certificate of the CA
	// in system:masters, which kubelets' webhook authorization admits.
	client := readCert(t, filepath.Join(dir, "apiserver-kubelet-client.crt"))
	if _, err := client.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("kubelet client certificate: %v", err)
	}
	if !slices.Equal(client.Subject.Organization, []string{"system:masters"}) {
		t.Errorf("kubelet client certificate organization %v, want [system:masters]", client.Subject.Organization)
	}
	for _, f := range []string{"ca.key", "apiserver.key", "apiserver-kubelet-client.key", "sa.key", "sa.pub"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Errorf("%s: %v", f, err)
		} else if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
}

func readCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s holds no PEM block", file)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTokens checks the token file the API server reads (token,user,uid,"groups"), that each
// user's kubeconfig carries that user's token, and that a user named twice, or one never named,
// is an error that names it.
func TestTokens(t *testing.T) {
	cp := &ControlPlane{Dir: t.TempDir(), URL: "https://192.168.77.10:6443", users: map[string]string{}}
	users := []User{
		{Name: AdminUser, Groups: []string{"system:masters"}},
		{Name: "system:serviceaccount:kube-system:kubenet", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system"}},
		{Name: "system:kube-proxy"},
	}
	if err := cp.writeTokens(users); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(cp.Dir, "tokens.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(users) {
		t.Fatalf("%d rows in tokens.csv, want %d", len(rows), len(users))
	}
	seen := map[string]bool{}
	for i, row := range rows {
		u := users[i]
		if len(row) != 4 || row[1] != u.Name || row[2] != u.Name || row[3] != strings.Join(u.Groups, ",") {
			t.Errorf("row %d = %q, want token,%s,%s,%q", i, row, u.Name, u.Name, strings.Join(u.Groups, ","))
		}
		if len(row[0]) != 32 || seen[row[0]] {
			t.Errorf("row %d: token %q is not a fresh 128-bit hex token", i, row[0])
		}
		seen[row[0]] = true
		file := cp.Kubeconfig(t, u.Name)
		kc, err := clientcmd.LoadFromFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if got := kc.AuthInfos[u.Name].Token; got != row[0] {
			t.Errorf("kubeconfig of %s has token %q, want %q", u.Name, got, row[0])
		}
		if kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster].Server != cp.URL {
			t.Errorf("kubeconfig of %s does not point at %s", u.Name, cp.URL)
		}
	}
	if err := cp.writeTokens([]User{{Name: "system:kube-proxy"}}); err == nil || !strings.Contains(err.Error(), "system:kube-proxy") {
		t.Errorf("a user named twice: %v, want an error naming it", err)
	}
	if err := cp.WriteKubeconfig(filepath.Join(cp.Dir, "x"), "nobody"); err == nil || !strings.Contains(err.Error(), `"nobody"`) {
		t.Errorf("kubeconfig of an unknown user: %v, want an error naming it", err)
	}
}
