package e2e

import (
	"slices"
	"testing"
)

// nftResidue is the nftables part of the residue audit; these dumps are what nft 1.0.6 prints
// for `nft -j list table` (runs in `go test ./...`, no root).
func TestNftResidue(t *testing.T) {
	const clean = `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
	 {"table": {"family": "inet", "name": "kubenetpolicy-kubenet", "handle": 1}},
	 {"set": {"family": "inet", "name": "pending-ipv4", "table": "kubenetpolicy-kubenet", "type": "ipv4_addr", "handle": 3}},
	 {"map": {"family": "inet", "name": "ingress-ipv4", "table": "kubenetpolicy-kubenet", "type": "ipv4_addr", "handle": 4, "map": "verdict"}},
	 {"chain": {"family": "inet", "table": "kubenetpolicy-kubenet", "name": "forward", "handle": 2, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}},
	 {"chain": {"family": "inet", "table": "kubenetpolicy-kubenet", "name": "input", "handle": 5, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
	 {"rule": {"family": "inet", "table": "kubenetpolicy-kubenet", "chain": "forward", "handle": 9, "expr": [{"vmap": {"key": {"payload": {"protocol": "ip", "field": "daddr"}}, "data": "@ingress-ipv4"}}]}}]}`
	const policy = `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
	 {"table": {"family": "inet", "name": "kubenetpolicy-kubenet", "handle": 1}},
	 {"set": {"family": "inet", "name": "pending-ipv4", "table": "kubenetpolicy-kubenet", "type": "ipv4_addr", "handle": 3, "elem": [{"elem": {"val": "10.244.0.5", "comment": "abc/eth0"}}]}},
	 {"map": {"family": "inet", "name": "ingress-ipv4", "table": "kubenetpolicy-kubenet", "type": "ipv4_addr", "handle": 4, "map": "verdict", "elem": [["10.244.0.6", {"jump": {"target": "in-abc"}}]]}},
	 {"set": {"family": "inet", "name": "in-abc-any-ipv4", "table": "kubenetpolicy-kubenet", "type": ["ipv4_addr", "inet_proto"], "handle": 5, "flags": ["interval"], "elem": [{"concat": ["10.244.0.7", "tcp"]}]}},
	 {"set": {"family": "inet", "name": "pending-ipv6", "table": "kubenetpolicy-kubenet", "type": "ipv6_addr", "handle": 6}},
	 {"chain": {"family": "inet", "table": "kubenetpolicy-kubenet", "name": "in-abc", "handle": 1}},
	 {"chain": {"family": "inet", "table": "kubenetpolicy-kubenet", "name": "forward", "handle": 2, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}},
	 {"rule": {"family": "inet", "table": "kubenetpolicy-kubenet", "chain": "in-abc", "handle": 8, "expr": [{"drop": null}]}}]}`
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
		{"the policy table's base chains and empty fixed sets", clean, nil},
		{"the policy table with a pod's elements and its group", policy, []string{
			`nftables inet kubenetpolicy-kubenet set pending-ipv4: element {"elem":{"val":"10.244.0.5","comment":"abc/eth0"}}`,
			`nftables inet kubenetpolicy-kubenet map ingress-ipv4: element ["10.244.0.6",{"jump":{"target":"in-abc"}}]`,
			`nftables inet kubenetpolicy-kubenet set in-abc-any-ipv4: element {"concat":["10.244.0.7","tcp"]}`,
			`nftables inet kubenetpolicy-kubenet: chain in-abc, a policy group no pod on the node is in`,
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
