package netpoldiff

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// Timing of a batch. A probe that may pass arrives within milliseconds (every path is a veth
// or a bridge between namespaces); allowedWait only bounds the wait for one that does not, and
// covers a TCP SYN's first retransmission. quietWindow is how long the batch keeps listening
// after every expected arrival: long enough for any probe that got through a hole to show up,
// which is what tells "denied" from "not yet".
const (
	allowedWait = 5 * time.Second
	quietWindow = 500 * time.Millisecond
	// fragSize is the payload of a fragmented probe: twice the links' MTU of 1500.
	fragSize = 3000
)

// Outcome is what happened to one probe at one receiver.
type Outcome struct {
	Probe     *Probe
	To        Endpoint
	Delivered bool
	From      netip.Addr // the source address the receiver saw
	Answered  bool       // the sender got the reply (unicast TCP, UDP and ICMP only)
	SendErr   error      // the probe could not be sent as meant: a broken probe, not a verdict
}

// needsAnswer tells whether a delivered probe must also be answered: replies of allowed flows
// pass. SCTP has no stack to answer here, and broadcast and multicast receivers do not answer.
func needsAnswer(p *Probe) bool { return !p.Group && p.Proto != SCTP }

// placeOf is where an endpoint's packets start or arrive.
func (l *Lab) placeOf(e Endpoint) *place {
	switch e.Role {
	case RoleLocal:
		return l.places[e.Sandbox]
	case RoleNode:
		return l.places[placeNode]
	case RoleExternal:
		return l.places[placeExternal]
	default:
		return l.places[placePeer]
	}
}

// Run sends probes all at once and reports, for each probe and receiver, what arrived. It
// waits until every pair that expect says may pass has arrived (and been answered), at most
// allowedWait, then listens quietWindow longer for the pairs that must not.
func (l *Lab) Run(probes []*Probe, expect func(p *Probe, to Endpoint) bool) []Outcome {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type state struct {
		tok      string
		answered atomic.Bool
		err      error
	}
	states := make([]*state, len(probes))
	var sent, done sync.WaitGroup
	for i, p := range probes {
		tag := l.serial.Add(1)
		st := &state{tok: fmt.Sprintf("t%d", tag)}
		if p.Proto == SCTP {
			st.tok = sctpToken(tag)
		}
		states[i] = st
		sent.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			once := sync.OnceFunc(sent.Done)
			defer once()
			ok, err := l.send(ctx, p, st.tok, tag, once)
			st.answered.Store(ok)
			if ctx.Err() == nil {
				st.err = err // an error after the batch ended is the cancellation
			}
		}()
	}
	sent.Wait()
	arrived := func(i int, to Endpoint) bool {
		_, ok := l.rec.arrived(states[i].tok, l.placeOf(to).name)
		return ok
	}
	answered := func(i int) bool {
		p := probes[i]
		if p.Proto == ICMP {
			return l.rec.wasAnswered(states[i].tok)
		}
		return states[i].answered.Load()
	}
	complete := func() bool {
		for i, p := range probes {
			for _, to := range p.To {
				if expect(p, to) && (!arrived(i, to) || needsAnswer(p) && !answered(i)) {
					return false
				}
			}
		}
		return true
	}
	for deadline := time.Now().Add(allowedWait); !complete() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	// Nothing to synchronise with here: a probe that a hole lets through arrives within this
	// window or not at all.
	time.Sleep(quietWindow)
	cancel()
	done.Wait()

	var out []Outcome
	var toks []string
	for i, p := range probes {
		toks = append(toks, states[i].tok)
		for _, to := range p.To {
			o := Outcome{Probe: p, To: to, Answered: answered(i), SendErr: states[i].err}
			o.From, o.Delivered = l.rec.arrived(states[i].tok, l.placeOf(to).name)
			out = append(out, o)
		}
	}
	l.rec.forget(toks)
	return out
}

// send sends p from its sender's place with token tok (tag is its number, for SCTP's initiate
// tag and ICMP's identifier), calls sent once its first packet is on its way, and tells
// whether the sender got the answer (TCP and UDP; ICMP answers are recorded by the listeners).
func (l *Lab) send(ctx context.Context, p *Probe, tok string, tag uint32, sent func()) (bool, error) {
	src := l.placeOf(p.From)
	dst := p.Dst
	if dst.Is6() && (dst.IsLinkLocalUnicast() || dst.IsLinkLocalMulticast() || dst.IsInterfaceLocalMulticast()) {
		dst = dst.WithZone(strconv.Itoa(src.ifIndex))
	}
	// The other node's pods share the peer host: their probes leave from their own address.
	var bind netip.Addr
	if p.From.Role == RoleRemote {
		bind = p.Src
	}
	switch p.Proto {
	case TCP:
		return sendTCP(ctx, src, bind, netip.AddrPortFrom(dst, p.Port), tok, sent)
	case UDP:
		return sendUDP(ctx, src, bind, p, netip.AddrPortFrom(dst, p.Port), tok, sent)
	case ICMP:
		return false, sendRaw(src, bind, dst, icmpEcho(dst.Is6(), tok, tag), icmpNetwork(dst.Is6()), sent)
	case SCTP:
		return false, sendRaw(src, bind, dst, sctpInit(uint16(1024+tag%60000), p.Port, tag), sctpNetwork(dst.Is6()), sent)
	}
	return false, fmt.Errorf("unknown protocol %q", p.Proto)
}

