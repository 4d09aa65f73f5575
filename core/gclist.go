package core

import (
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// ValidAttachment is one entry of cni.dev/valid-attachments.
type ValidAttachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

func (v ValidAttachment) key() attachmentKey { return attachmentKey(v) }

// ParseValidAttachments reads the GC list (cni.dev/valid-attachments, or the older
// cni.dev/attachments) from the configuration. The list decides what GC deletes, so it is read
// strictly: a configuration without the list, or an entry that names no valid attachment (an
// empty or malformed container ID, a missing interface name), is an error, never "keep
// nothing". An entry without its interface name would otherwise protect nothing, and GC would
// delete the pod it was meant to keep. A null list is an empty one: that is how libcni sends a
// runtime's empty list.
func ParseValidAttachments(stdin []byte) ([]ValidAttachment, error) {
	var conf map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode GC attachments: %v", err), "")
	}
	var out []ValidAttachment
	found := false
	for _, key := range []string{"cni.dev/valid-attachments", "cni.dev/attachments"} {
		raw, ok := conf[key]
		if !ok {
			continue
		}
		found = true
		var entries []*ValidAttachment
		if err := json.Unmarshal(raw, &entries); err != nil {
			return nil, configError(key, string(raw), "not a list of attachments: %v", err)
		}
		for i, v := range entries {
			if v == nil {
				return nil, configError(fmt.Sprintf("%s[%d]", key, i), "null", "not an attachment")
			}
			out = append(out, *v)
		}
	}
	if !found {
		return nil, configError("cni.dev/valid-attachments", "(missing)", "GC needs the list of attachments to keep (an empty list keeps none)")
	}
	if err := ValidateAttachments(out); err != nil {
		return nil, err
	}
	return out, nil
}

// ValidateAttachments checks every entry of a GC list (Attachment.Validate), for the CNI binary
// and the in-process NetworkPlugin alike: code 7 naming the first bad entry.
func ValidateAttachments(valid []ValidAttachment) error {
	for i, v := range valid {
		if err := (Attachment{ContainerID: v.ContainerID, IfName: v.IfName}).Validate(); err != nil {
			return configError(fmt.Sprintf("cni.dev/valid-attachments[%d]", i), fmt.Sprintf("%+v", v), "%v", errMsg(err))
		}
	}
	return nil
}

// errMsg is the message of a CNI error without its code.
func errMsg(err error) string {
	if e, ok := err.(*types.Error); ok {
		return e.Msg
	}
	return err.Error()
}
