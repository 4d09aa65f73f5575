package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// conf is a valid configuration with the given keys (raw JSON members) added or replaced.
func conf(members ...string) []byte {
	base := map[string]string{
		"cniVersion": `"1.1.0"`, "name": `"kubenet"`, "type": `"kubenet"`, "podCIDRs": `["10.244.1.0/24"]`, "dataDir": `"/var/lib/cni/networks"`,
	}
	for _, m := range members {
		k, v, _ := strings.Cut(m, ":")
		base[strings.Trim(k, `"`)] = v
	}
	var parts []string
	for k, v := range base {
		parts = append(parts, fmt.Sprintf("%q:%s", k, v))
	}
	slices.Sort(parts)
	return []byte("{" + strings.Join(parts, ",") + "}")
}

// TestConfigThatBreaksTheNode: values that would hand pods the node's own or special addresses,
// or make kubenet write sysctls and links it must not, are refused with code 7 naming the key and
// the value; sensible neighbours of each are accepted.
func TestConfigThatBreaksTheNode(t *testing.T) {
	cases := []struct {
		name   string
		member string
		refuse bool
		names  []string
	}{
		{"pod CIDR loopback", `"podCIDRs":["127.0.0.0/8"]`, true, []string{"podCIDRs", "127.0.0.0/8", "loopback"}},
		{"pod CIDR inside loopback", `"podCIDRs":["127.1.0.0/24"]`, true, []string{"127.1.0.0/24"}},
		{"pod CIDR link-local", `"podCIDRs":["169.254.0.0/24"]`, true, []string{"169.254.0.0/24", "link-local"}},
		{"pod CIDR multicast", `"podCIDRs":["224.0.0.0/24"]`, true, []string{"multicast"}},
		{"pod CIDR this-network", `"podCIDRs":["0.0.0.0/24"]`, true, []string{"0.0.0.0/24"}},
		{"pod CIDR covering everything", `"podCIDRs":["0.0.0.0/1"]`, true, []string{"0.0.0.0/1"}},
		{"pod CIDR with the broadcast address", `"podCIDRs":["255.255.255.0/24"]`, true, []string{"broadcast"}},
		{"pod CIDR IPv6 loopback", `"podCIDRs":["::/126"]`, true, []string{"::/126"}},
		{"pod CIDR IPv6 link-local", `"podCIDRs":["fe80::/64"]`, true, []string{"fe80::/64", "link-local"}},
		{"pod CIDR IPv6 multicast", `"podCIDRs":["ff02::/64"]`, true, []string{"multicast"}},
		{"pod CIDR IPv4-mapped", `"podCIDRs":["::ffff:10.244.0.0/120"]`, true, []string{"IPv4-mapped"}},
		{"pod CIDR NAT64", `"podCIDRs":["64:ff9b::/120"]`, true, []string{"NAT64"}},
		{"pod CIDR discard-only", `"podCIDRs":["100::/64"]`, true, []string{"discard"}},
		{"pod CIDR all of IPv6", `"podCIDRs":["::/0"]`, true, []string{"::/0"}},
		{"ipRanges link-local", `"runtimeConfig":{"ipRanges":[[{"subnet":"169.254.9.0/24"}]]}`, true, []string{"ipRanges", "169.254.9.0/24"}},
		{"pod CIDR class E (Linux routes it)", `"podCIDRs":["240.0.1.0/24"]`, false, nil},
		{"pod CIDR shared address space", `"podCIDRs":["100.64.1.0/24"]`, false, nil},
		{"pod CIDR ULA", `"podCIDRs":["fd00:1::/64"]`, false, nil},
		{"pod CIDR global IPv6", `"podCIDRs":["2001:db8:1::/64"]`, false, nil},

		{"bridge lo", `"bridge":"lo"`, true, []string{"bridge", `"lo"`, "loopback"}},
		{"bridge all", `"bridge":"all"`, true, []string{"bridge", `"all"`, "sysctl"}},
		{"bridge default", `"bridge":"default"`, true, []string{"bridge", `"default"`}},
		{"bridge bonding_masters", `"bridge":"bonding_masters"`, true, []string{"bonding_masters"}},
		{"bridge template", `"bridge":"br%d"`, true, []string{"br%d", "template"}},
		{"bridge like a kubenet veth", `"bridge":"veth0123456789a"`, true, []string{"veth0123456789a"}},
		{"bridge like a kubenet ifb", `"bridge":"kifb0123456789a"`, true, []string{"kifb0123456789a"}},
		{"bridge with a non-ASCII byte", `"bridge":"br\u00e9"`, true, []string{"bridge"}},
		{"bridge with a tab", `"bridge":"br\t0"`, true, []string{"bridge"}},
		{"bridge with a colon", `"bridge":"br:0"`, true, []string{"bridge"}},
		{"bridge too long", `"bridge":"bridge0123456789"`, true, []string{"bridge"}},
		{"bridge veth-like but short", `"bridge":"veth0"`, false, nil},
		{"bridge veth-like with a letter beyond hex", `"bridge":"veth0123456789g"`, false, nil},
		{"bridge veth-like in upper case", `"bridge":"veth0123456789A"`, false, nil},
		{"bridge ifb-like but short", `"bridge":"kifb0123456789"`, false, nil},
		{"bridge cni0", `"bridge":"cni0"`, false, nil},

		{"network with a slash", `"name":"a/b"`, true, []string{"name", "a/b"}},
		{"network dot-dot", `"name":".."`, true, []string{"name"}},
		{"network starting with a dash", `"name":"-n"`, true, []string{"name", "-n"}},
		{"network with a NUL", `"name":"a\u0000b"`, true, []string{"name"}},
		{"network too long", `"name":"` + strings.Repeat("n", 129) + `"`, true, []string{"name", "longer than 128"}},
		{"network of 128 bytes", `"name":"` + strings.Repeat("n", 128) + `"`, false, nil},

		{"nonMasq loopback", `"nonMasqueradeCIDRs":["127.0.0.0/8"]`, true, []string{"nonMasqueradeCIDRs", "127.0.0.0/8"}},
		{"nonMasq multicast", `"nonMasqueradeCIDRs":["224.0.0.0/4"]`, true, []string{"nonMasqueradeCIDRs", "224.0.0.0/4"}},
		{"nonMasq IPv4-mapped", `"nonMasqueradeCIDRs":["::ffff:10.0.0.0/104"]`, true, []string{"nonMasqueradeCIDRs"}},
		{"nonMasq unspecified host", `"nonMasqueradeCIDRs":["0.0.0.0/32"]`, true, []string{"0.0.0.0/32"}},
		{"nonMasq everything (masquerading off)", `"nonMasqueradeCIDRs":["0.0.0.0/0","::/0"]`, false, nil},
		{"nonMasq link-local (metadata service)", `"nonMasqueradeCIDRs":["169.254.0.0/16"]`, false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(conf(tc.member))
			if !tc.refuse {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var e *types.Error
			if !errors.As(err, &e) || e.Code != types.ErrInvalidNetworkConfig {
				t.Fatalf("got %v, want a code 7 error", err)
			}
			for _, n := range tc.names {
				if !strings.Contains(e.Msg, n) {
					t.Errorf("message %q does not name %q", e.Msg, n)
				}
			}
		})
	}
}

