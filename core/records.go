package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

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

func (rec *Record) key() attachmentKey { return attachmentKey{rec.ContainerID, rec.IfName} }

func (rec *Record) attachment() Attachment {
	return Attachment{ContainerID: rec.ContainerID, IfName: rec.IfName, NetNS: rec.NetNS, Pod: rec.Pod}
}

// RecordDirName is the directory, inside the network's IPAM directory, that holds the records.
// host-local ignores subdirectories' content (it only matches files whose content is a container
// ID), so a node can switch back and forth without confusing either plugin.
const RecordDirName = "kubenet-attachments"

// CorruptRecordError is Load's error for a record file that is not a record kubenet could have
// written: truncated, garbage, empty (an unsynced write before a power loss), naming another
// attachment, with values no writer produces, or not a regular file. DEL then tears down
// everything derivable from the attachment's key; ADD refuses the attachment until then.
type CorruptRecordError struct {
	Path string
	Err  error
}

func (e *CorruptRecordError) Error() string {
	return fmt.Sprintf("attachment record %s is unreadable: %v", e.Path, e.Err)
}

func (e *CorruptRecordError) Unwrap() error { return e.Err }

// Records stores the attachment records of one network.
type Records struct {
	networkDir string
	// root is the network's directory held open by a verb's networkDir (nil for NewRecords):
	// through it the records directory is opened without walking the data dir's ancestors again
	// on every Load, Save and Remove.
	root *safedir.Dir
}

// NewRecords returns the record store under the network's IPAM directory.
func NewRecords(networkDir string) Records { return Records{networkDir: networkDir} }

// RecordPath is the path of a's record file in the network directory networkDir (for operators
// and tests; kubenet itself reaches it only through Records).
func RecordPath(networkDir string, a Attachment) string {
	return filepath.Join(networkDir, RecordDirName, a.key().recordName())
}

// open opens the records directory (creating it when create is set); without create, a missing
// directory is (nil, nil): there are no records. A symlink or a file in its place is replaced,
// never followed (safedir.OpenIn).
func (r Records) open(create bool) (*safedir.Dir, error) {
	var d *safedir.Dir
	var err error
	if r.root != nil {
		d, err = r.root.OpenSub(RecordDirName, create)
	} else {
		d, err = safedir.OpenIn(r.networkDir, RecordDirName, create)
	}
	if err != nil {
		return nil, fmt.Errorf("attachment records: %w", err)
	}
	return d, nil
}

// Load returns the record of a: (nil, nil) when there is none, a *CorruptRecordError when the
// file is there but unreadable.
func (r Records) Load(a Attachment) (*Record, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	d, err := r.open(false)
	if err != nil || d == nil {
		return nil, err
	}
	defer d.Close()
	rec, err := readRecord(d, a.key().recordName(), a)
	if rec != nil || err != nil {
		return rec, err
	}
	// A record of an earlier version counts only when it is readable and names a.
	rec, err = readRecord(d, a.key().legacyRecordName(), a)
	if err != nil {
		return nil, nil
	}
	return rec, nil
}

// readRecord reads and checks one record file, which must be the record of a.
func readRecord(d *safedir.Dir, name string, a Attachment) (*Record, error) {
	data, err := d.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil && !errors.Is(err, safedir.ErrNotRegular) {
		return nil, fmt.Errorf("attachment record: %w", err)
	}
	if err == nil {
		var rec *Record
		if rec, err = parseRecord(data); err == nil {
			if rec.ContainerID == a.ContainerID && rec.IfName == a.IfName {
				return rec, nil
			}
			err = fmt.Errorf("it is the record of container %q interface %q", rec.ContainerID, rec.IfName)
		}
	}
	return nil, &CorruptRecordError{Path: d.Join(name), Err: err}
}

// parseRecord checks a record's content as strictly as ADD writes it.
func parseRecord(data []byte) (*Record, error) {
	if len(data) == 0 {
		return nil, errors.New("empty file")
	}
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, err
	}
	if err := rec.attachment().Validate(); err != nil {
		return nil, err
	}
	if len(rec.IPs) > 2 {
		return nil, fmt.Errorf("%d addresses", len(rec.IPs))
	}
	for _, p := range rec.IPs {
		if !p.IsValid() || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			return nil, fmt.Errorf("address %s", p)
		}
	}
	for i, pm := range rec.PortMappings {
		if err := validatePortMapping(&pm, fmt.Sprintf("portMappings[%d]", i)); err != nil || pm != rec.PortMappings[i] {
			return nil, fmt.Errorf("port mapping %+v", rec.PortMappings[i])
		}
	}
	return &rec, nil
}

// Written returns when the record of a was written (its file's modification time; Save
// replaces the file, so this is the last Save). The error wraps fs.ErrNotExist when there is none.
func (r Records) Written(a Attachment) (time.Time, error) {
	if err := a.Validate(); err != nil {
		return time.Time{}, err
	}
	d, err := r.open(false)
	if err != nil {
		return time.Time{}, err
	}
	if d == nil {
		return time.Time{}, fmt.Errorf("attachment record: %w", fs.ErrNotExist)
	}
	defer d.Close()
	st, err := d.Lstat(a.key().recordName())
	if errors.Is(err, fs.ErrNotExist) {
		// A record of an earlier version counts as the attachment's.
		if rec, lerr := readRecord(d, a.key().legacyRecordName(), a); lerr == nil && rec != nil {
			st, err = d.Lstat(a.key().legacyRecordName())
		}
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("attachment record: %w", err)
	}
	return time.Unix(st.Mtim.Unix()), nil
}

