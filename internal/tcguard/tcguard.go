// Package tcguard puts a deny-by-default gate on one direction of a network device: a tc
// classifier (cls_bpf, direct action, under a clsact qdisc) that drops every frame whose packet
// mark lacks a given bit, ARP excepted. Something else (netfilter rules) grants a frame passage
// by setting the bit; the gate itself knows nothing of the grants.
//
// Why tc and not netfilter: the gate has to hold when every netfilter rule of the node is gone
// (`nft flush ruleset`, a firewall reload, a tool that deletes tables it does not own). tc
// filters live on the device and are not touched by any of that, and they run after netfilter on
// the way out of a device (egress) and before the IP stack on the way into one (ingress).
//
// Why a BPF program and not a mark classifier: the fw, basic and matchall classifiers and the
// gact action are optional kernel features a node may lack (this project's own CI kernel has
// none of them), cls_bpf is in every kernel that runs Kubernetes. The program is nine
// instructions, loaded with one bpf(2) call; a library that parses ELF objects would cost the CNI
// binary more at start than the whole load.
package tcguard

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Direction is the side of a device a gate stands on.
type Direction int

const (
	// Egress gates frames the device transmits (for a veth's host end: frames towards the pod).
	Egress Direction = iota
	// Ingress gates frames the device receives (for a bridge: frames its ports pass up to the
	// node).
	Ingress
)

func (d Direction) String() string {
	if d == Ingress {
		return "ingress"
	}
	return "egress"
}

// parent is the clsact hook of the direction.
func (d Direction) parent() uint32 {
	if d == Ingress {
		return netlink.HANDLE_MIN_INGRESS
	}
	return netlink.HANDLE_MIN_EGRESS
}

// Priority is the gate's filter priority on its hook. Other filters kubenet puts on the same
// hook (the shaper's redirect on a veth's ingress) use other hooks or priorities; a filter of
// another tool at a lower number runs first and may pass a frame the gate would drop, which
// Check cannot see: the gate is a guard against lost rules, not against root on the node.
const Priority = 1

// filterName is what the gate's filter is called in `tc filter show`.
func filterName(mark uint32) string { return fmt.Sprintf("kubenet-guard-%08x", mark) }

// program returns the gate's instructions: pass (TC_ACT_OK) when mark&bit != 0 or the frame is
// ARP, drop (TC_ACT_SHOT) otherwise.
func program(bit uint32) []byte {
	const (
		markOff     = 8  // offsetof(struct __sk_buff, mark)
		protocolOff = 16 // offsetof(struct __sk_buff, protocol): the ether type, network order
		actOK       = 0
		actShot     = 2
	)
	arp := int32(htons(unix.ETH_P_ARP))
	var p []byte
	for _, in := range []insn{
		{unix.BPF_LDX | unix.BPF_MEM | unix.BPF_W, 0, 1, markOff, 0},      // r0 = skb->mark
		{unix.BPF_ALU64 | unix.BPF_AND | unix.BPF_K, 0, 0, 0, int32(bit)}, // r0 &= bit
		{unix.BPF_JMP | unix.BPF_JNE | unix.BPF_K, 0, 0, 4, 0},            // if r0 != 0 goto pass
		{unix.BPF_LDX | unix.BPF_MEM | unix.BPF_W, 0, 1, protocolOff, 0},  // r0 = skb->protocol
		{unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, 0, 0, 2, arp},          // if r0 == ARP goto pass
		{unix.BPF_ALU64 | unix.BPF_MOV | unix.BPF_K, 0, 0, 0, actShot},    // r0 = TC_ACT_SHOT
		{unix.BPF_JMP | unix.BPF_EXIT, 0, 0, 0, 0},                        // return
		{unix.BPF_ALU64 | unix.BPF_MOV | unix.BPF_K, 0, 0, 0, actOK},      // pass: r0 = TC_ACT_OK
		{unix.BPF_JMP | unix.BPF_EXIT, 0, 0, 0, 0},                        // return
	} {
		p = append(p, in.encode()...)
	}
	return p
}

type insn struct {
	code     uint16
	dst, src uint8
	off      int16
	imm      int32
}