// TestTeardownConfigTakesHintsOnly: whatever a pod author or a broken runtime puts into the
// capability arguments, prevResult or the rest of the configuration, DEL and GC get a
// configuration; the valid host ports are kept as hints, the invalid dropped. Only a bad network
// name or data dir, which locate the state, are refused.
func TestTeardownConfigTakesHintsOnly(t *testing.T) {
	cases := []struct {
		name    string
		members []string
		refuse  bool
		ports   []PortMapping
		cidrs   []string
	}{
		{name: "hostPort 0", members: []string{`"runtimeConfig":{"portMappings":[{"hostPort":0,"containerPort":80}]}`}},
		{name: "one bad mapping among good", members: []string{`"runtimeConfig":{"portMappings":[{"hostPort":99999,"containerPort":80},{"hostPort":8080,"containerPort":80,"protocol":"UDP"},"junk",{"hostPort":"x"}]}`},
			ports: []PortMapping{{8080, 80, "udp", ""}}},
		{name: "portMappings not a list", members: []string{`"runtimeConfig":{"portMappings":"8080"}`}},
		{name: "bad bandwidth annotation", members: []string{`"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"kubernetes.io/ingress-bandwidth":"lots"}}`}},
		{name: "annotations not a map", members: []string{`"runtimeConfig":{"io.kubernetes.cri.pod-annotations":["x"]}`}},
		{name: "negative bandwidth", members: []string{`"runtimeConfig":{"bandwidth":{"ingressRate":-1}}`}},
		{name: "runtimeConfig not an object", members: []string{`"runtimeConfig":7`}},
		{name: "bad ipRanges fall back to podCIDRs", members: []string{`"runtimeConfig":{"ipRanges":[[{"subnet":"banana"}]]}`}, cidrs: []string{"10.244.1.0/24"}},
		{name: "bad pod CIDRs are dropped", members: []string{`"podCIDRs":["banana","127.0.0.0/8","fd00:1::/64"]`}, cidrs: []string{"fd00:1::/64"}},
		{name: "no pod CIDR", members: []string{`"podCIDRs":[]`}},
		{name: "malformed prevResult", members: []string{`"prevResult":{"cniVersion":"1.1.0","ips":"x"}`}},
		{name: "bad MTU, hairpin mode, bridge", members: []string{`"mtu":"big"`, `"hairpinMode":7`, `"bridge":"lo"`}},
		{name: "bad network name", members: []string{`"name":"a/b"`}, refuse: true},
		{name: "relative data dir", members: []string{`"dataDir":"var/lib"`}, refuse: true},
		{name: "data dir not a string", members: []string{`"dataDir":7`}, refuse: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseTeardownConfig(conf(tc.members...))
			if tc.refuse {
				requireCNIError(t, err, types.ErrInvalidNetworkConfig)
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if cfg.Network != "kubenet" || cfg.DataDir != "/var/lib/cni/networks" || cfg.Bridge == "lo" {
				t.Errorf("config %+v", cfg)
			}
			if !slices.Equal(cfg.Runtime.PortMappings, tc.ports) {
				t.Errorf("port mappings %+v, want %+v", cfg.Runtime.PortMappings, tc.ports)
			}
			if tc.cidrs != nil {
				var got []string
				for _, p := range cfg.PodCIDRs() {
					got = append(got, p.String())
				}
				if !slices.Equal(got, tc.cidrs) {
					t.Errorf("pod CIDRs %v, want %v", got, tc.cidrs)
				}
			}
		})
	}
}

