package shaping

import (
	"fmt"
	"math"
	"time"
)

// The pod annotations kubelet defined for bandwidth; values are Kubernetes quantities in bit/s.
const (
	IngressAnnotation = "kubernetes.io/ingress-bandwidth"
	EgressAnnotation  = "kubernetes.io/egress-bandwidth"
)

// Keys of the bandwidth capability, as error messages name them.
const (
	capabilityKey = "runtimeConfig.bandwidth."
	ingressRate   = capabilityKey + "ingressRate"
	ingressBurst  = capabilityKey + "ingressBurst"
	egressRate    = capabilityKey + "egressRate"
	egressBurst   = capabilityKey + "egressBurst"
)

// RuntimeDefaultBurst is the smallest burst (in bits) that runtimes send when the pod asked for
// none: containerd sends 2^32-1 bits, CRI-O 2^35-1 or 2^35-8 bits ("just under 4 GiB"). Taken
// literally it would let the first 512 MB or 4 GB pass unshaped (kubernetes#90838), and no pod
// spec can ask for a burst anyway, so every burst from here up means "choose one".
const RuntimeDefaultBurst uint64 = math.MaxUint32

// MaxBurstTime bounds an explicit burst: the kernel keeps tbf's bucket as a time in 64 ns ticks
// in 32 bits (274 s), so a bucket that takes longer than this to fill at the rate cannot be
// expressed. Such bursts are refused rather than silently cut.
const MaxBurstTime = 240 * time.Second

// burstTime is how much of the rate the default burst holds. tbf refills its bucket when a timer
// fires; with the coarsest common kernel tick (HZ=100) that is every 10 ms, so a bucket smaller
// than 10 ms of traffic would leave the link idle between ticks and never reach the rate. Larger
// buckets only let more traffic pass unshaped at the start.
const burstTime = 10 * time.Millisecond

// Limit is the shaping of one direction.
type Limit struct {
	Rate  uint64 // bit/s; 0 means unshaped
	Burst uint64 // bits; 0 means DefaultBurst
}

// Limits are the shaping of a pod: Ingress is traffic towards the pod, Egress traffic from it.
type Limits struct {
	Ingress, Egress Limit
}

// IsZero reports whether l shapes nothing.
func (l Limits) IsZero() bool { return l.Ingress.Rate == 0 && l.Egress.Rate == 0 }

// ValueError is an invalid bandwidth value: Key names where it came from (an annotation or a
// capability key), Value is the value as given.
type ValueError struct {
	Key    string
	Value  any
	Reason string
}

func (e *ValueError) Error() string {
	if s, ok := e.Value.(string); ok {
		return fmt.Sprintf("invalid %s %q: %s", e.Key, s, e.Reason)
	}
	return fmt.Sprintf("invalid %s %v: %s", e.Key, e.Value, e.Reason)
}

// Resolve derives a pod's limits from the bandwidth capability (nil when the runtime sent none)
// and the pod annotations.
//
// Precedence, per direction: the capability's rate when it is not 0, else the annotation. The
// runtime computes the capability from these same annotations, so normally they agree; when they
// do not, the runtime's number is what it told the user it would apply. A direction the
// capability leaves at 0 falls back to the annotation, because a runtime that passes annotations
// but not bandwidth (or an older one that knows only one direction) must not silently drop a
// limit the pod asked for. Every value given is validated, also one that is overridden, so a bad
// annotation fails the same way on every runtime.
//
// Bursts come only from the capability. The result holds 0 for "default" (see DefaultBurst),
// also where the runtime sent its placeholder (RuntimeDefaultBurst and above).
func Resolve(capability *Limits, annotations map[string]string) (Limits, error) {
	var out Limits
	if capability != nil {
		var err error
		if out.Ingress, err = capabilityLimit(capability.Ingress, ingressRate, ingressBurst); err != nil {
			return Limits{}, err
		}
		if out.Egress, err = capabilityLimit(capability.Egress, egressRate, egressBurst); err != nil {
			return Limits{}, err
		}
	}
	for _, d := range []struct {
		key   string
		limit *Limit
	}{{IngressAnnotation, &out.Ingress}, {EgressAnnotation, &out.Egress}} {
		s, ok := annotations[d.key]
		if !ok {
			continue
		}
		rate, err := ParseRate(s)
		if err != nil {
			return Limits{}, &ValueError{Key: d.key, Value: s, Reason: err.Error()}
		}
		if d.limit.Rate == 0 {
			d.limit.Rate = rate
		}
	}
	return out, nil
}

func capabilityLimit(l Limit, rateKey, burstKey string) (Limit, error) {
	if l.Burst >= RuntimeDefaultBurst {
		l.Burst = 0
	}
	if l.Rate == 0 {
		if l.Burst != 0 {
			return Limit{}, &ValueError{Key: rateKey, Value: l.Rate, Reason: fmt.Sprintf("%s %d needs a rate", burstKey, l.Burst)}
		}
		return Limit{}, nil
	}
	if err := checkRate(l.Rate); err != nil {
		return Limit{}, &ValueError{Key: rateKey, Value: l.Rate, Reason: err.Error()}
	}
	if l.Burst != 0 && float64(l.Burst)/float64(l.Rate) > MaxBurstTime.Seconds() {
		return Limit{}, &ValueError{Key: burstKey, Value: l.Burst,
			Reason: fmt.Sprintf("takes more than %v to drain at %d bit/s, longer than tbf can hold", MaxBurstTime, l.Rate)}
	}
	return l, nil
}

// DefaultBurst is the burst (bits) used when none was given: 10 ms of traffic at rate (see
// burstTime), but at least two full-size frames of a link with the given MTU, since tbf drops
// a packet larger than its bucket.
func DefaultBurst(rate uint64, mtu int) uint64 {
	b := uint64(math.Ceil(float64(rate) * burstTime.Seconds()))
	return max(b, minBurst(mtu))
}

// minBurst is two frames (MTU plus Ethernet header, as tbf counts them) in bits.
func minBurst(mtu int) uint64 {
	const ethHeader = 14
	return 2 * uint64(mtu+ethHeader) * 8
}

// effectiveBurst is the burst tbf gets: the given one, or the default; an explicit burst below
// one frame is raised to minBurst, because it would drop every full-size packet.
func (l Limit) effectiveBurst(mtu int) uint64 {
	if l.Burst == 0 {
		return DefaultBurst(l.Rate, mtu)
	}
	return max(l.Burst, minBurst(mtu))
}
