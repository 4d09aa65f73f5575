// Command knp-bench runs sigs.k8s.io/kube-network-policies v0.8.0 (the NetworkPolicy engine
// kindnet embeds) on one node, fed from a JSON list of namespaces, pods and NetworkPolicies
// through a fake clientset instead of an API server. bench/ runs it in a simulated node to
// measure the engine kubenet decided not to embed (docs/networkpolicy.md) on the same workload
// as kubenet's own. It is its own module, so kubenet's go.mod never requires the engine.
//
//	knp-bench -objects objects.json -node node-1
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

// objects is what the bench writes.
type objects struct {
	Namespaces []corev1.Namespace           `json:"namespaces"`
	Pods       []corev1.Pod                 `json:"pods"`
	Policies   []networkingv1.NetworkPolicy `json:"policies"`
}

func main() {
	file := flag.String("objects", "", "JSON file of namespaces, pods and policies")
	node := flag.String("node", "", "this node's name (pods with this spec.nodeName are local)")
	flag.Parse()
	if err := run(*file, *node); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(file, node string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var objs objects
	if err := json.Unmarshal(b, &objs); err != nil {
		return err
	}
	var all []runtime.Object
	for i := range objs.Namespaces {
		all = append(all, &objs.Namespaces[i])
	}
	for i := range objs.Pods {
		all = append(all, &objs.Pods[i])
	}
	for i := range objs.Policies {
		all = append(all, &objs.Policies[i])
	}
	client := fake.NewSimpleClientset(all...)
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil,
		networkpolicy.Config{NodeName: node, QueueID: 100, NRIdisabled: true, NetfilterBug1766Fix: false})
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	factory.Start(ctx.Done())
	return c.Run(ctx)
}
