package kubenet

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"sync"

	"github.com/kubenet-dev/kubenet/core"
)

// portKey is one host port as the kernel's bind table sees it: protocol, local address (the
// family's unspecified address for "every local address") and port.
type portKey struct {
	proto string // tcp or udp
	addr  netip.Addr
	port  uint16
}

func (k portKey) String() string {
	return k.proto + "/" + netip.AddrPortFrom(k.addr, k.port).String()
}

// network is the Go network name that binds only k's family (tcp6 sets IPV6_V6ONLY, so an IPv4
// and an IPv6 holder of one port do not collide).
func (k portKey) network() string {
	if k.addr.Is4() {
		return k.proto + "4"
	}
	return k.proto + "6"
}

// portKeys lists the sockets that hold mappings for a pod with addresses of the given families
// (true: IPv6): one per key of the core's DNAT entries (core.HostPortKeys), so a socket is held
// exactly where a DNAT element steers traffic. SCTP is not held (the standard library has no
// SCTP sockets, and old kubelet skipped it too).
func portKeys(mappings []core.PortMapping, families []bool) ([]portKey, error) {
	keys, err := core.HostPortKeys(mappings, families)
	if err != nil {
		return nil, err
	}
	var out []portKey
	for _, k := range keys {
		if k.Protocol != "tcp" && k.Protocol != "udp" {
			continue
		}
		out = append(out, portKey{proto: k.Protocol, addr: k.HostIP, port: k.HostPort})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

// ports holds one socket per host port of the node's pods, so no process on the node can bind a
// port that a pod's DNAT rule owns (kubernetes#37087). The sockets live as long as the plugin
// object; a new one re-acquires them from the attachment records, which old kubelet did not.
type ports struct {
	mu      sync.Mutex
	held    map[portKey]heldPort
	byOwner map[string][]portKey
}

type heldPort struct {
	owner string
	sock  io.Closer
}

func newPorts() *ports {
	return &ports{held: map[portKey]heldPort{}, byOwner: map[string][]portKey{}}
}

// open binds every key that owner does not hold yet and returns the keys it opened, so a failed
// set-up closes only what it added. On any failure nothing new stays open. The caller runs it in
// the node's network namespace: the sockets stay in the namespace they were made in.
func (p *ports) open(owner string, keys []portKey) ([]portKey, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var opened []portKey
	for _, k := range keys {
		if h, ok := p.held[k]; ok {
			if h.owner == owner {
				continue
			}
			p.closeLocked(owner, opened)
			return nil, fmt.Errorf("cannot open hostport %s for pod sandbox %s: held for sandbox %s", k, owner, h.owner)
		}
		sock, err := listen(k)
		if err != nil {
			p.closeLocked(owner, opened)
			return nil, fmt.Errorf("cannot open hostport %s for pod sandbox %s: %w", k, owner, err)
		}
		p.held[k] = heldPort{owner: owner, sock: sock}
		p.byOwner[owner] = append(p.byOwner[owner], k)
		opened = append(opened, k)
	}
	return opened, nil
}

func listen(k portKey) (io.Closer, error) {
	addr := net.JoinHostPort(k.addr.String(), strconv.Itoa(int(k.port)))
	if k.proto == "udp" {
		return net.ListenPacket(k.network(), addr)
	}
	return net.Listen(k.network(), addr)
}

// close closes the given keys of owner (nil: all of them).
func (p *ports) close(owner string, keys []portKey) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if keys == nil {
		keys = p.byOwner[owner]
	}
	return p.closeLocked(owner, keys)
}

func (p *ports) closeLocked(owner string, keys []portKey) error {
	var errs []error
	drop := map[portKey]bool{}
	for _, k := range keys {
		h, ok := p.held[k]
		if !ok || h.owner != owner {
			continue
		}
		errs = append(errs, h.sock.Close())
		delete(p.held, k)
		drop[k] = true
	}
	var keep []portKey
	for _, k := range p.byOwner[owner] {
		if !drop[k] {
			keep = append(keep, k)
		}
	}
	if len(keep) == 0 {
		delete(p.byOwner, owner)
	} else {
		p.byOwner[owner] = keep
	}
	return errors.Join(errs...)
}

// closeAll closes every socket (the plugin object is going away).
func (p *ports) closeAll() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for k, h := range p.held {
		errs = append(errs, h.sock.Close())
		delete(p.held, k)
	}
	p.byOwner = map[string][]portKey{}
	return errors.Join(errs...)
}

// heldBy returns the keys owner holds, as strings (for logs and tests).
func (p *ports) heldBy(owner string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, k := range p.byOwner[owner] {
		out = append(out, k.String())
	}
	return out
}
