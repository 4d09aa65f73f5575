package nft

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Digest identifies the rules of some chains: as a plan writes them (PlanDigest) or as the
// kernel holds them (RuleDump.Digest).
type Digest [sha256.Size]byte

func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// Verified remembers pairs of digests that were found, by decoding a dump and comparing it with
// the plan in full, to belong together: the kernel held exactly the plan. The two differ in kind
// (the kernel dumps a rule in an encoding of its own: other attribute flags, defaults filled in),
// so the pair is learned, never computed. A dump whose digest is remembered for the plan at hand
// holds that plan exactly (the digest covers every byte of the chains' rules but their handles):
// a healthy node's rules are recognised on every ADD without decoding them, while a rule changed
// in place, a chain emptied or filled, or a plan changed by a new configuration or release gives
// a pair never seen and is compared in full.
type Verified interface {
	Known(plan, kernel Digest) bool
	// Learn remembers a pair, as well as it can: a pair forgotten is compared in full again.
	Learn(plan, kernel Digest)
	// Binary identifies the code that makes the plans (BuildID), "" when unknown: a plan is then
	// known by that and its configuration instead of by digesting its rules (PlanDigest).
	Binary() string
}

// BuildID returns the Go build ID of the running executable, a hash of everything it was built
// from (every source file, the toolchain, the flags): two executables that plan differently have
// different ones. It is read from the ELF note the Go linker puts at the start of the file (the
// first 32 KiB, where the go command looks for it too); "" when it is not there.
func BuildID() string {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return ""
	}
	defer f.Close()
	// The note follows the ELF and program headers, in the first 4 KiB of every binary seen;
	// the rest of the 32 KiB is read only when it is not there.
	head := make([]byte, 4<<10)
	n, _ := io.ReadFull(f, head)
	if id := goNote(head[:n]); id != "" || n < len(head) {
		return id
	}
	head = append(head, make([]byte, 28<<10)...)
	m, _ := io.ReadFull(f, head[n:])
	return goNote(head[:n+m])
}

// goNote finds the Go build ID note in head: namesz, descsz and type (4 bytes each,
// little-endian here), the name padded to 4 bytes, the description; Go's has name "Go", type 4
// and the build ID as description.
func goNote(head []byte) string {
	i := bytes.Index(head, []byte("\x04\x00\x00\x00Go\x00\x00"))
	if i < 8 || binary.LittleEndian.Uint32(head[i-8:]) != 4 {
		return ""
	}
	size := int(binary.LittleEndian.Uint32(head[i-4:]))
	start := i + 8
	if size <= 0 || size > 256 || start+size > len(head) {
		return ""
	}
	return string(head[start : start+size])
}

// PlanDigest digests the planned rules of the chains names (in that order) of a table of family:
// each rule's comment and expressions, encoded as google/nftables sends them to the kernel.
func PlanDigest(family nftables.TableFamily, names []string, plan map[string][]Rule) (Digest, error) {
	var b []byte
	for _, name := range names {
		b = appendField(b, []byte(name))
		b = appendCount(b, len(plan[name]))
		for _, r := range plan[name] {
			b = appendField(b, []byte(r.Comment))
			b = appendCount(b, len(r.Exprs))
			for _, e := range r.Exprs {
				m, err := expr.Marshal(byte(family), e)
				if err != nil {
					return Digest{}, fmt.Errorf("encode a rule of chain %s: %w", name, err)
				}
				b = appendField(b, m)
			}
		}
	}
	return sha256.Sum256(b), nil
}

// Digest digests what the dump holds in the chains names (in that order; a chain without rules
// too): each rule's expressions and user data exactly as the kernel sent them, not its handle.
func (d *RuleDump) Digest(names []string) (Digest, error) {
	rules, err := d.raw()
	if err != nil {
		return Digest{}, err
	}
	size := 0
	for _, r := range rules {
		size += len(r.exprs) + len(r.userdata) + 16
	}
	b := make([]byte, 0, size+len(names)*32)
	for _, name := range names {
		b = appendField(b, []byte(name))
		n := 0
		for _, r := range rules {
			if string(r.chain) == name {
				n++
			}
		}
		b = appendCount(b, n)
		for _, r := range rules {
			if string(r.chain) == name {
				b = appendField(b, r.exprs)
				b = appendField(b, r.userdata)
			}
		}
	}
	return sha256.Sum256(b), nil
}

// appendField appends f with its length, so that no two sequences of fields digest alike.
func appendField(b, f []byte) []byte {
	return append(appendCount(b, len(f)), f...)
}

func appendCount(b []byte, n int) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(n))
}

// Verification is what Recognize found of one plan in one dump, for learning it once the caller
// has confirmed the match in full.
type Verification struct {
	known        Verified
	plan, kernel Digest
}

// Recognize tells whether the dump holds the plan in the chains names as verified before (known
// remembers the pair of digests). The plan is known by the binary that makes it and what it is
// made of, planOf (printed, with %+v: every field of a configuration, whatever fields it gains),
// or where the binary is unknown by the planned rules, plan(). A nil known recognises nothing
// and costs nothing.
func Recognize(known Verified, d *RuleDump, names []string, planOf any, plan func() map[string][]Rule) (Verification, bool, error) {
	if known == nil {
		return Verification{}, false, nil
	}
	p, err := planKey(known.Binary(), d.table.Family, names, planOf, plan)
	if err != nil {
		return Verification{}, false, err
	}
	k, err := d.Digest(names)
	if err != nil {
		return Verification{}, false, err
	}
	v := Verification{known: known, plan: p, kernel: k}
	return v, known.Known(p, k), nil
}

// Confirmed remembers v: the caller decoded the dump and found the plan in it.
func (v Verification) Confirmed() {
	if v.known != nil {
		v.known.Learn(v.plan, v.kernel)
	}
}

// planKey is the digest that stands for a plan in Verified (see Recognize).
func planKey(binary string, family nftables.TableFamily, names []string, planOf any, plan func() map[string][]Rule) (Digest, error) {
	if binary == "" {
		return PlanDigest(family, names, plan())
	}
	b := appendField(nil, []byte(binary))
	b = appendField(b, []byte(fmt.Sprintf("%d %q %+v", family, names, planOf)))
	return sha256.Sum256(b), nil
}

// Remembered is a Verified held in memory, for a process that checks the same chains again and
// again (kubenet-agent's healing) and for tests. BinaryID is what Binary returns.
type Remembered struct {
	BinaryID string
	mu       sync.Mutex
	pairs    map[[2]Digest]bool
}

func (r *Remembered) Binary() string { return r.BinaryID }

func (r *Remembered) Known(plan, kernel Digest) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pairs[[2]Digest{plan, kernel}]
}

func (r *Remembered) Learn(plan, kernel Digest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pairs == nil {
		r.pairs = map[[2]Digest]bool{}
	}
	r.pairs[[2]Digest{plan, kernel}] = true
}

// Len is the number of pairs remembered.
func (r *Remembered) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pairs)
}
