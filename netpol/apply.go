package netpol

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/conntrack"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// Bounds of one netlink message and of one transaction. A set element list is one netlink
// attribute, whose length is 16 bits: 512 elements of the biggest kind (an IPv6 ports element,
// about 80 bytes on the wire) stay well below it. A transaction is one send, which must fit the
// socket's send buffer (about 200 KiB by default): a thousand elements do. The kernel holds the
// network namespace's nftables mutex while it commits a transaction, and adding an element to an
// interval set costs more the bigger the set is: so a group bigger than a transaction is built
// over several, and the writer makes them smaller when one takes longer than transactionTarget,
// so that a big group never holds the mutex long for anybody else (an ADD) who needs it.
const (
	maxElementsPerMessage     = 512
	maxElementsPerTransaction = 1024
	minElementsPerTransaction = 64
	transactionTarget         = 25 * time.Millisecond
)

// Options tune one Apply.
type Options struct {
	// Verify reads back the elements of every group set in use and rewrites the sets that
	// differ (the agent's periodic and repair passes). Without it a group whose chain holds its
	// planned rules and whose sets exist is trusted.
	Verify bool
	// Log is whether and how the drop chains log what they drop (off: no log action in the
	// rules). Rules follow it at every Apply.
	Log policyrules.DropLog
	// transactionElements, when set, caps the set elements of one transaction instead of
	// maxElementsPerTransaction (tests).
	transactionElements int
	// crashAfter, when set, ends the pass as a SIGKILL would right after its crashAfter-th
	// transaction is committed: the writer panics with simulatedCrash (tests).
	crashAfter int
	// aroundCommit, when set, is called right before each transaction is sent (false) and right
	// after the kernel answered (true), before the writer looks at the generation: another tool
	// committing there (tests).
	aroundCommit func(after bool)
}

// simulatedCrash is the panic of Options.crashAfter.
type simulatedCrash struct{}

// Applier applies rulesets one after another (the agent's passes) and keeps, from one pass to
// the next, the canonical form and name of every allow list the last pass had: a pass whose
// lists barely changed computes only the new ones, and a group edited in place is diffed against
// the list its name stands for. An Applier serves one network, one pass at a time.
type Applier struct {
	mu   sync.Mutex
	memo *groupMemo
	// conn is the Applier's one netlink socket, kept open from pass to pass in the network
	// namespace connNS (a lasting google/nftables connection), nil before the first pass and
	// after a failed one. The kernel makes the close of a netfilter netlink socket wait for the
	// release of whatever the namespace's last transactions removed (a grace period, 7–20 ms),
	// and a pass that opened a socket per request paid that several times over; one socket also
	// keeps one port id for Committed.
	conn   *nftables.Conn
	connNS netnsID
	// gens reads the namespace's nftables generation (opened and closed with conn); rules is
	// what the last pass left in the policy tables' chains, trusted while the generation is the
	// one its last commit left (nil: read them).
	gens  *nft.Generations
	rules *ruleCache
	// current is the port id of conn's socket; sockets the ids of those it had before, each for
	// ownWindow after it was closed (Committed). Both are written under mu only.
	current atomic.Uint32
	sockets portLog
	opening bool // socket is opening the lasting socket (opened); under mu
}

// netnsID tells network namespaces apart (the device and inode of their nsfs file): a socket of
// the Applier keeps its namespace alive, so no other namespace gets its inode meanwhile.
type netnsID struct{ dev, ino uint64 }

func currentNetNS() (netnsID, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return netnsID{}, fmt.Errorf("policy rules: network namespace: %w", err)
	}
	return netnsID{dev: st.Dev, ino: st.Ino}, nil
}

// socket returns the Applier's socket in the calling thread's network namespace, opened if it
// has none there.
func (a *Applier) socket() (*nftables.Conn, error) {
	ns, err := currentNetNS()
	if err != nil {
		return nil, err
	}
	if a.conn != nil && a.connNS == ns {
		return a.conn, nil
	}
	a.closeSocket()
	// Removing, building or editing a hundred groups is a transaction of hundreds of messages,
	// sent as one datagram and each acknowledged before any acknowledgement is read.
	a.opening = true
	c, err := nftables.New(nftables.AsLasting(), nftables.WithSockOptions(nft.ReceiveBuffer(nft.BatchReceiveBuffer), nft.SendBuffer(nft.BatchSendBuffer), nft.PortID(a.opened)))
	a.opening = false
	if err != nil {
		return nil, fmt.Errorf("policy rules: netlink: %w", err)
	}
	gens, err := nft.OpenGenerations()
	if err != nil {
		_ = c.CloseLasting()
		return nil, fmt.Errorf("policy rules: %w", err)
	}
	a.conn, a.connNS, a.gens = c, ns, gens
	return c, nil
}

// opened notes the port id of a socket the Applier opened: the lasting one, which is its own
// while open, or a socket of one request through a connection whose lasting socket is closed
// (google/nftables opens one per request then; a pass whose reopen failed goes on that way),
// closed right after the request, so known for ownWindow only: the kernel gives its id to the
// next socket that asks.
func (a *Applier) opened(id uint32) {
	if !a.opening {
		a.sockets.add(id)
		return
	}
	a.replaceCurrent(id)
}

// replaceCurrent makes id the current port id, the old one logged before it stops being
// current: a watcher asking about the notification of the old socket's last transaction
// meanwhile (Committed) finds it as one or the other.
func (a *Applier) replaceCurrent(id uint32) {
	if old := a.current.Load(); old != 0 && old != id {
		a.sockets.add(old)
	}
	a.current.Store(id)
}

// closeSocket closes the Applier's socket, if any: after a failed pass (whatever the kernel
// still had to say on it must not be read as the answer to the next request), when the calling
// thread is in another network namespace, and by Close.
func (a *Applier) closeSocket() {
	if a.conn == nil {
		return
	}
	_ = a.conn.CloseLasting() // nothing of a closed socket is read again
	_ = a.gens.Close()
	a.conn, a.gens, a.rules = nil, nil, nil
	a.replaceCurrent(0)
}

// reopen closes the Applier's socket and opens another.
func (a *Applier) reopen() (*nftables.Conn, error) {
	a.closeSocket()
	return a.socket()
}

// Close closes the Applier's socket. An Applier may apply again after Close: it opens another.
func (a *Applier) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closeSocket()
}

// ownWindow is how long Committed knows a socket's port id after the socket was closed: the
// notification of what it committed arrives soon after; a port id given to another socket later
// (the kernel reuses those of closed sockets) must not be taken for this Applier's for long.
const ownWindow = 10 * time.Second

// portLog remembers port ids for ownWindow. Safe for concurrent use (a watcher asks while a pass
// runs).
type portLog struct {
	mu   sync.Mutex
	seen map[uint32]time.Time
}

func (l *portLog) add(id uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.seen == nil {
		l.seen = map[uint32]time.Time{}
	}
	maps.DeleteFunc(l.seen, func(_ uint32, t time.Time) bool { return now.Sub(t) > ownWindow })
	l.seen[id] = now
}

func (l *portLog) has(id uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.seen[id]
	return ok && time.Since(t) <= ownWindow
}

// Committed tells whether a transaction the kernel announces as committed through netlink port
// portid (the header of its generation message) was one of this Applier's: through its open
// socket, or one it closed lately (ownWindow). An agent watching the tables for other tools'
// changes leaves its own passes alone by it, whatever PID namespace it runs in.
func (a *Applier) Committed(portid uint32) bool {
	return portid != 0 && (portid == a.current.Load() || a.sockets.has(portid))
}

// NewApplier returns an Applier that knows no allow list yet.
func NewApplier() *Applier { return &Applier{memo: newGroupMemo()} }