// TestCheckConfigIgnoresPodAuthorInput: CHECK works from the record, so what a pod author
// controls cannot fail it; the network's own configuration is checked as for ADD.
func TestCheckConfigIgnoresPodAuthorInput(t *testing.T) {
	for _, m := range []string{
		`"runtimeConfig":{"portMappings":[{"hostPort":0,"containerPort":80}]}`,
		`"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"kubernetes.io/egress-bandwidth":"-1"}}`,
		`"runtimeConfig":{"bandwidth":{"egressRate":5}}`,
		`"runtimeConfig":{"portMappings":"x","ipRanges":[[{"subnet":"10.9.0.0/24"}]]}`,
	} {
		cfg, err := ParseCheckConfig(conf(m))
		if err != nil {
			t.Errorf("%s: %v", m, err)
			continue
		}
		if len(cfg.Runtime.PortMappings) != 0 || cfg.Runtime.Bandwidth != nil {
			t.Errorf("%s: kept capability arguments %+v", m, cfg.Runtime)
		}
	}
	for _, m := range []string{`"hairpinMode":"x"`, `"runtimeConfig":{"ipRanges":[[{"subnet":"127.0.0.0/24"}]]}`, `"podCIDRs":["169.254.0.0/16"]`} {
		if _, err := ParseCheckConfig(conf(m)); err == nil {
			t.Errorf("%s: accepted", m)
		}
	}
}

