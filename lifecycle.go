package kubenet

import (
	"context"
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

// errNotYet marks verbs that are not implemented yet, so they fail loudly instead of pretending.
func errNotYet(verb string) error {
	return types.NewError(types.ErrInternal, fmt.Sprintf("%s is not implemented in this kubenet build", verb), "")
}

// Check verifies an attachment.
func Check(ctx context.Context, cfg *Config, att Attachment) error { return errNotYet("CHECK") }

// Status reports whether an ADD can succeed.
func Status(ctx context.Context, cfg *Config) error { return errNotYet("STATUS") }

// GC removes attachments not in valid.
func GC(ctx context.Context, cfg *Config, valid []ValidAttachment) error { return errNotYet("GC") }