// Apply is a one-off Applier's Apply (tools, tests).
func Apply(network string, rs policyrules.Ruleset, opt Options) (policyrules.Applied, error) {
	a := NewApplier()
	defer a.Close()
	return a.Apply(network, rs, opt)
}

// Apply makes the network's policy tables hold rs: the fixed chains, maps and sets, a group
// (chain and sets) for every distinct allow list, map elements for every port of rs and none for
// any other port. A new list whose every port comes from one group that nobody else uses takes
// that group's sets over (inPlaceEdits): the elements the new list lacks go, the new ones come,
// and the new chain, the ports' map elements and the old chain's removal follow in the same
// transaction. Other new groups are built first, the cheapest first, over as many transactions
// as their elements need, while nothing refers to them; then the map elements switch in one
// transaction, so no packet sees half a change; then the groups nobody uses any more go.
// Conntrack's entries of a pod's addresses are removed just before its port gets its first
// elements. Apply takes no lock: ADD and DEL never write into the tables (a new pod is held by
// its guard until it has elements).
//
// An allow list over a limit, or whose group the kernel refuses, is left out (Applied.Refused)
// and everything else is applied: one policy cannot keep the node's other pods from theirs.
//
// The steps, in order: readState; plan (pure); inPlaceEdits; buildGroups; portChains and
// releasedPods (pure) with the conntrack flush; switchPorts (with the edits); removeUnused.
func (a *Applier) Apply(network string, rs policyrules.Ruleset, opt Options) (policyrules.Applied, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var res policyrules.Applied
	if opt.Log.Group != 0 && opt.Log.Rate == 0 {
		return res, fmt.Errorf("policy drop log of network %q: group %d with a rate of 0 packets/s", network, opt.Log.Group)
	}
	c, err := a.socket()
	if err != nil {
		return res, err
	}
	res, err = a.apply(c, network, rs, opt)
	if err != nil {
		a.closeSocket()
	}
	return res, err
}

// apply is Apply through c.
func (a *Applier) apply(c *nftables.Conn, network string, rs policyrules.Ruleset, opt Options) (policyrules.Applied, error) {
	var res policyrules.Applied
	bt, it := BridgeTable(network), InetTable(network)
	known := a.rules
	a.rules = nil // until this pass ends well
	trail, cur, err := readTrusted(c, a.gens, bt, opt.Verify, known)
	if err != nil {
		return res, err
	}
	want := plan(rs, a.memo)
	defer a.memo.sweep() // after the edits, which look the last pass's groups up
	w := newWriter(c, &res, network, opt)
	w.reopen = a.reopen
	w.trail = trail
	free := newSlots(cur.sets)

	// Groups: edit in place what can be, build the other missing ones, repair the damaged ones.
	edits, err := w.inPlaceEdits(bt, want, cur, portChains(want, cur.maps), a.memo.named)
	if err != nil {
		return res, err
	}
	assignStems(want, cur, edits, free)
	refused, err := w.buildGroups(bt, want, cur, opt.Verify, free, func(name string) bool { return edits[name] == nil })
	if err != nil {
		return res, err
	}
	if len(refused) > 0 && len(edits) > 0 {
		// A refused list keeps its ports where they are, which may be a donor: the edits were
		// chosen for the plan without refusals. Their groups are built instead.
		if err := w.abandonEdits(bt, want, cur, opt.Verify, edits, free, refused); err != nil {
			return res, err
		}
		edits = nil
	}
	for _, name := range slices.Sorted(maps.Keys(refused)) {
		want.refuse(name, refused[name])
	}
	final := portChains(want, cur.maps)
	res.Groups, res.Refused = len(want.groups), want.refused
	res.Dispatch = dispatchOf(final)
	released := releasedPods(rs.Pods, cur.maps, final)
	res.Released = len(released)
	if res.Conntrack, err = flushConntrack(podAddrs(released)); err != nil {
		return res, fmt.Errorf("policy: flows of new pods: %w", err)
	}
	mapChanges := res.MapChanges
	err = w.switchPorts(bt, it, cur, rs, want, final, edits)
	if err != nil && len(edits) > 0 {
		// Nothing of the refused transaction happened: build the edited groups anew, and switch.
		res.MapChanges = mapChanges
		again := map[string]error{}
		if err := w.abandonEdits(bt, want, cur, opt.Verify, edits, free, again); err != nil {
			return res, err
		}
		edits = nil
		for _, name := range slices.Sorted(maps.Keys(again)) {
			want.refuse(name, again[name])
			refused[name] = again[name]
		}
		res.Groups, res.Refused = len(want.groups), want.refused
		final = portChains(want, cur.maps)
		res.Dispatch = dispatchOf(final)
		err = w.switchPorts(bt, it, cur, rs, want, final, nil)
	}
	if err != nil {
		return res, err
	}
	res.EditedGroups = len(edits)
	err = w.removeUnused(bt, cur, want, final, edits, len(refused) > 0) // counts into res: called before res is read
	if err == nil {
		a.rules = w.trail.left()
	}
	return res, err
}

// abandonEdits builds the groups of edits anew, in slots of their own, as buildGroups builds any
// missing group: after a refusal changed the plan, or the kernel refused the transaction that
// held the edits. The kernel's refusals of them go into refused.
func (w *writer) abandonEdits(bt *nftables.Table, want desired, cur state, verify bool, edits map[string]*inPlaceEdit, free *slots, refused map[string]error) error {
	w.dirty, w.queued = false, 0
	for _, name := range slices.Sorted(maps.Keys(edits)) {
		g := want.groups[name]
		g.stem = free.next()
		want.groups[name] = g
	}
	again, err := w.buildGroups(bt, want, cur, verify, free, func(name string) bool { return edits[name] != nil })
	maps.Copy(refused, again)
	return err
}

// portChains is what every port gets in each dispatch map: its planned chain, or, where its list
// was refused, the group chain it has (none when it had only an allow chain: a pod that was not
// isolated is denied, never left open). Pure.
func portChains(want desired, have map[string]map[int]string) map[string]map[int]string {
	final := map[string]map[int]string{}
	for _, m := range []string{MapEgress, MapIngress} {
		final[m] = maps.Clone(want.maps[m])
		for port := range want.keep[m] {
			if chain, ok := have[m][port]; ok && chain != ChainAllowEgress && chain != ChainAllowIngress {
				final[m][port] = chain
			}
		}
	}
	return final
}

// dispatchOf turns the map name → port → chain form into the per-port one. Pure.
func dispatchOf(chains map[string]map[int]string) map[int]policyrules.Dispatch {
	out := map[int]policyrules.Dispatch{}
	for port, chain := range chains[MapEgress] {
		d := out[port]
		d.Egress = chain
		out[port] = d
	}
	for port, chain := range chains[MapIngress] {
		d := out[port]
		d.Ingress = chain
		out[port] = d
	}
	return out
}

// releasedPods are the pods whose ports had no element in either map and get one now: their
// policies come into force with this Apply. Pure.
func releasedPods(pods []policyrules.Pod, have, final map[string]map[int]string) []policyrules.Pod {
	var out []policyrules.Pod
	for _, p := range pods {
		_, e := have[MapEgress][p.Port]
		_, i := have[MapIngress][p.Port]
		_, fe := final[MapEgress][p.Port]
		_, fi := final[MapIngress][p.Port]
		if !e && !i && (fe || fi) {
			out = append(out, p)
		}
	}
	return out
}

// podAddrs are the addresses of pods.
func podAddrs(pods []policyrules.Pod) []netip.Addr {
	var out []netip.Addr
	for _, p := range pods {
		out = append(out, p.IPs...)
	}
	return out
}

