package core

import (
	"errors"

	"github.com/kubenet-dev/kubenet/shaping"
)

// validateBandwidth checks the bandwidth capability and the bandwidth pod annotations in rc and
// replaces rc.Bandwidth with the limits that ADD will apply (capability first, annotations where
// it is silent; see shaping.Resolve), bursts normalised so that 0 means "default". nil means no
// shaping. The attachment record then holds what was applied, whichever way it arrived.
func validateBandwidth(rc *RuntimeConfig) error {
	var capability *shaping.Limits
	if rc.Bandwidth != nil {
		c := rc.Bandwidth.limits()
		capability = &c
	}
	l, err := shaping.Resolve(capability, rc.PodAnnotations)
	var ve *shaping.ValueError
	if errors.As(err, &ve) {
		return configError(ve.Key, ve.Value, "%s", ve.Reason)
	}
	if err != nil {
		return err
	}
	rc.Bandwidth = nil
	if !l.IsZero() {
		rc.Bandwidth = &Bandwidth{
			IngressRate: l.Ingress.Rate, IngressBurst: l.Ingress.Burst,
			EgressRate: l.Egress.Rate, EgressBurst: l.Egress.Burst,
		}
	}
	return nil
}

// shaping applies the attachment's bandwidth limits.
func (a *addition) shaping(*undoStack) error {
	l := a.cfg.Runtime.Bandwidth.limits()
	if l.IsZero() {
		return nil
	}
	// No undo of its own: shaping is the last step, Apply cleans up after itself, and the veth's
	// undo (delLinks) takes a leftover ifb with it.
	return shaping.Apply(a.host, a.names.IFB, l)
}

// BandwidthFromAnnotations resolves a pod's bandwidth annotations the way ADD does and returns
// them as the bandwidth capability a runtime sends (nil: no limit). Bursts are what containerd
// sends when a pod asks for none: plugins that know the convention (kubenet) choose their own,
// the reference bandwidth plugin needs a value.
func BandwidthFromAnnotations(annotations map[string]string) (*Bandwidth, error) {
	l, err := shaping.Resolve(nil, annotations)
	if err != nil || l.IsZero() {
		return nil, err
	}
	bw := &Bandwidth{}
	if l.Ingress.Rate > 0 {
		bw.IngressRate, bw.IngressBurst = l.Ingress.Rate, shaping.RuntimeDefaultBurst
	}
	if l.Egress.Rate > 0 {
		bw.EgressRate, bw.EgressBurst = l.Egress.Rate, shaping.RuntimeDefaultBurst
	}
	return bw, nil
}
