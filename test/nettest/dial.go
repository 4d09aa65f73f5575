package nettest

import (
	"context"
	"net"

	"github.com/containernetworking/plugins/pkg/ns"
)

// DialIn returns a dial function whose sockets are created inside n, for HTTP clients (and
// client-go's rest.Config.Dial) that must talk to servers living in a test namespace. The
// socket stays in n after the dialing thread has left it.
func DialIn(n ns.NetNS) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := n.Do(func(ns.NetNS) error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