// switchPorts writes the fixed objects, edits the sets of the groups edited in place and adds
// their chains, switches every port to its final chain and every source element to its planned
// state, and deletes the edits' donor chains, in one transaction: no packet sees half a change.
func (w *writer) switchPorts(bt, it *nftables.Table, cur state, rs policyrules.Ruleset, want desired, final map[string]map[int]string, edits map[string]*inPlaceEdit) error {
	fixed, err := w.writeFixed(bt, it, cur, rs)
	if err != nil {
		return err
	}
	w.res.FixedWritten = fixed
	for _, name := range slices.Sorted(maps.Keys(edits)) {
		if err := w.queueEdit(bt, name, want.groups[name], edits[name]); err != nil {
			return err
		}
	}
	for _, m := range []string{MapEgress, MapIngress} {
		set := &nftables.Set{Table: bt, Name: m, IsMap: true, KeyType: nftables.TypeIFIndex, DataType: nftables.TypeVerdict}
		del, add := mapDiff(cur.maps[m], final[m])
		if err := w.replaceElements(set, del, add); err != nil {
			return err
		}
	}
	for _, is6 := range []bool{false, true} {
		set := sourcesSet(bt, is6)
		del, add := elementsDiff(cur.sources[set.Name], want.sources[set.Name])
		if err := w.replaceElements(set, del, add); err != nil {
			return err
		}
	}
	names := make(map[int]string, len(rs.Pods))
	for _, p := range rs.Pods {
		names[p.Port] = p.Name
	}
	for _, dir := range []string{egressDir, ingressDir} {
		set := dropsSet(bt, dir)
		del, add := dropsDiff(cur.drops[set.Name], dropsElements(final[mapOf(dir)], names))
		if err := w.replaceElements(set, del, add); err != nil {
			return err
		}
	}
	// The donors last: the kernel refuses to delete a chain a map element still names, and a
	// set a rule still looks up.
	for _, name := range slices.Sorted(maps.Keys(edits)) {
		e := edits[name]
		w.delChain(&nftables.Chain{Table: bt, Name: e.donor})
		for _, se := range e.sets {
			if se.remove {
				w.c.DelSet(se.set)
			}
		}
	}
	return w.flush("policy switch")
}

// dropsElements are the drop counters of the ports whose chain in a dispatch map is a group
// (only a group drops), named after their pods. Pure.
func dropsElements(chains map[int]string, names map[int]string) []nftables.SetElement {
	var out []nftables.SetElement
	for _, port := range slices.Sorted(maps.Keys(chains)) {
		switch c := chains[port]; {
		case c == ChainAllowEgress || c == ChainAllowIngress:
		case isAuditGroup(c):
			out = append(out, dropsElement(port, auditComment+names[port]))
		default:
			out = append(out, dropsElement(port, names[port]))
		}
	}
	return out
}

// dropsDiff returns the counters to delete (a port that goes, or whose pod is another: its
// count starts again) and to add. Pure.
func dropsDiff(have, want []nftables.SetElement) (del, add []nftables.SetElement) {
	return diffBy(have, want, func(e nftables.SetElement) string { return string(e.Key) + "\x00" + e.Comment })
}

// diffBy returns the elements of have that want lacks (their key and key end: what deletes
// them) and those of want that have lacks, an element being what id says. Pure.
func diffBy[K comparable](have, want []nftables.SetElement, id func(nftables.SetElement) K) (del, add []nftables.SetElement) {
	wantIDs := make(map[K]bool, len(want))
	for _, e := range want {
		wantIDs[id(e)] = true
	}
	haveIDs := make(map[K]bool, len(have))
	for _, e := range have {
		haveIDs[id(e)] = true
		if !wantIDs[id(e)] {
			del = append(del, nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd})
		}
	}
	for _, e := range want {
		if !haveIDs[id(e)] {
			add = append(add, e)
		}
	}
	return del, add
}

// replaceElements queues the deletion of del and the addition of add in set, and counts them.
func (w *writer) replaceElements(set *nftables.Set, del, add []nftables.SetElement) error {
	w.res.MapChanges += len(add) + len(del)
	if len(add)+len(del) > 0 {
		w.dirty = true
	}
	if err := deleteElements(w.c, set, del); err != nil {
		return err
	}
	return addElements(w.c, set, add)
}

// mapDiff returns the elements of a dispatch map to delete (a port that goes or changes chain)
// and to add (a port that comes or changes chain) to turn have into want. Pure.
func mapDiff(have, want map[int]string) (del, add []nftables.SetElement) {
	for _, port := range slices.Sorted(maps.Keys(have)) {
		if chain, ok := want[port]; !ok || chain != have[port] {
			del = append(del, nftables.SetElement{Key: portKey(port)})
		}
	}
	for _, port := range slices.Sorted(maps.Keys(want)) {
		if chain, ok := have[port]; !ok || chain != want[port] {
			add = append(add, nftables.SetElement{Key: portKey(port), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: want[port]}})
		}
	}
	return del, add
}

// removeUnused deletes the groups nobody refers to any more: their chains, and the group sets
// no chain of final looks up. The kernel refuses to delete a chain that a map element still
// names, so this is a transaction of its own after the switch. A refused group may have left
// sets behind (a big one is built over several transactions): with rereadSets the sets are read
// again.
func (w *writer) removeUnused(bt *nftables.Table, cur state, want desired, final map[string]map[int]string, edits map[string]*inPlaceEdit, rereadSets bool) error {
	sets := cur.sets
	if rereadSets {
		var err error
		if sets, err = setNames(w.c, bt); err != nil {
			return err
		}
	}
	chains, sets := unusedGroups(final, cur, want, edits, sets)
	for _, name := range chains {
		w.delChain(&nftables.Chain{Table: bt, Name: name})
	}
	for _, s := range sets {
		w.c.DelSet(&nftables.Set{Table: bt, Name: s})
		w.dirty = true
	}
	w.res.RemovedGroups += len(chains)
	return w.flush("remove unused policy groups")
}

