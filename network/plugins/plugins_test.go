package plugins

import (
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/network/cni"
	"github.com/kubenet-dev/kubenet/network/kubenet"
)

// host is a Host built from kubelet's two getters, the port mappings from the no-op getter.
type host struct {
	network.NoopPortMappingGetter
	netns string
}

func (h host) GetNetNS(string) (string, error) { return h.netns, nil }

var _ network.Host = host{}

func TestProbeNetworkPlugins(t *testing.T) {
	got := ProbeNetworkPlugins(t.TempDir(), "/opt/cni/bin, /usr/lib/cni")
	if len(got) != 2 {
		t.Fatalf("%d plugins, want the CNI wrapper and kubenet", len(got))
	}
	if _, ok := got[0].(*cni.Plugin); !ok || got[0].Name() != "cni" {
		t.Errorf("first plugin %T %q, want the CNI wrapper", got[0], got[0].Name())
	}
	if _, ok := got[1].(*kubenet.Plugin); !ok || got[1].Name() != "kubenet" {
		t.Errorf("second plugin %T %q, want kubenet", got[1], got[1].Name())
	}
	if err := Close(got); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestInitNetworkPluginSelectsFromProbe: InitNetworkPlugin picks each probed plugin by its
// --network-plugin name and Inits it; "" is the no-op plugin; an unknown name is refused; a bad
// kubenet setting fails Init, naming it.
func TestInitNetworkPluginSelectsFromProbe(t *testing.T) {
	for _, c := range []struct {
		name, hairpin, want, wantErr string
	}{
		{name: "cni", want: "cni"},
		{name: "kubenet", want: "kubenet"},
		{name: "kubenet", hairpin: "promiscuous-bridge", want: "kubenet"},
		{name: "", want: network.DefaultPluginName},
		{name: "calico", wantErr: `network plugin "calico" not found`},
		{name: "kubenet", hairpin: "sometimes", wantErr: `invalid hairpin mode "sometimes"`},
	} {
		t.Run(c.name+" "+c.hairpin, func(t *testing.T) {
			plugins := Probe(Options{CNIConfDir: t.TempDir(), Kubenet: kubenet.Options{DataDir: t.TempDir()}})
			t.Cleanup(func() { _ = Close(plugins) })
			p, err := network.InitNetworkPlugin(plugins, c.name, host{netns: "/x"}, network.HairpinMode(c.hairpin), "", network.UseDefaultMTU)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != c.want {
				t.Errorf("selected %q, want %q", p.Name(), c.want)
			}
			// Init ran: the CNI wrapper reports its (empty) conf dir, kubenet its missing CIDR.
			if err := p.Status(); c.want != network.DefaultPluginName && err == nil {
				t.Errorf("%s ready without configuration", c.want)
			}
		})
	}
}
