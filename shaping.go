package kubenet

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

// limits converts a validated Bandwidth (nil: none) to the shaper's terms.
func (b *Bandwidth) limits() shaping.Limits {
	if b == nil {
		return shaping.Limits{}
	}
	return shaping.Limits{
		Ingress: shaping.Limit{Rate: b.IngressRate, Burst: b.IngressBurst},
		Egress:  shaping.Limit{Rate: b.EgressRate, Burst: b.EgressBurst},
	}
}

// shaping applies the attachment's bandwidth limits and pushes their removal onto undo.
func (a *addition) shaping(undo *undoStack) error {
	l := a.cfg.Runtime.Bandwidth.limits()
	if l.IsZero() {
		return nil
	}
	// Pushed first: Apply cleans up after itself, but a later step's failure must remove the
	// ifb too (the qdiscs on the veth go with the veth).
	undo.push(func() error { return shaping.Remove(a.names.HostVeth, a.names.IFB) })
	return shaping.Apply(a.names.HostVeth, a.names.IFB, l)
}

// checkShaping verifies the attachment's qdiscs and ifb (CHECK) against the limits its record
// holds: those are what ADD applied, after resolving capability and annotations.
func checkShaping(cfg *Config, att Attachment, names Names, rec *Record) error {
	return shaping.Check(names.HostVeth, names.IFB, rec.Bandwidth.limits())
}
