package core

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/internal/safedir"
	"github.com/kubenet-dev/kubenet/internal/statedir"
)

func openTestDir(t *testing.T, dataDir string) *safedir.Dir {
	t.Helper()
	d, err := statedir.Open(dataDir, "kubenet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d.Root()
}

// TestPolicyStateRecordsThePass: what a pass records is, per port, the chains Apply switched to,
// the policies per direction and the refusals; it reads back as written, root-only, and every
// pass counts one generation up.
func TestPolicyStateRecordsThePass(t *testing.T) {
	dataDir := t.TempDir()
	root := openTestDir(t, dataDir)
	rs := policyrules.Ruleset{Pods: []policyrules.Pod{
		{Port: 7, Name: "ns/a", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")},
			Ingress: policyrules.Direction{Isolated: true, Policies: []string{"ns/deny", "ns/web"}}},
		{Port: 8, Name: "ns/b", Egress: policyrules.Direction{Isolated: true, Policies: []string{"ns/big"}}},
		{Port: 0, Name: "ns/unplugged"},
	}}
	res := policyrules.Applied{
		Dispatch: map[int]policyrules.Dispatch{7: {Ingress: "in-1", Egress: "allow-egress"}, 8: {Ingress: "allow-ingress"}},
		Refused:  []policyrules.Refusal{{Pods: []string{"ns/b"}, Err: errors.New("allow list too big: x")}},
	}
	for gen := uint64(1); gen <= 2; gen++ {
		if err := writePolicyState(root, rs, res); err != nil {
			t.Fatal(err)
		}
		st, err := ReadPolicyState(dataDir, "kubenet")
		if err != nil || st == nil {
			t.Fatalf("read back: %v, %v", st, err)
		}
		if st.Generation != gen || st.Written.IsZero() {
			t.Errorf("generation %d written %v, want %d and a time", st.Generation, st.Written, gen)
		}
		want := []PolicyStatePod{
			{Port: 7, Pod: "ns/a", Ingress: PolicyStateDirection{Isolated: true, Chain: "in-1", Policies: []string{"ns/deny", "ns/web"}},
				Egress: PolicyStateDirection{Chain: "allow-egress"}},
			{Port: 8, Pod: "ns/b", Ingress: PolicyStateDirection{Chain: "allow-ingress"},
				Egress: PolicyStateDirection{Isolated: true, Policies: []string{"ns/big"}, Refused: "allow list too big: x"}},
		}
		got, _ := json.Marshal(st.Pods)
		wantJSON, _ := json.Marshal(want)
		if string(got) != string(wantJSON) {
			t.Errorf("pods\n%s\nwant\n%s", got, wantJSON)
		}
	}
	fi, err := os.Stat(filepath.Join(dataDir, "kubenet", PolicyStateFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("file: %v, %v; want mode 0600", fi, err)
	}
}

// TestPolicyStateHostile: a state file that no pass wrote is an error naming the file, read
// without following a link out of the directory, without blocking and without a panic; the
// next pass replaces whatever is in its place without writing through it.
func TestPolicyStateHostile(t *testing.T) {
	valid := `{"generation":3,"pods":[{"port":7,"pod":"ns/a","ingress":{"isolated":true,"chain":"in-1"},"egress":{}}]}`
	cases := []struct {
		name  string
		write func(t *testing.T, dir, file string)
		want  string
	}{
		{"symlink to a state outside", func(t *testing.T, _, file string) {
			outside := filepath.Join(t.TempDir(), "state.json")
			if err := os.WriteFile(outside, []byte(valid), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, file); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"oversized", func(t *testing.T, _, file string) {
			if err := os.WriteFile(file, []byte(strings.Repeat(" ", safedir.MaxFileSize+1)), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "larger than"},
		{"fifo", func(t *testing.T, _, file string) {
			if err := syscall.Mkfifo(file, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"directory", func(t *testing.T, _, file string) {
			if err := os.Mkdir(file, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"truncated", writeString(valid[:20]), "corrupt"},
		{"garbage", writeString("\x00\xff"), "corrupt"},
		{"a port twice", writeString(`{"pods":[{"port":7,"pod":"a"},{"port":7,"pod":"b"}]}`), "port 7 out of range or twice"},
		{"a negative port", writeString(`{"pods":[{"port":-1,"pod":"a"}]}`), "out of range"},
		{"a chain that is no group", writeString(`{"pods":[{"port":7,"pod":"a","egress":{"chain":"egress"}}]}`), "is no group or allow chain"},
		{"a huge name", writeString(`{"pods":[{"port":7,"pod":"` + strings.Repeat("x", 4096) + `"}]}`), "pod name of 4096 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			root := openTestDir(t, dataDir)
			file := filepath.Join(dataDir, "kubenet", PolicyStateFile)
			tc.write(t, filepath.Dir(file), file)
			st, err := ReadPolicyState(dataDir, "kubenet")
			if err == nil || st != nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), file) {
				t.Fatalf("ReadPolicyState = %v, %v; want an error naming %s and saying %q", st, err, file, tc.want)
			}
			if tc.name == "directory" {
				return // a directory in its place stays: the writer's rename cannot replace it
			}
			target, _ := os.Readlink(file)
			var before []byte
			if target != "" {
				before, _ = os.ReadFile(target)
			}
			if err := writePolicyState(root, policyrules.Ruleset{}, policyrules.Applied{}); err != nil {
				t.Fatalf("the next pass cannot replace it: %v", err)
			}
			if st, err := ReadPolicyState(dataDir, "kubenet"); err != nil || st == nil || st.Generation != 1 {
				t.Errorf("after the next pass: %+v, %v; want a fresh state, generation 1", st, err)
			}
			if target != "" {
				if after, _ := os.ReadFile(target); string(after) != string(before) {
					t.Errorf("the pass wrote through the symlink into %s", target)
				}
			}
		})
	}
}
