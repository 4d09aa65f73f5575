package kubenet

// hostPorts programs the attachment's port mappings (a.cfg.Runtime.PortMappings) for its
// addresses (a.ips) and pushes their removal onto undo.
func (a *addition) hostPorts(undo *undoStack) error {
	return nil
}

// delHostPorts removes every host-port rule of the attachment. rec may be nil (no record on disk)
// and cfg.Runtime.PortMappings may be empty (runtime sent nothing on DEL).
func delHostPorts(cfg *Config, att Attachment, rec *Record, networkDir string) error {
	return nil
}
