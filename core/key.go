package core

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"

	"github.com/kubenet-dev/kubenet/hostport"
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

// MaxContainerIDLen bounds a container ID (runtimes use 64 hex digits). The ID becomes part of
// file names (at most 255 bytes) and of nftables element comments (at most 256 bytes), together
// with the interface name.
const MaxContainerIDLen = 128

// Validate checks the attachment's identifiers with the CNI rules skel applies to the binary's
// environment (container ID: letters, digits and "_.-", not starting with a symbol; interface
// name: 1-15 bytes, no "/", ":" or space, not "." or ".."), so that the in-process NetworkPlugin
// gets the same protection. Both reach file names and kernel object names: with these rules every
// name kubenet derives from them is unambiguous and stays inside the data dir.
func (a Attachment) Validate() error {
	if err := utils.ValidateContainerID(a.ContainerID); err != nil {
		return types.NewError(err.Code, fmt.Sprintf("container ID %q: %s", a.ContainerID, err.Msg), "")
	}
	if len(a.ContainerID) > MaxContainerIDLen {
		return envError("container ID %.20q...: longer than %d bytes", a.ContainerID, MaxContainerIDLen)
	}
	if err := utils.ValidateInterfaceName(a.IfName); err != nil {
		return envError("interface name %q: %s", a.IfName, err.Msg)
	}
	return nil
}

// attachmentKey is an attachment's identity on a node: its container ID and interface name.
// Every key kubenet derives for an attachment (the names of its links, its pod MAC, its record's
// file name, the owner its host ports and isolation elements carry) is made from it here and
// nowhere else, so DEL, GC and CHECK find from the key alone what ADD made.
type attachmentKey struct{ ContainerID, IfName string }

func (a Attachment) key() attachmentKey { return attachmentKey{a.ContainerID, a.IfName} }

// attachment is the key as an Attachment without namespace or pod.
func (k attachmentKey) attachment() Attachment {
	return Attachment{ContainerID: k.ContainerID, IfName: k.IfName}
}

// owner is the attachment as the host-port index names it; its String is the comment of the
// attachment's isolation elements ("containerID/ifname"), which ownerKey reads back.
func (k attachmentKey) owner() hostport.Owner {
	return hostport.Owner{ContainerID: k.ContainerID, IfName: k.IfName}
}

// ownerKey is the inverse of owner().String(): the attachment an isolation element's comment
// names, false when it names none (a container ID never contains "/").
func ownerKey(comment string) (attachmentKey, bool) {
	id, ifName, ok := strings.Cut(comment, "/")
	return attachmentKey{id, ifName}, ok
}

// sum hashes the key within network, after purpose ("" for the link names): the parts cannot
// contain the NUL that separates them, so no two keys hash alike.
func (k attachmentKey) sum(purpose, network string) [sha256.Size]byte {
	parts := []string{network, k.ContainerID, k.IfName}
	if purpose != "" {
		parts = append([]string{purpose}, parts...)
	}
	return sha256.Sum256([]byte(strings.Join(parts, "\x00")))
}

// Names are the host-side object names derived from an attachment.
type Names struct {
	HostVeth string // bridge port
	IFB      string // egress shaping device
}

// NamesFor derives the names from a hash of the attachment's key, so they are stable across
// retries and restarts and DEL can find them without any stored state.
func NamesFor(network string, a Attachment) Names { return a.key().names(network) }

func (k attachmentKey) names(network string) Names {
	sum := k.sum("", network)
	h := hex.EncodeToString(sum[:])
	return Names{HostVeth: hostVethPrefix + h[:nameHashLen], IFB: ifbPrefix + h[:nameHashLen]}
}

// The names NamesFor gives: a prefix and nameHashLen hex digits of the hash, 15 bytes, the
// kernel's longest interface name.
const (
	hostVethPrefix = "veth"
	ifbPrefix      = "kifb"
	nameHashLen    = 11
)

// isAttachmentLinkName tells whether name has the form of the names NamesFor gives.
func isAttachmentLinkName(name string) bool {
	for _, prefix := range []string{hostVethPrefix, ifbPrefix} {
		if h, ok := strings.CutPrefix(name, prefix); ok && len(h) == nameHashLen && strings.Trim(h, "0123456789abcdef") == "" {
			return true
		}
	}
	return false
}

// podMAC is the MAC of the attachment's pod interface: bridge gives it to the pod end of the
// veth, isolation keys the pod's anti-spoofing elements by it. Derived from the key like the
// host veth's name, so DEL finds those elements without the pod: a locally administered unicast
// address.
func (k attachmentKey) podMAC(network string) net.HardwareAddr {
	sum := k.sum("pod-mac", network)
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// recordName is the record's file name: "<container ID>@<ifname>.json". A container ID never
// contains "@", so the first "@" separates the two, and no two attachments share a name.
func (k attachmentKey) recordName() string { return k.ContainerID + "@" + k.IfName + ".json" }

// legacyRecordName is the name earlier versions used ("<id>_<ifname>.json"), which two
// attachments can share ("a_b"+"c" and "a"+"b_c"): such a file counts only when its content
// names the attachment.
func (k attachmentKey) legacyRecordName() string { return k.ContainerID + "_" + k.IfName + ".json" }

// parseRecordName is the inverse of recordName; false for any other name.
func parseRecordName(name string) (attachmentKey, bool) {
	base, ok := strings.CutSuffix(name, ".json")
	if !ok {
		return attachmentKey{}, false
	}
	id, ifName, ok := strings.Cut(base, "@")
	k := attachmentKey{id, ifName}
	return k, ok && k.attachment().Validate() == nil
}