// Save writes rec atomically.
func (r Records) Save(rec *Record) error {
	a := rec.attachment()
	if err := a.Validate(); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	d, err := r.open(true)
	if err != nil {
		return err
	}
	defer d.Close()
	// No fsync: the reservations (durable) already name the container, and the objects the record
	// describes do not survive a power loss either; the empty file a power loss may leave is a
	// corrupt record, which DEL and GC clean up from the attachment's key.
	if err := d.WriteFile(a.key().recordName(), data, 0o600, false); err != nil {
		return fmt.Errorf("attachment record: %w", err)
	}
	return nil
}

// Remove deletes the record of a (and a legacy record that names a) and the temporary files of
// its unfinished writes; a missing record is fine. The directory goes with the last record, so a
// drained node's data dir holds only what host-local would have (lock and cursors). Callers hold
// the network lock, so no Save can race the directory removal and no temporary file in it
// belongs to a live writer.
func (r Records) Remove(a Attachment) error {
	if err := a.Validate(); err != nil {
		return err
	}
	d, err := r.open(false)
	if err != nil || d == nil {
		return err
	}
	defer d.Close()
	var errs []error
	if err := d.RemoveAll(a.key().recordName()); err != nil {
		errs = append(errs, fmt.Errorf("attachment record: %w", err))
	}
	if rec, err := readRecord(d, a.key().legacyRecordName(), a); rec != nil && err == nil {
		errs = append(errs, d.Remove(a.key().legacyRecordName()))
	}
	return errors.Join(append(errs, r.removeIfOnlyTemp(d, safedir.TempPrefix(a.key().recordName())))...)
}

// removeIfOnlyTemp removes the records directory d when it holds nothing but temporary files,
// and with it, when it stays, the temporary files whose name starts with own (those of one
// attachment; "" for none).
func (r Records) removeIfOnlyTemp(d *safedir.Dir, own string) error {
	root := r.root
	if root == nil {
		var err error
		if root, err = safedir.Open(r.networkDir); err != nil {
			return fmt.Errorf("attachment records: %w", err)
		}
		defer root.Close()
	}
	// The cheap case first: the last record went, and nothing else is there.
	err := root.RemoveDir(RecordDirName)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("attachment records: %w", err)
	}
	entries, err := d.ReadDir()
	if err != nil {
		return fmt.Errorf("attachment records: %w", err)
	}
	onlyTemp := true
	for _, e := range entries {
		onlyTemp = onlyTemp && safedir.IsTemp(e.Name())
	}
	for _, e := range entries {
		if !safedir.IsTemp(e.Name()) || !onlyTemp && (own == "" || !strings.HasPrefix(e.Name(), own)) {
			continue
		}
		if err := d.Remove(e.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("attachment records: %w", err)
		}
	}
	if !onlyTemp {
		return nil
	}
	if err := root.RemoveDir(RecordDirName); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("attachment records: %w", err)
	}
	return nil
}

// List returns every readable record; unreadable ones are left out (Scan reports them).
func (r Records) List() ([]Record, error) {
	s, err := r.Scan()
	return s.Records, err
}

// RecordScan is what Scan finds in the records directory.
type RecordScan struct {
	Records []Record
	// Corrupt are the attachments whose record file is unreadable (the name gives the key).
	Corrupt []Attachment
	// Garbage are files that are neither a record nor a temporary file of one and whose name
	// gives no attachment (an unreadable record of an earlier version, junk).
	Garbage []string
	// Temp are temporary files of writes that never finished.
	Temp []string
}

// Scan reads the whole records directory (GC). One unreadable file never hides the others.
func (r Records) Scan() (RecordScan, error) {
	var s RecordScan
	d, err := r.open(false)
	if err != nil || d == nil {
		return s, err
	}
	defer d.Close()
	entries, err := d.ReadDir()
	if err != nil {
		return s, fmt.Errorf("attachment records: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if safedir.IsTemp(name) {
			s.Temp = append(s.Temp, name)
			continue
		}
		if k, ok := parseRecordName(name); ok {
			a := k.attachment()
			rec, err := readRecord(d, name, a)
			var corrupt *CorruptRecordError
			switch {
			case errors.As(err, &corrupt):
				s.Corrupt = append(s.Corrupt, a)
			case err != nil:
				return s, err
			case rec != nil:
				s.Records = append(s.Records, *rec)
			}
			continue
		}
		// An earlier version's record counts when its content names the attachment its name
		// was made from.
		data, err := d.ReadFile(name)
		if err == nil {
			if rec, err := parseRecord(data); err == nil && rec.key().legacyRecordName() == name {
				s.Records = append(s.Records, *rec)
				continue
			}
		}
		s.Garbage = append(s.Garbage, name)
	}
	return s, nil
}

// RemoveFiles removes files of the records directory by name (GC's garbage and temporary files;
// callers hold the network lock), and the directory when nothing else is left.
func (r Records) RemoveFiles(names []string) error {
	if len(names) == 0 {
		return nil
	}
	d, err := r.open(false)
	if err != nil || d == nil {
		return err
	}
	defer d.Close()
	var errs []error
	for _, n := range names {
		if err := d.RemoveAll(n); err != nil {
			errs = append(errs, fmt.Errorf("attachment records: %w", err))
		}
	}
	return errors.Join(append(errs, r.removeIfOnlyTemp(d, ""))...)
}

// claimant returns the attachment whose readable record lists address a (the first, should two
// do), or false.
func (s RecordScan) claimant(a netip.Addr) (attachmentKey, bool) {
	for _, rec := range s.Records {
		for _, p := range rec.IPs {
			if p.Addr() == a {
				return rec.key(), true
			}
		}
	}
	return attachmentKey{}, false
}

// attachments returns the attachments of the readable records.
func (s RecordScan) attachments() []Attachment {
	out := make([]Attachment, len(s.Records))
	for i, rec := range s.Records {
		out[i] = rec.attachment()
	}
	return out
}