// unusedGroups returns the group chains, sorted, that no port of final refers to, and the group
// sets that no chain of final looks up (a planned group's: its planned sets; a chain kept for a
// refused list: its slot's and whatever its rules look up), but those the edits already deleted.
// Pure.
func unusedGroups(final map[string]map[int]string, cur state, want desired, edits map[string]*inPlaceEdit, sets []string) (unusedChains, unusedSets []string) {
	used := map[string]bool{}
	for _, m := range final {
		for _, chain := range m {
			used[chain] = true
		}
	}
	gone := map[string]bool{}
	for _, e := range edits {
		gone[e.donor] = true
		for _, se := range e.sets {
			if se.remove {
				gone[se.set.Name] = true
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cur.groupChains)) {
		if !used[name] && !gone[name] {
			unusedChains = append(unusedChains, name)
		}
	}
	usedSets, usedStems := map[string]bool{}, map[string]bool{}
	for chain := range used {
		if g, ok := want.groups[chain]; ok {
			for _, s := range groupSets(nil, g.stem, g.group, false) {
				usedSets[s.set.Name] = true
			}
		} else {
			// A kept chain's: its slot, and whatever else its rules look up (a chain another
			// tool rewrote may look up another slot's set, which the kernel will not delete).
			for _, s := range cur.groupLookups[chain] {
				usedSets[s] = true
			}
			if stem := cur.groupStems[chain]; stem != "" {
				usedStems[stem] = true
			}
		}
	}
	for _, s := range sets {
		stem, ok := setStem(s)
		if ok && !usedSets[s] && !usedStems[stem] && !gone[s] {
			unusedSets = append(unusedSets, s)
		}
	}
	return unusedChains, unusedSets
}

// writer queues changes on one connection and counts the transactions it sends.
type writer struct {
	c *nftables.Conn
	// reopen, when set, replaces c after the kernel refused a transaction: what it still had to
	// say about the refused batch is not read as the answer to the next request.
	reopen            func() (*nftables.Conn, error)
	res               *policyrules.Applied
	network           string
	log               policyrules.DropLog
	maxPerTransaction int
	crashAfter        int
	aroundCommit      func(after bool)
	perTransaction    int // set elements the next transaction may carry
	queued            int // set elements queued since the last flush
	dirty             bool
	// trail follows the chains' rules through the pass's commits (nil: not followed).
	trail *ruleTrail
}

func newWriter(c *nftables.Conn, res *policyrules.Applied, network string, opt Options) *writer {
	w := &writer{c: c, res: res, network: network, log: opt.Log, maxPerTransaction: maxElementsPerTransaction, crashAfter: opt.crashAfter, aroundCommit: opt.aroundCommit}
	if opt.transactionElements > 0 {
		w.maxPerTransaction = opt.transactionElements
	}
	w.perTransaction = w.maxPerTransaction
	return w
}

// around calls Options.aroundCommit, if set.
func (w *writer) around(after bool) {
	if w.aroundCommit != nil {
		w.aroundCommit(after)
	}
}

// flush sends what is queued as one transaction, and adapts how many set elements the next one
// may carry to how long the kernel took.
func (w *writer) flush(what string) error {
	if !w.dirty {
		return nil
	}
	queued := w.queued
	w.dirty, w.queued = false, 0
	w.res.Transactions++
	w.around(false)
	w.trail.beforeCommit()
	start := time.Now()
	err := w.c.Flush()
	took := time.Since(start)
	w.res.LongestTransaction = max(w.res.LongestTransaction, took)
	w.around(true)
	w.trail.afterCommit(err == nil)
	if err != nil {
		err = fmt.Errorf("%s of network %q: %w", what, w.network, err)
		if w.reopen != nil {
			c, rerr := w.reopen()
			if rerr != nil {
				return errors.Join(err, rerr)
			}
			w.c = c
		}
		return err
	}
	if w.crashAfter > 0 && w.res.Transactions >= w.crashAfter {
		panic(simulatedCrash{})
	}
	if queued >= w.perTransaction/2 {
		// As many elements as the kernel took in transactionTarget, growing at most twofold.
		rate := float64(queued) / max(took.Seconds(), 1e-6)
		w.perTransaction = int(min(rate*transactionTarget.Seconds(), 2*float64(w.perTransaction)))
		w.perTransaction = min(max(w.perTransaction, minElementsPerTransaction), w.maxPerTransaction)
	}
	return nil
}

// buildGroups creates the groups of want that are missing and rewrites those that differ from
// their plan, the cheapest first, and returns those the kernel refused. Small groups share
// transactions; a group with more elements than a transaction carries is built alone, over as
// many as it needs, while nothing refers to it. When the kernel refuses a transaction of several
// groups (nothing of it happened), each is sent again alone: only the group it refuses alone is
// refused. The error is for what is no group's doing (a set that cannot be encoded).
//
// A group whose sets differ from its list is built again in a new slot (free), its chain switched
// there in the build's last transaction, rather than rewritten in the sets it had: another tool
// may have made them anew with properties the kernel refuses to redefine (a hash set of the same
// name, a size limit), and its pods never see a set half rewritten.
//
// only, when not nil, says which groups to look at (the others are edited in place, or done).
func (w *writer) buildGroups(bt *nftables.Table, want desired, cur state, verify bool, free *slots, only func(string) bool) (map[string]error, error) {
	refused := map[string]error{}
	type queued struct {
		name  string
		state groupState
	}
	var batch []queued
	sendBatch := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := w.flush("policy groups")
		if err != nil && len(batch) == 1 {
			refused[batch[0].name] = err
		} else if err != nil {
			for _, q := range batch {
				if err := w.writeGroup(bt, q.name, want.groups[q.name], q.state, cur, false); err != nil {
					return err
				}
				if err := w.flush("policy group " + q.name); err != nil {
					refused[q.name] = err
				}
			}
		}
		batch = batch[:0]
		return nil
	}
	written := map[string]groupState{}
	for _, name := range want.byCost() {
		if only != nil && !only(name) {
			continue
		}
		g := want.groups[name]
		st := cur.groupState(name, g, verify)
		if st == groupOK {
			continue
		}
		if st == groupSetsDiffer && g.stem == cur.groupStems[name] {
			g.stem = free.next()
			want.groups[name] = g
		}
		written[name] = st
		n := g.group.elements()
		if st == groupRulesDiffer {
			n = 0 // the chain alone
		}
		if w.queued+n > w.perTransaction {
			if err := sendBatch(); err != nil {
				return nil, err
			}
		}
		if n <= w.perTransaction {
			if err := w.writeGroup(bt, name, g, st, cur, false); err != nil {
				return nil, err
			}
			batch = append(batch, queued{name, st})
			continue
		}
		err := w.writeGroup(bt, name, g, st, cur, true)
		if err == nil {
			err = w.flush("policy group " + name)
		} else if !errors.As(err, new(sendError)) {
			return nil, err
		}
		if err != nil {
			refused[name] = err
		}
	}
	if err := sendBatch(); err != nil {
		return nil, err
	}
	for name, st := range written {
		switch _, no := refused[name]; {
		case no:
		case st == groupMissing:
			w.res.NewGroups++
		default:
			w.res.RepairedGroups++
		}
	}
	return refused, nil
}

// sendError is the kernel's refusal of a transaction, as opposed to a change that could not be
// queued.
type sendError struct{ err error }

func (e sendError) Error() string { return e.err.Error() }
func (e sendError) Unwrap() error { return e.err }

// writeGroup queues one group: its sets (emptied first should they exist, so that a rewrite
// never keeps a stale element; buildGroups gives a group whose sets differ a new slot) and then
// its chain, whose rules refer to them. A group whose sets are as planned and whose rules differ
// (a flushed table) only gets its rules back. With split, it sends a transaction whenever one
// holds enough elements (a group bigger than one transaction: nothing refers to its sets yet);
// such a refusal comes back as a sendError.
func (w *writer) writeGroup(bt *nftables.Table, name string, g plannedGroup, st groupState, cur state, split bool) error {
	w.begin(bt)
	if st != groupRulesDiffer {
		for _, s := range groupSets(bt, g.stem, g.group, true) {
			if err := w.c.AddSet(s.set, nil); err != nil {
				return fmt.Errorf("policy set %s: %w", s.set.Name, err)
			}
			if slices.Contains(cur.sets, s.set.Name) {
				w.c.FlushSet(s.set)
			}
			for chunk := range slices.Chunk(s.elements, maxElementsPerMessage) {
				if err := w.c.SetAddElements(s.set, chunk); err != nil {
					return fmt.Errorf("elements of %s: %w", s.set.Name, err)
				}
				w.queued += len(chunk)
				if split && w.queued >= w.perTransaction {
					if err := w.flush("policy set " + s.set.Name); err != nil {
						return sendError{err}
					}
					w.begin(bt)
				}
			}
		}
	}
	w.replaceChain(&nftables.Chain{Table: bt, Name: name}, groupRules(name, g.stem, g.dir, g.group, g.audit))
	return nil
}

// begin starts a transaction with the table and the drop and audit chains the groups go to
// (their rules come with the fixed chains'), so that each one stands alone (a transaction sent
// again after a refusal of a bigger one, or the table deleted meanwhile by somebody else).
func (w *writer) begin(bt *nftables.Table) {
	if !w.dirty {
		w.c.AddTable(bt)
		for _, name := range []string{ChainDropEgress, ChainDropIngress, ChainAuditEgress, ChainAuditIngress} {
			w.c.AddChain(&nftables.Chain{Table: bt, Name: name})
		}
		w.dirty = true
	}
}