func (i insn) encode() []byte {
	b := make([]byte, 8)
	b[0] = uint8(i.code)
	b[1] = i.dst | i.src<<4
	binary.LittleEndian.PutUint16(b[2:], uint16(i.off))
	binary.LittleEndian.PutUint32(b[4:], uint32(i.imm))
	return b
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Tags are the tags a kernel may give the gate's program for bit, as `tc filter show` and the
// filter's netlink attributes report them: the first eight bytes of a digest of its
// instructions (kernel/bpf/core.c, bpf_prog_calc_tag; the program has no map references to
// blank) — SHA-256 on current kernels, SHA-1 before.
func Tags(bit uint32) []string {
	p := program(bit)
	s256, s1 := sha256.Sum256(p), sha1.Sum(p)
	return []string{hex.EncodeToString(s256[:8]), hex.EncodeToString(s1[:8])}
}

// load loads the gate's program and returns its file descriptor.
func load(bit uint32) (int, error) {
	insns := program(bit)
	license := []byte("GPL\x00")
	// union bpf_attr, BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level, log_size,
	// log_buf, kern_version, prog_flags, prog_name[16].
	attr := make([]byte, 64)
	binary.NativeEndian.PutUint32(attr[0:], unix.BPF_PROG_TYPE_SCHED_CLS)
	binary.NativeEndian.PutUint32(attr[4:], uint32(len(insns)/8))
	binary.NativeEndian.PutUint64(attr[8:], uint64(uintptr(unsafe.Pointer(&insns[0]))))
	binary.NativeEndian.PutUint64(attr[16:], uint64(uintptr(unsafe.Pointer(&license[0]))))
	copy(attr[48:63], "kubenet_guard")
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
	runtime.KeepAlive(insns)
	runtime.KeepAlive(license)
	if errno != 0 {
		return -1, fmt.Errorf("load the guard program: bpf: %w", errno)
	}
	return int(fd), nil
}

// Ensure puts the gate for bit on dir of the device with index link: a clsact qdisc (added if
// missing; an existing one is shared with other filters) and the gate's filter, replacing any
// filter at the gate's priority. It is idempotent: an existing, correct gate is left as it is.
func Ensure(link int, dir Direction, bit uint32) error {
	if err := Check(link, dir, bit); err == nil {
		return nil
	}
	if err := EnsureClsact(link); err != nil {
		return err
	}
	// A filter of another kind at the gate's priority cannot be replaced in place. The gate
	// itself stays: another writer (ADD and the agent's pass guard a new port at the same time)
	// may have put it there since Check, and removing it would leave the port open meanwhile.
	want := Tags(bit)
	if err := removeAt(link, dir, func(f netlink.Filter) bool { return !isGate(f, want) }); err != nil {
		return err
	}
	fd, err := load(bit)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	f := &netlink.BpfFilter{
		FilterAttrs:  netlink.FilterAttrs{LinkIndex: link, Parent: dir.parent(), Priority: Priority, Protocol: unix.ETH_P_ALL, Handle: 1},
		Fd:           fd,
		Name:         filterName(bit),
		DirectAction: true,
	}
	if err := netlink.FilterAdd(f); err != nil {
		// The other writer's gate is the same gate.
		if errors.Is(err, unix.EEXIST) && Check(link, dir, bit) == nil {
			return nil
		}
		return fmt.Errorf("guard on %s of link %d: %w", dir, link, err)
	}
	return nil
}

// EnsureClsact adds a clsact qdisc to link unless it has one: the gate and the shaper's redirect
// share it. Another kind of qdisc at the ingress handle (an ingress qdisc of an older kubenet's
// shaper, or another tool's) is refused, not replaced: its filters are not ours.
func EnsureClsact(link int) error {
	err := netlink.QdiscAdd(Clsact(link))
	if err == nil || !errors.Is(err, unix.EEXIST) {
		if err != nil {
			return fmt.Errorf("clsact qdisc on link %d: %w", link, err)
		}
		return nil
	}
	has, err := HasClsact(link)
	if err != nil {
		return err
	}
	if !has {
		return fmt.Errorf("clsact qdisc on link %d: another qdisc holds its ingress handle (ffff:)", link)
	}
	return nil
}

// Clsact is the clsact qdisc of link, for adding.
func Clsact(link int) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
}

// HasClsact tells whether link has a clsact qdisc.
func HasClsact(link int) (bool, error) {
	l := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: link}}
	qs, err := netlinksafe.QdiscList(l)
	if err != nil {
		return false, fmt.Errorf("qdiscs of link %d: %w", link, err)
	}
	for _, q := range qs {
		if q.Type() == "clsact" {
			return true, nil
		}
	}
	return false, nil
}

// ErrMissing is Check's error when the gate is not there (or not as Ensure puts it).
var ErrMissing = errors.New("no guard")

// Check tells whether the gate for bit stands on dir of link: the gate's filter at its priority,
// a BPF program in direct-action mode with the gate's tag.
func Check(link int, dir Direction, bit uint32) error {
	l := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: link}}
	fs, err := netlinksafe.FilterList(l, dir.parent())
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%s of link %d: %w (no clsact qdisc)", dir, link, ErrMissing)
		}
		return fmt.Errorf("filters on %s of link %d: %w", dir, link, err)
	}
	want := Tags(bit)
	for _, f := range fs {
		b, ok := f.(*netlink.BpfFilter)
		if !ok || b.Attrs().Priority != Priority {
			continue
		}
		if isGate(b, want) {
			return nil
		}
		return fmt.Errorf("%s of link %d: %w: the filter at priority %d is %q (tag %s), not the guard (tag %s)", dir, link, ErrMissing, Priority, b.Name, b.Tag, want[0])
	}
	return fmt.Errorf("%s of link %d: %w", dir, link, ErrMissing)
}

// isGate tells whether f is a gate whose program has one of the tags want.
func isGate(f netlink.Filter, want []string) bool {
	b, ok := f.(*netlink.BpfFilter)
	return ok && b.DirectAction && slices.Contains(want, b.Tag) && b.Attrs().Protocol == unix.ETH_P_ALL
}

// Remove deletes the gate's filter from dir of link; a missing gate or qdisc is fine. The clsact
// qdisc stays (other filters may use it).
func Remove(link int, dir Direction) error {
	return removeAt(link, dir, func(f netlink.Filter) bool { _, ok := f.(*netlink.BpfFilter); return ok })
}

// removeAt deletes the filters at the gate's priority on dir of link that doomed picks.
func removeAt(link int, dir Direction, doomed func(netlink.Filter) bool) error {
	l := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: link}}
	fs, err := netlinksafe.FilterList(l, dir.parent())
	if err != nil {
		return nil // no clsact: no gate
	}
	for _, f := range fs {
		if f.Attrs().Priority != Priority || !doomed(f) {
			continue
		}
		if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove the filter at priority %d from %s of link %d: %w", Priority, dir, link, err)
		}
	}
	return nil
}