// TestParseValidAttachments: the GC list decides what GC deletes; malformed entries are errors,
// never "keep nothing".
func TestParseValidAttachments(t *testing.T) {
	cases := []struct {
		name, list string
		want       []ValidAttachment
		code       uint // 0: accepted
	}{
		{"empty", `"cni.dev/valid-attachments":[]`, nil, 0},
		{"null (libcni's empty list)", `"cni.dev/valid-attachments":null`, nil, 0},
		{"two", `"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"},{"containerID":"b_1.x-2","ifname":"net1"}]`,
			[]ValidAttachment{{"a", "eth0"}, {"b_1.x-2", "net1"}}, 0},
		{"legacy key", `"cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]`, []ValidAttachment{{"a", "eth0"}}, 0},
		{"missing list", ``, nil, types.ErrInvalidNetworkConfig},
		{"entry without ifname", `"cni.dev/valid-attachments":[{"containerID":"a"}]`, nil, types.ErrInvalidNetworkConfig},
		{"entry without container ID", `"cni.dev/valid-attachments":[{"ifname":"eth0"}]`, nil, types.ErrInvalidNetworkConfig},
		{"container ID with a path", `"cni.dev/valid-attachments":[{"containerID":"../x","ifname":"eth0"}]`, nil, types.ErrInvalidNetworkConfig},
		{"ifname with a slash", `"cni.dev/valid-attachments":[{"containerID":"a","ifname":"a/b"}]`, nil, types.ErrInvalidNetworkConfig},
		{"null entry", `"cni.dev/valid-attachments":[null]`, nil, types.ErrInvalidNetworkConfig},
		{"entry not an object", `"cni.dev/valid-attachments":["a"]`, nil, types.ErrInvalidNetworkConfig},
		{"list not a list", `"cni.dev/valid-attachments":{"containerID":"a","ifname":"eth0"}`, nil, types.ErrInvalidNetworkConfig},
		{"container ID too long", `"cni.dev/valid-attachments":[{"containerID":"` + strings.Repeat("a", 129) + `","ifname":"eth0"}]`, nil, types.ErrInvalidNetworkConfig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			members := []string{}
			if tc.list != "" {
				members = append(members, tc.list)
			}
			got, err := ParseValidAttachments(conf(members...))
			if tc.code != 0 {
				requireCNIError(t, err, tc.code)
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestPrevResultIsHostile: CHECK reads prevResult from the runtime's cache; an entry that points
// at an interface prevResult does not have, or holds no address, is an error, never a panic.
func TestPrevResultIsHostile(t *testing.T) {
	att := Attachment{ContainerID: "c", IfName: "eth0"}
	cases := []struct {
		name string
		prev string
		want []string // addresses; nil with ok=false: an error
		ok   bool
	}{
		{"good", `{"cniVersion":"1.1.0","interfaces":[{"name":"cbr0"},{"name":"veth"},{"name":"eth0"}],"ips":[{"interface":2,"address":"10.244.1.2/24"}]}`, []string{"10.244.1.2"}, true},
		{"another interface's address is not ours", `{"cniVersion":"1.1.0","interfaces":[{"name":"net1"}],"ips":[{"interface":0,"address":"10.9.0.2/24"}]}`, nil, true},
		{"no interface index counts", `{"cniVersion":"1.1.0","ips":[{"address":"10.244.1.2/24"}]}`, []string{"10.244.1.2"}, true},
		{"negative index", `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"interface":-1,"address":"10.244.1.2/24"}]}`, nil, false},
		{"index past the end", `{"cniVersion":"1.1.0","interfaces":[],"ips":[{"interface":7,"address":"10.244.1.2/24"}]}`, nil, false},
		{"huge index", `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"interface":9223372036854775807,"address":"10.244.1.2/24"}]}`, nil, false},
		{"null interface", `{"cniVersion":"1.1.0","interfaces":[null],"ips":[{"interface":0,"address":"10.244.1.2/24"}]}`, nil, false},
		{"no address", `{"cniVersion":"1.1.0","ips":[{}]}`, nil, false},
		{"null ip", `{"cniVersion":"1.1.0","ips":[null]}`, nil, false},
		{"old version, negative index", `{"cniVersion":"0.3.1","interfaces":[{"name":"eth0"}],"ips":[{"version":"4","interface":-5,"address":"10.244.1.2/24"}]}`, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := conf(`"prevResult":` + tc.prev)
			cfg, err := ParseCheckConfig(c)
			if err != nil {
				if tc.ok {
					t.Fatalf("config refused: %v", err)
				}
				requireCNIError(t, err, types.ErrDecodingFailure, types.ErrInvalidNetworkConfig)
				return
			}
			got, err := prevAddrs(cfg.PrevResult, att)
			if !tc.ok {
				requireCNIError(t, err, types.ErrInvalidNetworkConfig)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var s []string
			for _, a := range got {
				s = append(s, a.String())
			}
			if !slices.Equal(s, tc.want) {
				t.Errorf("addresses %v, want %v", s, tc.want)
			}
		})
	}
}

// TestAttachmentValidate: the identifiers of an attachment reach file names and kernel names, on
// the binary's path and the in-process one alike.
func TestAttachmentValidate(t *testing.T) {
	cases := []struct {
		id, ifname string
		ok         bool
	}{
		{"abc", "eth0", true},
		{"a_b.c-d", "net@1", true},
		{strings.Repeat("f", 128), "eth0", true},
		{strings.Repeat("f", 129), "eth0", false},
		{"", "eth0", false},
		{"../x", "eth0", false},
		{"a/b", "eth0", false},
		{"a@b", "eth0", false},
		{"a b", "eth0", false},
		{"a\x00b", "eth0", false},
		{"_a", "eth0", false},
		{"a", "", false},
		{"a", ".", false},
		{"a", "..", false},
		{"a", "e/0", false},
		{"a", "e:0", false},
		{"a", "eth 0", false},
		{"a", "eth0123456789abc", false},
	}
	for _, tc := range cases {
		err := Attachment{ContainerID: tc.id, IfName: tc.ifname}.Validate()
		if tc.ok != (err == nil) {
			t.Errorf("Validate(%q, %q) = %v, want ok=%v", tc.id, tc.ifname, err, tc.ok)
		}
		if err != nil {
			requireCNIError(t, err, types.ErrInvalidEnvironmentVariables, types.ErrUnknownContainer)
		}
	}
}

// TestRecordNamesAreUnambiguous: two attachments never share a record file, however their
// identifiers split ("a_b" + "c" and "a" + "b_c" shared one before).
func TestRecordNamesAreUnambiguous(t *testing.T) {
	atts := []Attachment{{ContainerID: "a_b", IfName: "c"}, {ContainerID: "a", IfName: "b_c"}, {ContainerID: "a", IfName: "b@c"}, {ContainerID: "a.json", IfName: "x"}, {ContainerID: "a", IfName: "x.json"}}
	seen := map[string]Attachment{}
	for _, a := range atts {
		name := a.key().recordName()
		if other, dup := seen[name]; dup {
			t.Errorf("%v and %v share record %s", a, other, name)
		}
		seen[name] = a
		back, ok := parseRecordName(name)
		if !ok || back.attachment() != a {
			t.Errorf("parseRecordName(%q) = %v %v, want %v", name, back, ok, a)
		}
	}
	for _, bad := range []string{"x.json", "@eth0.json", "a@.json", "a@eth0", "../a@eth0.json", "a b@eth0.json"} {
		if a, ok := parseRecordName(bad); ok {
			t.Errorf("parseRecordName(%q) = %v", bad, a)
		}
	}
}

// recordsIn returns a record store in a fresh network directory.
func recordsIn(t *testing.T) (Records, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "kubenet")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return NewRecords(dir), filepath.Join(dir, RecordDirName)
}

// TestCorruptRecords: a record file that is not a record ADD could have written is reported as
// corrupt (DEL then tears down from the key), never taken for another attachment's, never
// followed out of the data dir, and one of them never hides the others from GC.
func TestCorruptRecords(t *testing.T) {
	att := Attachment{ContainerID: "pod", IfName: "eth0"}
	good := Record{ContainerID: "pod", IfName: "eth0", IPs: []netip.Prefix{netip.MustParsePrefix("10.244.1.2/24")}}
	goodJSON, _ := json.Marshal(good)
	cases := []struct {
		name  string
		write func(t *testing.T, dir, file string)
	}{
		{"truncated", writeString(string(goodJSON[:len(goodJSON)/2]))},
		{"empty (power loss)", writeString("")},
		{"garbage", writeString("\x00\xff")},
		{"another attachment's", writeString(`{"containerID":"other","ifName":"eth0"}`)},
		{"invalid identifiers", writeString(`{"containerID":"../pod","ifName":"eth0"}`)},
		{"zoned address", writeString(`{"containerID":"pod","ifName":"eth0","ips":["fe80::1%eth0/64"]}`)},
		{"three addresses", writeString(`{"containerID":"pod","ifName":"eth0","ips":["10.0.0.2/24","10.0.0.3/24","fd00::2/64"]}`)},
		{"hostPort 0", writeString(`{"containerID":"pod","ifName":"eth0","portMappings":[{"hostPort":0,"containerPort":80,"protocol":"tcp"}]}`)},
		{"protocol that names a path", writeString(`{"containerID":"pod","ifName":"eth0","portMappings":[{"hostPort":80,"containerPort":80,"protocol":"../../x"}]}`)},
		{"symlink to a record outside", func(t *testing.T, dir, file string) {
			outside := filepath.Join(t.TempDir(), "r.json")
			if err := os.WriteFile(outside, goodJSON, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, file); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory in its place", func(t *testing.T, dir, file string) {
			if err := os.MkdirAll(filepath.Join(file, "x"), 0o755); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			records, dir := recordsIn(t)
			other := Record{ContainerID: "other", IfName: "eth0"}
			if err := records.Save(&other); err != nil {
				t.Fatal(err)
			}
			tc.write(t, dir, filepath.Join(dir, att.key().recordName()))
			rec, err := records.Load(att)
			if !errors.As(err, new(*CorruptRecordError)) || rec != nil {
				t.Fatalf("Load = %v, %v; want a *CorruptRecordError", rec, err)
			}
			scan, err := records.Scan()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(scan.Corrupt, []Attachment{att}) || len(scan.Records) != 1 || scan.Records[0].ContainerID != "other" {
				t.Errorf("Scan = %+v; want the other record and %v corrupt", scan, att)
			}
			if list, err := records.List(); err != nil || len(list) != 1 {
				t.Errorf("List = %v, %v; want the other record", list, err)
			}
			if err := records.Remove(att); err != nil {
				t.Fatal(err)
			}
			if rec, err := records.Load(att); rec != nil || err != nil {
				t.Errorf("after Remove: %v, %v", rec, err)
			}
		})
	}
}

func writeString(s string) func(t *testing.T, dir, file string) {
	return func(t *testing.T, dir, file string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLegacyRecords: a record under the name of earlier versions ("<id>_<ifname>.json") is read
// when its content names the attachment, and ignored when it is another attachment's that shares
// the name or unreadable.
func TestLegacyRecords(t *testing.T) {
	records, dir := recordsIn(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	legacy := Record{ContainerID: "a_b", IfName: "c"}
	data, _ := json.Marshal(legacy)
	if err := os.WriteFile(filepath.Join(dir, "a_b_c.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if rec, err := records.Load(Attachment{ContainerID: "a_b", IfName: "c"}); err != nil || rec == nil || rec.ContainerID != "a_b" {
		t.Errorf("Load of the legacy record's attachment = %v, %v", rec, err)
	}
	if rec, err := records.Load(Attachment{ContainerID: "a", IfName: "b_c"}); err != nil || rec != nil {
		t.Errorf("Load of the attachment that shares the legacy name = %v, %v; want none", rec, err)
	}
	if scan, err := records.Scan(); err != nil || len(scan.Records) != 1 || len(scan.Garbage) != 0 {
		t.Errorf("Scan = %+v, %v", scan, err)
	}
	if err := records.Remove(Attachment{ContainerID: "a", IfName: "b_c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a_b_c.json")); err != nil {
		t.Errorf("Remove of another attachment took the legacy record: %v", err)
	}
	if err := records.Remove(Attachment{ContainerID: "a_b", IfName: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("records directory after the last record went: %v", err)
	}
}

// TestRecordRemoveTakesItsTemporaryFiles: a write killed before its rename leaves a temporary
// file; the attachment's Remove takes it, and another attachment's stays until that one goes.
func TestRecordRemoveTakesItsTemporaryFiles(t *testing.T) {
	records, dir := recordsIn(t)
	a, b := Attachment{ContainerID: "a", IfName: "eth0"}, Attachment{ContainerID: "b", IfName: "eth0"}
	for _, att := range []Attachment{a, b} {
		if err := records.Save(&Record{ContainerID: att.ContainerID, IfName: att.IfName}); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "."+att.key().recordName()+".tmp-123"), []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := records.Remove(a); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{".b@eth0.json.tmp-123", "b@eth0.json"}; !slices.Equal(names, want) {
		t.Errorf("records directory %v, want %v", names, want)
	}
	if err := records.Remove(b); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("records directory after the last record went: %v", err)
	}
}
