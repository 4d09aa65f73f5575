package kubenet

// validateBandwidth checks the bandwidth capability and the bandwidth pod annotations in rc.
func validateBandwidth(rc *RuntimeConfig) error {
	return nil
}

// shaping applies the attachment's bandwidth limits and pushes their removal onto undo.
func (a *addition) shaping(undo *undoStack) error {
	return nil
}

// delShaping removes the attachment's shaping (qdiscs on the host veth, its ifb).
func delShaping(cfg *Config, att Attachment, names Names) error {
	return nil
}
