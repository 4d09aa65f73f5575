package e2e

import (
	"slices"
	"testing"
)

// nftResidue is the nftables part of the residue audit; these dumps are what nft 1.0.6 prints
// for `nft -j list table` (runs in `go test ./...`, no root).
func TestNftResidue(t *testing.T) {
	const clean = `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
	 {"table": {"family": "bridge", "name": "kubenetpolicy-kubenet", "handle": 1}},
	 {"map": {"family": "bridge", "name": "ingress-ports", "table": "kubenetpolicy-kubenet", "type": "iface_index", "handle": 4, "map": "verdict"}},
	 {"set": {"family": "bridge", "name": "onlink-ipv6", "table": "kubenetpolicy-kubenet", "type": ["ipv6_addr", "ipv6_addr"], "handle": 5, "flags": ["interval"], "elem": [{"concat": [{"prefix": {"addr": "fe80::", "len": 10}}, {"prefix": {"addr": "ff02::", "len": 16}}]}]}},
	 {"chain": {"family": "bridge", "table": "kubenetpolicy-kubenet", "name": "forward", "handle": 2, "type": "filter", "hook": "forward", "prio": 100, "policy": "accept"}},
	 {"chain": {"family": "bridge", "table": "kubenetpolicy-kubenet", "name": "allow-ingress", "handle": 6}},
	 {"rule": {"family": "bridge", "table": "kubenetpolicy-kubenet", "chain": "forward", "handle": 9, "expr": [{"vmap": {"key": {"meta": {"key": "oif"}}, "data": "@ingress-ports"}}]}}]}`
	const policy = `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
	 {"table": {"family": "bridge", "name": "kubenetpolicy-kubenet", "handle": 1}},
	 {"map": {"family": "bridge", "name": "ingress-ports", "table": "kubenetpolicy-kubenet", "type": "iface_index", "handle": 4, "map": "verdict", "elem": [[7, {"goto": {"target": "in-abc"}}]]}},
	 {"set": {"family": "bridge", "name": "in-abc-any-ipv4", "table": "kubenetpolicy-kubenet", "type": ["ipv4_addr", "inet_proto"], "handle": 5, "flags": ["interval"], "elem": [{"concat": ["10.244.0.7", "tcp"]}]}},
	 {"chain": {"family": "bridge", "table": "kubenetpolicy-kubenet", "name": "in-abc", "handle": 1}},
	 {"chain": {"family": "bridge", "table": "kubenetpolicy-kubenet", "name": "forward", "handle": 2, "type": "filter", "hook": "forward", "prio": 100, "policy": "accept"}},
	 {"rule": {"family": "bridge", "table": "kubenetpolicy-kubenet", "chain": "in-abc", "handle": 8, "expr": [{"drop": null}]}}]}`
	const bridge = `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
	 {"table": {"family": "bridge", "name": "kubenet-kubenet", "handle": 2}},
	 {"set": {"family": "bridge", "name": "pod-ports", "table": "kubenet-kubenet", "type": "ifname", "handle": 1, "elem": ["vethabc"]}},
	 {"set": {"family": "bridge", "name": "anti-spoof-ipv4", "table": "kubenet-kubenet", "type": ["ifname", "ipv4_addr"], "handle": 2, "elem": [{"concat": ["vethabc", "10.244.0.5"]}]}},
	 {"chain": {"family": "bridge", "table": "kubenet-kubenet", "name": "pod-guard", "handle": 3, "type": "filter", "hook": "prerouting", "prio": -200, "policy": "accept"}}]}`
	for _, c := range []struct {
		name string
		dump string
		want []string
	}{
		{"no table", "", nil},
		{"the policy table's fixed chains, empty maps and the on-link set", clean, nil},
		{"the policy table with a pod's elements and its group", policy, []string{
			`nftables bridge kubenetpolicy-kubenet map ingress-ports: element [7,{"goto":{"target":"in-abc"}}]`,
			`nftables bridge kubenetpolicy-kubenet set in-abc-any-ipv4: element {"concat":["10.244.0.7","tcp"]}`,
			`nftables bridge kubenetpolicy-kubenet: chain in-abc, a policy group no pod on the node is in`,
		}},
		{"the isolation sets of the bridge table (chains of other tables are the node's)", bridge, []string{
			`nftables bridge kubenet-kubenet set pod-ports: element "vethabc"`,
			`nftables bridge kubenet-kubenet set anti-spoof-ipv4: element {"concat":["vethabc","10.244.0.5"]}`,
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var dump []byte
			if c.dump != "" {
				dump = []byte(c.dump)
			}
			got, err := nftResidue(dump)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("got\n%q\nwant\n%q", got, c.want)
			}
		})
	}
	if _, err := nftResidue([]byte("Error: not JSON")); err == nil {
		t.Error("a dump that is not JSON must be an error, not a clean table")
	}
}
