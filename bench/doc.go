// Package bench compares kubenet with the reference CNI chain (bridge + host-local, portmap,
// bandwidth of containernetworking/plugins) on the workloads of issue 6: both driven through
// libcni in one simulated node, alternating, with the plugin processes' wall time and peak RSS
// recorded by a libcni executor. `make bench` runs it and writes docs/bench.md; see that file for
// what is measured and how to read it. BenchmarkPacketCost, run alone, takes the data path's
// per-packet kernel CPU apart by rule set (docs/bench.md, issue 26).
package bench