func sendTCP(ctx context.Context, src *place, bind netip.Addr, dst netip.AddrPort, tok string, sent func()) (bool, error) {
	var c net.Conn
	err := src.ns.Do(func(ns.NetNS) error {
		var d net.Dialer
		if bind.IsValid() {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(bind, 0))
		}
		sent() // connect sends the SYN at once; the dial then waits for the answer
		var err error
		c, err = d.DialContext(ctx, "tcp", dst.String())
		return err
	})
	if err != nil {
		return false, fmt.Errorf("connect from %s to %s: %w", src.name, dst, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := fmt.Fprintf(c, "%s\n", tok); err != nil {
		return false, err
	}
	buf := make([]byte, 256)
	var reply []byte
	for !strings.Contains(string(reply), "\n") {
		n, err := c.Read(buf)
		if err != nil {
			return false, fmt.Errorf("read the answer of %s: %w", dst, err)
		}
		reply = append(reply, buf[:n]...)
	}
	return token(reply) == tok, nil
}

func sendUDP(ctx context.Context, src *place, bind netip.Addr, p *Probe, dst netip.AddrPort, tok string, sent func()) (bool, error) {
	network, laddr := "udp4", netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	if dst.Addr().Is6() {
		network, laddr = "udp6", netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
	}
	if bind.IsValid() {
		laddr = netip.AddrPortFrom(bind, 0)
	}
	var c *net.UDPConn
	err := src.ns.Do(func(ns.NetNS) error {
		var err error
		if c, err = net.ListenUDP(network, net.UDPAddrFromAddrPort(laddr)); err != nil {
			return err
		}
		return udpOptions(c, src, p)
	})
	if err != nil {
		return false, fmt.Errorf("UDP socket in %s: %w", src.name, err)
	}
	defer c.Close()
	payload := tok + " "
	if p.Frag {
		payload += strings.Repeat("f", fragSize)
	}
	if _, err := c.WriteToUDPAddrPort([]byte(payload), dst); err != nil {
		return false, fmt.Errorf("send from %s to %s: %w", src.name, dst, err)
	}
	sent()
	if p.Group {
		return false, nil
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return false, nil // no answer within the batch
			}
			return false, fmt.Errorf("read the answer of %s: %w", dst, err)
		}
		if token(buf[:n]) == tok {
			return true, nil
		}
	}
}

// udpOptions prepares a probe's socket: fragmentation allowed for a big IPv4 datagram (IPv6
// always fragments at the source), broadcast allowed, and group datagrams sent on the pods' link
// and not looped back to the sender.
func udpOptions(c *net.UDPConn, src *place, p *Probe) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	set := func(level, opt, v int) {
		if serr == nil {
			err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, v) })
			serr = errors.Join(serr, err)
		}
	}
	v4 := p.Dst.Is4()
	if p.Frag && v4 {
		set(unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
	}
	if !p.Group {
		return serr
	}
	if v4 {
		set(unix.SOL_SOCKET, unix.SO_BROADCAST, 1)
		set(unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, 0)
	} else {
		set(unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_LOOP, 0)
		set(unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, src.ifIndex)
	}
	if serr == nil {
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, src.ifName)
		})
		serr = errors.Join(serr, err)
	}
	return serr
}

func icmpNetwork(v6 bool) string {
	if v6 {
		return "ip6:ipv6-icmp"
	}
	return "ip4:icmp"
}

func sctpNetwork(v6 bool) string {
	if v6 {
		return "ip6:132"
	}
	return "ip4:132"
}

// sendRaw sends one packet of a raw protocol (ICMP, SCTP) from src, from bind if valid.
func sendRaw(src *place, bind, dst netip.Addr, packet []byte, network string, sent func()) error {
	laddr := anyAddr(network)
	if bind.IsValid() {
		laddr = bind.String()
	}
	var c net.PacketConn
	err := src.ns.Do(func(ns.NetNS) error {
		var err error
		c, err = net.ListenPacket(network, laddr)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s socket in %s: %w", network, src.name, err)
	}
	defer c.Close()
	if _, err := c.WriteTo(packet, &net.IPAddr{IP: dst.AsSlice(), Zone: dst.Zone()}); err != nil {
		return fmt.Errorf("send from %s to %s: %w", src.name, dst, err)
	}
	sent()
	return nil
}

// icmpEcho is an echo request carrying tok; the kernel fills in ICMPv6's checksum.
func icmpEcho(v6 bool, tok string, tag uint32) []byte {
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if v6 {
		typ = ipv6.ICMPTypeEchoRequest
	}
	m := icmp.Message{Type: typ, Body: &icmp.Echo{ID: int(tag & 0xffff), Seq: 1, Data: []byte(tok)}}
	b, _ := m.Marshal(nil) // cannot fail for an echo
	return b
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sctpInit is an SCTP packet with one INIT chunk whose initiate tag is tag (RFC 9260 3, 3.3.2),
// with its CRC32c checksum.
func sctpInit(srcPort, dstPort uint16, tag uint32) []byte {
	b := make([]byte, 12+20)
	binary.BigEndian.PutUint16(b[0:], srcPort)
	binary.BigEndian.PutUint16(b[2:], dstPort)
	// verification tag 0 (an INIT), checksum below
	b[12] = 1                                   // INIT
	binary.BigEndian.PutUint16(b[14:], 20)      // chunk length
	binary.BigEndian.PutUint32(b[16:], tag)     // initiate tag
	binary.BigEndian.PutUint32(b[20:], 1<<16)   // advertised receiver window
	binary.BigEndian.PutUint16(b[24:], 1)       // outbound streams
	binary.BigEndian.PutUint16(b[26:], 1)       // inbound streams
	binary.BigEndian.PutUint32(b[28:], tag^0x5) // initial TSN
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b, castagnoli))
	return b
}

// parseSCTPInit returns the initiate tag of an SCTP packet that starts with an INIT chunk.
func parseSCTPInit(b []byte) (uint32, bool) {
	if len(b) < 32 || b[12] != 1 {
		return 0, false
	}
	return binary.BigEndian.Uint32(b[16:]), true
}
