package kubenet

// SupportedVersions are the CNI spec versions kubenet accepts and replies in.
var SupportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}