// writeFixed queues the fixed chains, maps and sets of both tables where they are missing or
// differ from their plan, and reports whether it queued anything.
func (w *writer) writeFixed(bt, it *nftables.Table, cur state, rs policyrules.Ruleset) (bool, error) {
	wrote := false
	if !cur.inetOK {
		if cur.inetForeign {
			w.delTable(it)
		}
		w.c.AddTable(it)
		rules := InetRules()
		for _, ch := range inetChains(it) {
			w.replaceChain(ch, rules[ch.Name])
		}
		wrote = true
	}
	if !cur.bridgeExists {
		// Only then: a pass that changes nothing sends nothing, and what it queued on the
		// Applier's lasting connection would wait there for the next pass's transaction.
		w.c.AddTable(bt)
	}
	rewrite := map[string]bool{} // chains whose rules are written again whatever they are
	for _, dir := range []string{egressDir, ingressDir} {
		name := dropsName(dir)
		if cur.fixedAsPlanned[name] || !slices.Contains(cur.sets, name) {
			continue
		}
		// Another tool made the drop counters' set anew with another definition (without
		// counters, say: drops would go uncounted). Only the direction's drop and audit chains
		// look it up: emptied first, the set goes and comes back as planned in the same
		// transaction, with every element (dropsDiff from none), and the chains are written
		// again.
		for _, ch := range []string{ChainDropEgress, ChainAuditEgress} {
			if dir == ingressDir {
				ch = map[string]string{ChainDropEgress: ChainDropIngress, ChainAuditEgress: ChainAuditIngress}[ch]
			}
			w.c.AddChain(&nftables.Chain{Table: bt, Name: ch})
			w.c.FlushChain(&nftables.Chain{Table: bt, Name: ch})
			rewrite[ch] = true
		}
		w.c.DelSet(&nftables.Set{Table: bt, Name: name})
		delete(cur.drops, name) // the caller's map: switchPorts adds every element
		wrote = true
	}
	for _, s := range fixedSets(bt) {
		if cur.fixedAsPlanned[s.Name] {
			// The kernel commits (and announces) adding an existing set as an update of it:
			// a pass that finds everything as planned commits nothing. A set of another
			// definition is added all the same: the kernel refuses the transaction rather than
			// take elements into it that would mean something else.
			continue
		}
		if err := w.c.AddSet(s, nil); err != nil {
			return false, fmt.Errorf("policy set %s: %w", s.Name, err)
		}
		wrote = true
	}
	if !cur.rateLimited {
		w.c.AddObj(rateLimitedCounter(bt))
		wrote = true
	}
	if onLink := onLinkElements(rs.PodCIDRs); !sameElements(cur.onLink, onLink) {
		s := onLinkSet(bt)
		if slices.Contains(cur.sets, SetOnLink) {
			w.c.FlushSet(s)
		}
		if err := addElements(w.c, s, onLink); err != nil {
			return false, err
		}
		wrote = true
	}
	for _, is6 := range []bool{false, true} {
		want := localPodsElements(rs.PodCIDRs, rs.NodeAddrs, is6)
		if sameElements(cur.localPods[localPodsName(is6)], want) {
			continue
		}
		s := localPodsSet(bt, is6)
		if slices.Contains(cur.sets, s.Name) {
			w.c.FlushSet(s)
		}
		if err := addElements(w.c, s, want); err != nil {
			return false, err
		}
		wrote = true
	}
	rules := BridgeRules(w.network, w.log)
	for _, ch := range bridgeChains(bt) {
		if !rewrite[ch.Name] && nft.Compare(ch, cur.bridgeRules[ch.Name], rules[ch.Name]) == nil {
			continue
		}
		w.replaceChain(ch, rules[ch.Name])
		wrote = true
	}
	// Only what changes something makes the switch a transaction: the kernel does not count
	// one that changes nothing (the table added again), and a commit of another tool's right
	// after it would move the generation by one, as if it were the Applier's (ruleTrail).
	w.dirty = w.dirty || wrote
	return wrote, nil
}

// desired is what Apply wants in the kernel.
type desired struct {
	groups map[string]plannedGroup
	maps   map[string]map[int]string // map name → port → chain
	// sources are the elements of SetSourcesIPv4 and SetSourcesIPv6, by set name.
	sources map[string][]nftables.SetElement
	// keep are the ports whose allow list in a map's direction was refused: they keep the
	// group they have there (or none).
	keep    map[string]map[int]bool
	refused []policyrules.Refusal
}

type plannedGroup struct {
	// stem names its sets (slotStem): the sets its chain refers to, or a donor's, or a new
	// slot's (assignStems). Empty in the pure plan.
	stem  string
	dir   string
	audit bool // only staged policies isolate its pods (policyrules.Direction.Audit)
	group group
	cost  int
	ports []int    // the ports that use it
	pods  []string // their pods' names
}

// mapOf is the dispatch map of a direction.
func mapOf(dir string) string {
	if dir == ingressDir {
		return MapIngress
	}
	return MapEgress
}

// plan computes the groups and map elements of rs, and refuses the allow lists over the limits:
// a list longer than MaxAllowEntries, a group costlier than maxGroupCost, and, the cheapest
// first, the groups past maxNodeCost all together. Pure but for the memo, which learns the
// groups of rs's allow lists.
func plan(rs policyrules.Ruleset, groups *groupMemo) desired {
	d := desired{groups: map[string]plannedGroup{}, maps: map[string]map[int]string{MapEgress: {}, MapIngress: {}},
		sources: map[string][]nftables.SetElement{}, keep: map[string]map[int]bool{MapEgress: {}, MapIngress: {}}}
	for _, p := range rs.Pods {
		if p.Port <= 0 {
			continue
		}
		for _, a := range p.IPs {
			if a.IsValid() {
				set := sourcesName(a.Unmap().Is6())
				d.sources[set] = append(d.sources[set], nftables.SetElement{Key: sourceKey(p.Port, a)})
			}
		}
		for _, dir := range []struct {
			name, open string
			d          policyrules.Direction
		}{{ingressDir, ChainAllowIngress, p.Ingress}, {egressDir, ChainAllowEgress, p.Egress}} {
			m := mapOf(dir.name)
			if !dir.d.Isolated {
				d.maps[m][p.Port] = dir.open
				continue
			}
			refuse := func(why error) {
				d.keep[m][p.Port] = true
				d.refused = append(d.refused, policyrules.Refusal{Ingress: dir.name == ingressDir, Pods: []string{p.Name}, Err: why})
			}
			if n := len(dir.d.Allow); n > policyrules.MaxAllowEntries {
				refuse(fmt.Errorf("%w: more than %d entries", policyrules.ErrTooBig, policyrules.MaxAllowEntries))
				continue
			}
			g, ok := groups.of(dir.d.Allow)
			if !ok {
				refuse(fmt.Errorf("%w: more than %d set elements", policyrules.ErrTooBig, maxGroupCost))
				continue
			}
			name := g.named(dir.name, dir.d.Audit)
			pg, seen := d.groups[name]
			if !seen {
				pg = plannedGroup{dir: dir.name, audit: dir.d.Audit, group: g.group, cost: g.cost()}
			}
			pg.ports, pg.pods = append(pg.ports, p.Port), append(pg.pods, p.Name)
			d.groups[name] = pg
			d.maps[m][p.Port] = name
		}
	}
	total := 0
	for _, name := range d.byCost() {
		switch cost := d.groups[name].cost; {
		case cost > maxGroupCost:
			d.refuse(name, fmt.Errorf("%w: its sets would cost %d prefixes, more than %d", policyrules.ErrTooBig, cost, maxGroupCost))
		case total+cost > maxNodeCost:
			d.refuse(name, fmt.Errorf("%w: with it the node's groups would cost more than %d prefixes", policyrules.ErrTooBig, maxNodeCost))
		default:
			total += cost
		}
	}
	return d
}

