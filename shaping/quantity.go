package shaping

import (
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// Bounds of a rate, as kubelet's ExtractPodBandwidthResources enforces them on the bandwidth
// annotations: below 1k the shaper is useless, above 1P the number is a typo.
const (
	MinRate uint64 = 1_000                 // 1k bit/s
	MaxRate uint64 = 1_000_000_000_000_000 // 1P bit/s
)

// multiplier returns a Kubernetes quantity suffix's multiplier as base^exp: the decimal SI
// suffixes (m, k, M ... E; "K" is not one), the binary ones (Ki ... Ei) and decimal exponents
// ("e6", "E-3").
func multiplier(suffix string) (base, exp int64, err error) {
	const decimal = "m kMGTPE" // index i has exponent 3*(i-1)
	const binary = "KMGTPE"    // index i + "i" has exponent 10*(i+1)
	switch {
	case suffix == "":
		return 10, 0, nil
	case len(suffix) == 1 && suffix != " " && strings.Contains(decimal, suffix):
		return 10, 3 * int64(strings.Index(decimal, suffix)-1), nil
	case len(suffix) == 2 && suffix[1] == 'i' && strings.IndexByte(binary, suffix[0]) >= 0:
		return 2, 10 * int64(strings.IndexByte(binary, suffix[0])+1), nil
	case len(suffix) > 1 && (suffix[0] == 'e' || suffix[0] == 'E'):
		e, err := strconv.ParseInt(suffix[1:], 10, 64)
		if err != nil || e < -maxExponent || e > maxExponent {
			return 0, 0, errQuantity
		}
		return 10, e, nil
	}
	return 0, 0, fmt.Errorf("unknown suffix %q: %w", suffix, errQuantity)
}

// maxExponent bounds a decimal exponent ("1e9") so a hostile annotation cannot make the parser
// build a number with millions of digits; anything near it is far outside [MinRate, MaxRate].
const maxExponent = 1000

var errQuantity = errors.New("not a Kubernetes quantity (such as 10M, 1.5G, 500k or 100Mi)")

// ParseQuantity parses a Kubernetes resource quantity ("10M", "1.5G", "100Mi", "1e6", "500k")
// and rounds it up to a whole number, as resource.Quantity.Value does. Negative values are
// refused; a value that does not fit uint64 gives an error.
func ParseQuantity(s string) (uint64, error) {
	num, suffix := splitQuantity(s)
	if num == "" {
		return 0, errQuantity
	}
	// num holds only a sign, digits and one dot (splitQuantity), which big.Rat reads as decimal.
	v, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, errQuantity
	}
	base, exp, err := multiplier(suffix)
	if err != nil {
		return 0, err
	}
	scale := new(big.Int).Exp(big.NewInt(base), big.NewInt(abs(exp)), nil)
	if exp >= 0 {
		v.Mul(v, new(big.Rat).SetInt(scale))
	} else {
		v.Quo(v, new(big.Rat).SetInt(scale))
	}
	if v.Sign() < 0 {
		return 0, errors.New("must not be negative")
	}
	// Round up: "0.5" of anything is a request for some bandwidth, never for none.
	q, r := new(big.Int).QuoRem(v.Num(), v.Denom(), new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsUint64() {
		return 0, errors.New("too large")
	}
	return q.Uint64(), nil
}

// splitQuantity splits s into its signed decimal number and its suffix.
func splitQuantity(s string) (num, suffix string) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		if s[i] != '.' {
			digits++
		}
		i++
	}
	if digits == 0 || strings.Count(s[:i], ".") > 1 {
		return "", ""
	}
	return s[:i], s[i:]
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// ParseRate parses a bandwidth annotation value (bit/s) and checks it is within [MinRate, MaxRate].
func ParseRate(s string) (uint64, error) {
	v, err := ParseQuantity(s)
	if err != nil {
		return 0, err
	}
	return v, checkRate(v)
}

func checkRate(v uint64) error {
	if v < MinRate {
		return errors.New("below the minimum of 1k bit/s")
	}
	if v > MaxRate {
		return errors.New("above the maximum of 1P bit/s")
	}
	return nil
}
