package nettest

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// nodadFlag marks test addresses as not subject to duplicate address detection.
const nodadFlag = unix.IFA_F_NODAD

func randUint32() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}

// Eventually polls f until it returns nil or the deadline passes, and returns the last error.
// Tests use it instead of sleeping: the kernel applies some changes (ARP, port state) asynchronously.
func Eventually(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	delay := 5 * time.Millisecond
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(delay)
		if delay < 100*time.Millisecond {
			delay *= 2
		}
	}
}

// JoinPrefixes is ps comma-separated, the way Kubernetes flags and configs take a list of CIDRs
// (--service-cluster-ip-range, --cluster-cidr).
func JoinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