// groupMemo computes the group of each distinct allow list once: the pods a policy selects have
// equal lists, a big list's group costs a few hundred milliseconds, and from one pass to the
// next most lists stay. It keeps the lists of the last pass only (sweep): whatever the churn, it
// holds no more than one pass's distinct lists.
type groupMemo struct {
	seed   maphash.Seed
	by     map[uint64][]*memoGroup // by the hash of the allow list
	byName map[string]*memoGroup   // by the names named gave them
	pass   uint64                  // the pass under way; a memoGroup used in it has used == pass
}

type memoGroup struct {
	allow []policyrules.Entry // a copy: the caller's list may change after the pass
	group
	ok    bool
	used  uint64
	names [4]string // by direction and audit-ness (named); "" until asked
	memo  *groupMemo
}

func newGroupMemo() *groupMemo {
	return &groupMemo{seed: maphash.MakeSeed(), by: map[uint64][]*memoGroup{}, byName: map[string]*memoGroup{}, pass: 1}
}

// of is canonical(allow, maxGroupCost), computed once per distinct allow.
func (m *groupMemo) of(allow []policyrules.Entry) (*memoGroup, bool) {
	var h maphash.Hash
	h.SetSeed(m.seed)
	var buf [38]byte
	for _, e := range allow {
		first, last := e.Peer.First.As16(), e.Peer.Last.As16()
		b := append(append(buf[:0], first[:]...), last[:]...)
		if e.Ports != nil {
			b = append(b, 1, e.Ports.Protocol, byte(e.Ports.First>>8), byte(e.Ports.First), byte(e.Ports.Last>>8), byte(e.Ports.Last))
		} else {
			b = append(b, 0)
		}
		h.Write(b)
	}
	key := h.Sum64()
	for _, g := range m.by[key] {
		if slices.EqualFunc(g.allow, allow, policyrules.Entry.Equal) {
			g.used = m.pass
			return g, g.ok
		}
	}
	g := &memoGroup{allow: cloneEntries(allow), used: m.pass}
	g.group, g.ok = canonical(allow, maxGroupCost)
	g.memo = m
	m.by[key] = append(m.by[key], g)
	return g, g.ok
}

// named is the group of a name given this pass or the last one; false for any other.
func (m *groupMemo) named(name string) (group, bool) {
	g, ok := m.byName[name]
	if !ok {
		return group{}, false
	}
	return g.group, true
}

// sweep ends a pass: the lists it did not use are forgotten.
func (m *groupMemo) sweep() {
	for key, gs := range m.by {
		gs = slices.DeleteFunc(gs, func(g *memoGroup) bool {
			if g.used == m.pass {
				return false
			}
			for _, name := range g.names {
				if m.byName[name] == g { // two lists in another order are one group, one name
					delete(m.byName, name)
				}
			}
			return true
		})
		if len(gs) == 0 {
			delete(m.by, key)
		} else {
			m.by[key] = gs
		}
	}
	m.pass++
}

// size is the number of lists the memo holds (tests).
func (m *groupMemo) size() int {
	n := 0
	for _, gs := range m.by {
		n += len(gs)
	}
	return n
}

// cloneEntries copies a list and the ports its entries point to.
func cloneEntries(allow []policyrules.Entry) []policyrules.Entry {
	out := slices.Clone(allow)
	for i, e := range out {
		if e.Ports != nil {
			p := *e.Ports
			out[i].Ports = &p
		}
	}
	return out
}

// named is the group's name in direction dir, enforced or audit.
func (g *memoGroup) named(dir string, audit bool) string {
	k := 0
	if dir == ingressDir {
		k = 2
	}
	if audit {
		k++
	}
	if g.names[k] == "" {
		prefix := dir
		if audit {
			prefix = dir + auditInfix
		}
		g.names[k] = g.name(prefix)
	}
	g.memo.byName[g.names[k]] = g // this pass's, whichever list of the same group it was first
	return g.names[k]
}

// byCost lists the groups, the cheapest first (then by name).
func (d desired) byCost() []string {
	names := slices.Collect(maps.Keys(d.groups))
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(d.groups[a].cost, d.groups[b].cost), strings.Compare(a, b))
	})
	return names
}

// refuse takes a group out of the plan: its ports keep what they have in its direction.
func (d *desired) refuse(name string, why error) {
	g := d.groups[name]
	delete(d.groups, name)
	m := mapOf(g.dir)
	for _, port := range g.ports {
		delete(d.maps[m], port)
		d.keep[m][port] = true
	}
	d.refused = append(d.refused, policyrules.Refusal{Ingress: g.dir == ingressDir, Pods: g.pods, Group: name, Cost: g.cost, Err: why})
}

// state is what the kernel holds of the tables.
type state struct {
	bridgeExists bool
	inetOK       bool
	inetForeign  bool                        // the inet table holds chains that are not this layout's
	bridgeRules  map[string][]*nftables.Rule // chain → rules
	inetRules    map[string][]*nftables.Rule // chain → rules
	groupChains  map[string]bool
	// groupStems is the stem of the sets each group chain's rules look up (setStem; "" for a
	// chain that looks none up).
	groupStems map[string]string
	// groupLookups are the group sets each group chain's rules look up (lookedUpSets).
	groupLookups map[string][]string
	// stemUsers counts, for each stem, the group chains that look up one of its sets (any of
	// their lookups: a chain another tool rewrote may look up several stems).
	stemUsers map[string]int
	sets      []string
	// misshapen are the group sets whose definition is not the one their name's kind calls for
	// (groupSetShape): another tool recreated them. Their elements read back as the group's
	// may mean something else to the kernel (an interval set's element that ends a range).
	misshapen map[string]bool
	// fixedAsPlanned are the fixed sets (fixedSets) whose kernel definition is the planned one.
	fixedAsPlanned map[string]bool
	maps           map[string]map[int]string // map → port → chain
	onLink         []nftables.SetElement
	localPods      map[string][]nftables.SetElement // SetLocalPodsIPv4, SetLocalPodsIPv6 → elements
	sources        map[string][]nftables.SetElement // SetSourcesIPv4, SetSourcesIPv6 → elements
	drops          map[string][]nftables.SetElement // SetDropsEgress, SetDropsIngress → elements
	rateLimited    bool                             // the CounterLogRateLimited object exists
	// setElements holds the elements of every group set (read only with Verify).
	setElements map[string][]nftables.SetElement
}

type groupState int

const (
	groupOK          groupState = iota
	groupMissing                // no chain
	groupRulesDiffer            // the chain's rules differ, the sets are as planned (a flushed table)
	groupSetsDiffer             // a set is missing or (Verify) holds other elements
)

// groupState compares one planned group, its stem assigned, with the kernel: a chain that looks
// up other sets than the group's stem's (the older layout's, none) has sets that differ.
func (st state) groupState(name string, g plannedGroup, verify bool) groupState {
	if !st.groupChains[name] {
		return groupMissing
	}
	if writtenFor(st.bridgeRules[name]) != name {
		// A chain renamed (or written by another tool): its sets may hold any list.
		return groupSetsDiffer
	}
	for _, s := range groupSets(BridgeTable(""), g.stem, g.group, verify) {
		if !slices.Contains(st.sets, s.set.Name) || st.misshapen[s.set.Name] {
			return groupSetsDiffer
		}
		if verify && !sameElements(st.setElements[s.set.Name], s.elements) {
			return groupSetsDiffer
		}
	}
	if nft.Compare(&nftables.Chain{Table: BridgeTable(""), Name: name}, st.bridgeRules[name], groupRules(name, g.stem, g.dir, g.group, g.audit)) != nil {
		return groupRulesDiffer
	}
	return groupOK
}

