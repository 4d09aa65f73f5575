package ipam

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Store is the on-disk reservation store of one network: <dataDir>/<network>/.
type Store struct {
	dir  string
	lock *os.File
}

// Open creates the network's directory if needed and opens its lock file. Every Open has its own
// open file description, so two Stores of one directory exclude each other like two processes do.
func Open(dataDir, network string) (*Store, error) {
	// The name becomes a path element: refuse anything that would leave dataDir.
	if network == "" || network == "." || network == ".." || strings.ContainsRune(network, filepath.Separator) {
		return nil, fmt.Errorf("open store: invalid network name %q", network)
	}
	dir := filepath.Join(dataDir, network)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	// host-local flocks this same path (through go-filemutex), so both plugins take one lock. We
	// open it ourselves because go-filemutex leaves out O_CLOEXEC: a process we exec (iptables,
	// say) would inherit the lock and could hold it after we die.
	lk, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store lock in %s: %w", dir, err)
	}
	return &Store{dir: dir, lock: lk}, nil
}

// Dir is the network's directory.
func (s *Store) Dir() string { return s.dir }

// Lock takes the exclusive flock(2) on <dir>/lock, waiting for other holders.
func (s *Store) Lock() error {
	if err := flock(s.lock, unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", s.dir, err)
	}
	return nil
}

// TryLock takes the lock if it is free and reports whether it did, without waiting.
func (s *Store) TryLock() (bool, error) {
	err := flock(s.lock, unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", s.dir, err)
	}
	return true, nil
}

// Unlock releases the lock.
func (s *Store) Unlock() error {
	if err := flock(s.lock, unix.LOCK_UN); err != nil {
		return fmt.Errorf("unlock %s: %w", s.dir, err)
	}
	return nil
}

// Close closes the lock file, which releases the lock if held.
func (s *Store) Close() error {
	if err := s.lock.Close(); err != nil {
		return fmt.Errorf("close store %s: %w", s.dir, err)
	}
	return nil
}

// flock applies how to f, retrying when a signal interrupts the wait.
func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
