package core

// SupportedVersions returns the CNI spec versions kubenet accepts and replies in.
func SupportedVersions() []string { return []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} }