// sameElements compares two element lists of an interval set by their bounds, in any order.
func sameElements(a, b []nftables.SetElement) bool {
	if len(a) != len(b) {
		return false
	}
	key := func(e nftables.SetElement) string { return string(e.Key) + "\x00" + string(e.KeyEnd) }
	seen := make(map[string]int, len(a))
	for _, e := range a {
		seen[key(e)]++
	}
	for _, e := range b {
		if seen[key(e)] == 0 {
			return false
		}
		seen[key(e)]--
	}
	return true
}

// elementsDiff returns the elements of have that want lacks and those of want that have lacks,
// by key (a plain set's elements are their keys).
func elementsDiff(have, want []nftables.SetElement) (del, add []nftables.SetElement) {
	return diffBy(have, want, func(e nftables.SetElement) string { return string(e.Key) })
}

// readState reads the tables; missing ones read as empty. The chains' rules are those of known
// when it is not nil (the caller knows them, and that nobody changed them since), else read.
func readState(c *nftables.Conn, bt *nftables.Table, verify bool, known *ruleCache) (state, error) {
	st := state{groupChains: map[string]bool{}, groupStems: map[string]string{}, groupLookups: map[string][]string{}, stemUsers: map[string]int{}, maps: map[string]map[int]string{MapEgress: {}, MapIngress: {}}, setElements: map[string][]nftables.SetElement{},
		localPods: map[string][]nftables.SetElement{}, sources: map[string][]nftables.SetElement{}, drops: map[string][]nftables.SetElement{}}
	it := &nftables.Table{Family: nftables.TableFamilyINet, Name: bt.Name}
	var err error
	if known != nil {
		st.inetRules = known.inet
	} else if st.inetRules, err = nft.TableRules(it); err != nil && !nft.IsNotExist(err) {
		return st, fmt.Errorf("read policy table inet %s: %w", it.Name, err)
	}
	st.inetOK = true
	want := InetRules()
	for _, ch := range inetChains(it) {
		if nft.Compare(ch, st.inetRules[ch.Name], want[ch.Name]) != nil {
			st.inetOK = false
		}
	}
	for name := range st.inetRules {
		if _, ours := want[name]; !ours {
			// A chain of the pending-set layout of an older kubenet, which filtered in this table:
			// the table goes and is made anew.
			st.inetOK, st.inetForeign = false, true
		}
	}
	if ok, err := nft.TableExistsWith(c, bt); err != nil || !ok {
		return st, err
	}
	st.bridgeExists = true
	if known != nil {
		st.bridgeRules = known.bridge
	} else if st.bridgeRules, err = nft.TableRules(bt); err != nil && !nft.IsNotExist(err) {
		return st, fmt.Errorf("read policy table bridge %s: %w", bt.Name, err)
	}
	chains, err := c.ListChainsOfTableFamily(bt.Family)
	if err != nil && !nft.IsNotExist(err) {
		return st, fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name == bt.Name && (strings.HasPrefix(ch.Name, ingressDir+"-") || strings.HasPrefix(ch.Name, egressDir+"-")) {
			st.groupChains[ch.Name] = true
			st.groupStems[ch.Name] = ""
			st.groupLookups[ch.Name] = lookedUpSets(st.bridgeRules[ch.Name])
			var stems []string
			for _, set := range st.groupLookups[ch.Name] {
				if stem, _ := setStem(set); !slices.Contains(stems, stem) {
					stems = append(stems, stem)
					st.stemUsers[stem]++
				}
			}
			if len(stems) > 0 {
				st.groupStems[ch.Name] = stems[0]
			}
		}
	}
	sets, err := c.GetSets(bt)
	if err != nil && !nft.IsNotExist(err) {
		return st, fmt.Errorf("list sets: %w", err)
	}
	st.misshapen, st.fixedAsPlanned = map[string]bool{}, map[string]bool{}
	fixed := fixedSets(bt)
	for _, s := range sets {
		st.sets = append(st.sets, s.Name)
		if want, ok := groupSetShape(s.Name); ok && !want.same(s) {
			st.misshapen[s.Name] = true
		}
		if i := slices.IndexFunc(fixed, func(f *nftables.Set) bool { return f.Name == s.Name }); i >= 0 && sameDefinition(s, fixed[i]) {
			st.fixedAsPlanned[s.Name] = true
		}
	}
	for _, m := range []string{MapEgress, MapIngress} {
		if !slices.Contains(st.sets, m) {
			continue
		}
		if st.maps[m], err = readMap(c, bt, m); err != nil {
			return st, err
		}
	}
	if slices.Contains(st.sets, SetOnLink) {
		if st.onLink, err = c.GetSetElements(onLinkSet(bt)); err != nil {
			return st, fmt.Errorf("read set %s: %w", SetOnLink, err)
		}
	}
	for _, is6 := range []bool{false, true} {
		for _, set := range []*nftables.Set{localPodsSet(bt, is6), sourcesSet(bt, is6)} {
			if !slices.Contains(st.sets, set.Name) {
				continue
			}
			els, err := c.GetSetElements(set)
			if err != nil {
				return st, fmt.Errorf("read set %s: %w", set.Name, err)
			}
			if set.Name == localPodsName(is6) {
				st.localPods[set.Name] = els
			} else {
				st.sources[set.Name] = els
			}
		}
	}
	for _, dir := range []string{egressDir, ingressDir} {
		set := dropsSet(bt, dir)
		if !slices.Contains(st.sets, set.Name) {
			continue
		}
		if st.drops[set.Name], err = c.GetSetElements(set); err != nil {
			return st, fmt.Errorf("read set %s: %w", set.Name, err)
		}
	}
	if st.rateLimited, err = hasCounter(c, bt, CounterLogRateLimited); err != nil {
		return st, err
	}
	if verify {
		for _, s := range st.sets {
			if _, ok := setStem(s); !ok {
				continue
			}
			if st.setElements[s], err = c.GetSetElements(&nftables.Set{Table: bt, Name: s}); err != nil {
				return st, fmt.Errorf("read set %s: %w", s, err)
			}
		}
	}
	return st, nil
}

// sameDefinition tells whether the kernel's set have is defined as want, as far as
// google/nftables reads a set back: its flags, and a plain set's key length. It reads neither a
// map's key and data types nor a set's counter: readTrusted reads those (nft.SetDefinitions).
func sameDefinition(have, want *nftables.Set) bool {
	return have.IsMap == want.IsMap && have.Interval == want.Interval && have.Concatenation == want.Concatenation &&
		have.HasTimeout == want.HasTimeout && have.Constant == want.Constant &&
		(want.IsMap || have.KeyType.Bytes == want.KeyType.Bytes)
}

// hasCounter tells whether the table has the named counter.
func hasCounter(c *nftables.Conn, bt *nftables.Table, name string) (bool, error) {
	objs, err := c.GetNamedObjects(bt)
	if err != nil && !nft.IsNotExist(err) {
		return false, fmt.Errorf("list objects: %w", err)
	}
	return slices.ContainsFunc(objs, func(o nftables.Obj) bool {
		n, ok := o.(*nftables.NamedObj)
		return ok && n.Name == name && n.Type == nftables.ObjTypeCounter
	}), nil
}

// setNames lists the table's sets.
func setNames(c *nftables.Conn, bt *nftables.Table) ([]string, error) {
	sets, err := c.GetSets(bt)
	if err != nil && !nft.IsNotExist(err) {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	names := make([]string, 0, len(sets))
	for _, s := range sets {
		names = append(names, s.Name)
	}
	return names, nil
}

func readMap(c *nftables.Conn, bt *nftables.Table, m string) (map[int]string, error) {
	els, err := c.GetSetElements(&nftables.Set{Table: bt, Name: m, IsMap: true, KeyType: nftables.TypeIFIndex, DataType: nftables.TypeVerdict})
	if err != nil {
		return nil, fmt.Errorf("read map %s: %w", m, err)
	}
	out := make(map[int]string, len(els))
	for _, el := range els {
		if len(el.Key) != 4 {
			continue
		}
		out[int(binary.NativeEndian.Uint32(el.Key))] = verdictChain(el.Val)
	}
	return out, nil
}

// portKey is a map key: the interface index as `meta iif`/`oif` loads it, in host byte order.
func portKey(port int) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, uint32(port))
	return b
}

