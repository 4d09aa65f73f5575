package core

import (
	"encoding/json"
	"path/filepath"
)

// The bounds of logMaxBytes: a line must fit, and the log must not fill the node's disk.
const (
	DefaultLogMaxBytes = 10 << 20
	minLogMaxBytes     = 4 << 10
	maxLogMaxBytes     = 1 << 30
)

// LogSettings say where the CNI binary logs one line per call (logFile; "" is off, the
// default) and how large the file may grow before it is rotated (logMaxBytes).
type LogSettings struct {
	File     string
	MaxBytes int64
}

// newLogSettings checks the logFile and logMaxBytes keys.
func newLogSettings(file string, maxBytes int64) (LogSettings, error) {
	s := LogSettings{File: file, MaxBytes: maxBytes}
	if s.File != "" && (!filepath.IsAbs(s.File) || filepath.Clean(s.File) != s.File || s.File == "/") {
		return LogSettings{}, configError("logFile", s.File, "must be a clean absolute file path")
	}
	if s.MaxBytes == 0 {
		s.MaxBytes = DefaultLogMaxBytes
	}
	if s.MaxBytes < minLogMaxBytes || s.MaxBytes > maxLogMaxBytes {
		return LogSettings{}, configError("logMaxBytes", s.MaxBytes, "must be between %d and %d (0: %d)", minLogMaxBytes, maxLogMaxBytes, DefaultLogMaxBytes)
	}
	return s, nil
}

// ParseLogSettings reads only the log keys of a configuration, so that a call whose
// configuration is otherwise invalid can still be logged. Errors are ParseConfig's for those
// keys.
func ParseLogSettings(stdin []byte) (LogSettings, error) {
	var nc struct {
		LogFile     string `json:"logFile"`
		LogMaxBytes int64  `json:"logMaxBytes"`
	}
	if err := json.Unmarshal(stdin, &nc); err != nil {
		return LogSettings{}, err
	}
	return newLogSettings(nc.LogFile, nc.LogMaxBytes)
}
