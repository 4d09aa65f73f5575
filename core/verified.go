package core

import (
	"slices"
	"sync"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// maxVerifiedPairs bounds the file: a pair per mechanism (isolation, host ports, SNAT) and plan
// (a configuration, a release) on this kernel; older pairs go first.
const maxVerifiedPairs = 16

type verifiedPair struct {
	Plan   string `json:"plan"`
	Kernel string `json:"kernel"`
}

// verifiedRules is the nft.Verified of one network's directory, read once per verb. Another
// process learning at the same time may lose its pair: it is compared in full again and learned
// once more, nothing worse. A file that cannot be read or decoded remembers nothing.
type verifiedRules struct {
	root   *safedir.Dir // the network's directory
	binary string       // nft.BuildID
	mu     sync.Mutex
	loaded bool
	pairs  []verifiedPair
}

func newVerifiedRules(root *safedir.Dir) *verifiedRules {
	return &verifiedRules{root: root, binary: nft.BuildID()}
}

func (v *verifiedRules) Binary() string { return v.binary }

func (v *verifiedRules) read() []verifiedPair {
	var f struct {
		Pairs []verifiedPair `json:"pairs"`
	}
	if found, err := readNodeFile(v.root, VerifiedRulesFile, &f); err != nil || !found {
		return nil
	}
	return f.Pairs
}

func (v *verifiedRules) Known(plan, kernel nft.Digest) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.loaded {
		v.pairs, v.loaded = v.read(), true
	}
	return slices.Contains(v.pairs, verifiedPair{plan.String(), kernel.String()})
}

func (v *verifiedRules) Learn(plan, kernel nft.Digest) {
	v.mu.Lock()
	defer v.mu.Unlock()
	p := verifiedPair{plan.String(), kernel.String()}
	pairs := slices.DeleteFunc(v.read(), func(q verifiedPair) bool { return q == p })
	pairs = append(pairs, p)
	pairs = pairs[max(0, len(pairs)-maxVerifiedPairs):]
	if writeNodeFile(v.root, VerifiedRulesFile, struct {
		Pairs []verifiedPair `json:"pairs"`
	}{pairs}) == nil {
		v.pairs, v.loaded = pairs, true
	}
}