// verdictChain decodes the chain a jump or goto verdict of a map element names (the element's
// data as the library hands it: the nested verdict attributes).
func verdictChain(b []byte) string {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return ""
	}
	var chain string
	for ad.Next() {
		if ad.Type() == 2 { // NFTA_VERDICT_CHAIN
			chain = string(bytes.TrimRight(ad.Bytes(), "\x00"))
		}
	}
	return chain
}

func addElements(c *nftables.Conn, s *nftables.Set, els []nftables.SetElement) error {
	for chunk := range slices.Chunk(els, maxElementsPerMessage) {
		if err := c.SetAddElements(s, chunk); err != nil {
			return fmt.Errorf("elements of %s: %w", s.Name, err)
		}
	}
	return nil
}

func deleteElements(c *nftables.Conn, s *nftables.Set, els []nftables.SetElement) error {
	for chunk := range slices.Chunk(els, maxElementsPerMessage) {
		if err := c.SetDeleteElements(s, chunk); err != nil {
			return fmt.Errorf("elements of %s: %w", s.Name, err)
		}
	}
	return nil
}

// flushConntrack removes conntrack's entries whose original or reply tuple has one of addrs as
// source or destination.
func flushConntrack(addrs []netip.Addr) (uint, error) {
	if len(addrs) == 0 {
		return 0, nil
	}
	doomed := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		doomed[a.Unmap()] = true
	}
	has := func(ip []byte) bool {
		a, ok := netip.AddrFromSlice(ip)
		return ok && doomed[a.Unmap()]
	}
	return conntrack.Delete(func(f *vnl.ConntrackFlow) bool {
		return has(f.Forward.SrcIP) || has(f.Forward.DstIP) || has(f.Reverse.SrcIP) || has(f.Reverse.DstIP)
	})
}

// Forget removes the map elements of ports (DEL of a pod whose port index it read before the
// veth went; the agent's next Apply would too). A missing table or element is fine.
func Forget(network string, ports []int) error { return forget(network, ports, nil) }

// forget is Forget; afterRead, when not nil, runs between the reads and the delete of each
// attempt (tests: a concurrent pass).
func forget(network string, ports []int, afterRead func()) error {
	if len(ports) == 0 {
		return nil
	}
	// The agent's pass may remove some of the same elements between the read and the delete,
	// and the kernel refuses the whole transaction for one missing element (ENOENT): read again
	// and delete what is still there. DEL must always be able to finish.
	var err error
	for range 4 {
		if err = forgetOnce(network, ports, afterRead); !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return err
}

func forgetOnce(network string, ports []int, afterRead func()) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("policy rules: netlink: %w", err)
	}
	bt := BridgeTable(network)
	if ok, err := nft.TableExistsWith(c, bt); err != nil || !ok {
		return err
	}
	n := 0
	for _, m := range []string{MapEgress, MapIngress} {
		have, err := readMap(c, bt, m)
		if nft.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		var del []nftables.SetElement
		for _, p := range ports {
			if _, ok := have[p]; ok {
				del = append(del, nftables.SetElement{Key: portKey(p)})
			}
		}
		n += len(del)
		set := &nftables.Set{Table: bt, Name: m, IsMap: true, KeyType: nftables.TypeIFIndex, DataType: nftables.TypeVerdict}
		if err := deleteElements(c, set, del); err != nil {
			return err
		}
	}
	portOfDrops := func(k []byte) (int, bool) {
		if len(k) != 4 {
			return 0, false
		}
		return int(binary.NativeEndian.Uint32(k)), true
	}
	portOfSource := func(k []byte) (int, bool) {
		port, _, ok := parseSourceKey(k)
		return port, ok
	}
	for _, s := range []struct {
		set    *nftables.Set
		portOf func([]byte) (int, bool)
	}{{dropsSet(bt, egressDir), portOfDrops}, {dropsSet(bt, ingressDir), portOfDrops}, {sourcesSet(bt, false), portOfSource}, {sourcesSet(bt, true), portOfSource}} {
		del, err := portElements(c, s.set, ports, s.portOf)
		if err != nil {
			return err
		}
		n += len(del)
		if err := deleteElements(c, s.set, del); err != nil {
			return err
		}
	}
	if n == 0 {
		return nil
	}
	if afterRead != nil {
		afterRead()
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("forget ports %v in the policies of network %q: %w", ports, network, err)
	}
	return nil
}

// portElements reads set and returns the keys of its elements whose port (portOf) is one of
// ports. A missing set has none.
func portElements(c *nftables.Conn, set *nftables.Set, ports []int, portOf func([]byte) (int, bool)) ([]nftables.SetElement, error) {
	have, err := c.GetSetElements(set)
	if nft.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read set %s: %w", set.Name, err)
	}
	var del []nftables.SetElement
	for _, e := range have {
		if port, ok := portOf(e.Key); ok && slices.Contains(ports, port) {
			del = append(del, nftables.SetElement{Key: e.Key})
		}
	}
	return del, nil
}

// parseSourceKey splits an element key of SetSourcesIPv4 or SetSourcesIPv6.
func parseSourceKey(k []byte) (int, netip.Addr, bool) {
	if len(k) != 8 && len(k) != 20 {
		return 0, netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(k[4:])
	return int(binary.NativeEndian.Uint32(k[:4])), a, ok
}

// Sources reads the addresses each port may send from (SetSourcesIPv4, SetSourcesIPv6): the
// residue audit's and the operators' view.
func Sources(network string) (map[int][]netip.Addr, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("policy rules: netlink: %w", err)
	}
	bt := BridgeTable(network)
	out := map[int][]netip.Addr{}
	if ok, err := nft.TableExistsWith(c, bt); err != nil || !ok {
		return out, err
	}
	for _, is6 := range []bool{false, true} {
		els, err := c.GetSetElements(sourcesSet(bt, is6))
		if nft.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read set %s: %w", sourcesName(is6), err)
		}
		for _, e := range els {
			if port, a, ok := parseSourceKey(e.Key); ok {
				out[port] = append(out[port], a)
			}
		}
	}
	return out, nil
}

// Dispatch reads the two dispatch maps: map name → port → the chain it goes to (operators'
// tools, tests, and the bench, which watches a policy change arrive).
func Dispatch(network string) (map[string]map[int]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("policy rules: netlink: %w", err)
	}
	bt := BridgeTable(network)
	out := map[string]map[int]string{MapEgress: {}, MapIngress: {}}
	if ok, err := nft.TableExistsWith(c, bt); err != nil || !ok {
		return out, err
	}
	for _, m := range []string{MapEgress, MapIngress} {
		if out[m], err = readMap(c, bt, m); err != nil && !nft.IsNotExist(err) {
			return nil, err
		}
	}
	return out, nil
}

// Remove deletes the network's policy tables (the agent with policies turned off). Missing is
// fine.
func Remove(network string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("policy rules: netlink: %w", err)
	}
	n := 0
	for _, t := range []*nftables.Table{BridgeTable(network), InetTable(network)} {
		ok, err := nft.TableExistsWith(c, t)
		if err != nil {
			return err
		}
		if ok {
			c.DelTable(t)
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove the policy tables of network %q: %w", network, err)
	}
	return nil
}
