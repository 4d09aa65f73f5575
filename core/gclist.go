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

// ParseValidAttachments reads the GC list (cni.dev/valid-attachments, or the older
// cni.dev/attachments) from the configuration.
func ParseValidAttachments(stdin []byte) ([]ValidAttachment, error) {
	var conf struct {
		Valid  []ValidAttachment `json:"cni.dev/valid-attachments"`
		Legacy []ValidAttachment `json:"cni.dev/attachments"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode GC attachments: %v", err), "")
	}
	return append(conf.Valid, conf.Legacy...), nil
}
