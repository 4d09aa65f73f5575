package core

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kubenet-dev/kubenet/internal/atomicfile"
)

// Attachment identifies one pod interface on one network: what the runtime passes as
// CNI_CONTAINERID, CNI_IFNAME and CNI_NETNS. All host-side state is keyed by (network,
// container ID, interface name), never by what is read back from the pod, so DEL works when the
// pod's netns is already gone.
type Attachment struct {
	ContainerID string
	IfName      string
	NetNS       string // may be empty on DEL
	Pod         string // "namespace/name" from CNI_ARGS, for operators; optional
}

// Names are the host-side object names derived from an attachment.
type Names struct {
	HostVeth string // bridge port
	IFB      string // egress shaping device
}

// NamesFor derives the names from a hash of the attachment's key, so they are stable across
// retries and restarts and DEL can find them without any stored state.
func NamesFor(network string, a Attachment) Names {
	sum := sha256.Sum256([]byte(network + "\x00" + a.ContainerID + "\x00" + a.IfName))
	h := hex.EncodeToString(sum[:])
	return Names{HostVeth: "veth" + h[:11], IFB: "kifb" + h[:11]}
}

// Record is what kubenet remembers of an attachment on disk. It is written before anything is
// created (so a crashed ADD can be cleaned up by DEL or GC) and removed last by DEL.
type Record struct {
	ContainerID  string         `json:"containerID"`
	IfName       string         `json:"ifName"`
	NetNS        string         `json:"netns,omitempty"`
	Pod          string         `json:"pod,omitempty"`
	IPs          []netip.Prefix `json:"ips,omitempty"`
	PortMappings []PortMapping  `json:"portMappings,omitempty"`
	Bandwidth    *Bandwidth     `json:"bandwidth,omitempty"`
}

// RecordDirName is the directory, inside the network's IPAM directory, that holds the records.
// host-local ignores subdirectories' content (it only matches files whose content is a container
// ID), so a node can switch back and forth without confusing either plugin.
const RecordDirName = "kubenet-attachments"

// Records stores the attachment records of one network.
type Records struct{ dir string }

// NewRecords returns the record store under the network's IPAM directory.
func NewRecords(networkDir string) Records {
	return Records{dir: filepath.Join(networkDir, RecordDirName)}
}

func (r Records) path(a Attachment) string {
	return filepath.Join(r.dir, a.ContainerID+"_"+a.IfName+".json")
}

// Load returns the record of a, or (nil, nil) when there is none.
func (r Records) Load(a Attachment) (*Record, error) {
	rec, err := readRecord(r.path(a))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return rec, err
}

// readRecord reads and parses one record file; (nil, nil) for an empty file, which is what a
// power loss leaves of an unsynced write (DEL then falls back to derived names, GC collects the
// reservations by their own files).
func readRecord(path string) (*Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("attachment record: %w", err)
	}
	if len(data) == 0 {
		return nil, nil
	}
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("attachment record %s: %w", path, err)
	}
	return &rec, nil
}

// Written returns when the record of a was written (its file's modification time; Save
// replaces the file, so this is the last Save). The error wraps fs.ErrNotExist when there is none.
func (r Records) Written(a Attachment) (time.Time, error) {
	fi, err := os.Lstat(r.path(a))
	if err != nil {
		return time.Time{}, fmt.Errorf("attachment record: %w", err)
	}
	return fi.ModTime(), nil
}

// Save writes rec atomically.
func (r Records) Save(rec *Record) error {
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return fmt.Errorf("attachment records: %w", err)
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	// No fsync: the reservations (durable) already name the container, and the objects the record
	// describes do not survive a power loss either; Load treats the empty file a power loss may
	// leave as no record.
	return atomicfile.WriteNoSync(r.path(Attachment{ContainerID: rec.ContainerID, IfName: rec.IfName}), data, 0o600)
}

// Remove deletes the record of a; a missing record is fine. The directory goes with the last
// record, so a drained node's data dir holds only what host-local would have (lock and cursors).
// Callers hold the network lock, so no Save can race the directory removal.
func (r Records) Remove(a Attachment) error {
	if err := os.Remove(r.path(a)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("attachment record: %w", err)
	}
	if err := os.Remove(r.dir); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("attachment records: %w", err)
	}
	return nil
}

// List returns every record (for GC).
func (r Records) List() ([]Record, error) {
	entries, err := os.ReadDir(r.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("attachment records: %w", err)
	}
	var out []Record
	for _, e := range entries {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		rec, err := readRecord(filepath.Join(r.dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if rec != nil {
			out = append(out, *rec)
		}
	}
	return out, nil
}
