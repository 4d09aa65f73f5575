// Package nettest builds the small worlds that kubenet's kernel tests run in: network namespaces
// that stand in for nodes, pods and outside hosts, veth links between them, and TCP/UDP echo
// servers whose replies name the source address they saw (so tests can assert on SNAT).
//
// Everything is created inside namespaces the test made and removed with t.Cleanup, also when the
// test fails. Nothing here touches the namespace the test process started in.
package nettest
