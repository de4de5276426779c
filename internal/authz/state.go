package authz

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
)

// MaxStateEntries bounds pins plus machine records in the state file.
const MaxStateEntries = 200_000

// maxStateBytes bounds the state file read at start.
const maxStateBytes = 64 << 20

// stateVersion names the state file's format.
const stateVersion = "authz-state.steward-trustd.dev/v1"

// Pin is an address's first accepted binding to a machine.
type Pin struct {
	Machine string    `json:"machine"`
	Since   time.Time `json:"since"`
}

// stateFile is the state's form on disk.
type stateFile struct {
	APIVersion string `json:"apiVersion"`
	// Pins maps an address to the machine it was first signed for.
	Pins map[netip.Addr]Pin `json:"pins"`
	// FirstSeen is when a machine whose source gives no creation time
	// first appeared; the join window counts from it.
	FirstSeen map[string]time.Time `json:"firstSeen"`
	// Joined is when a machine got its first certificate.
	Joined map[string]time.Time `json:"joined"`
}

// State holds pins and join records durably: every change is written
// (atomically) before the decision that made it is answered, so a
// restart forgets nothing that was acted on. Path "" keeps it in memory
// (tests only).
type State struct {
	path string
	mu   sync.Mutex
	f    stateFile
}

// OpenState loads the state at path, or starts an empty one when the
// file does not exist yet.
func OpenState(path string) (*State, error) {
	st := &State{path: path, f: stateFile{APIVersion: stateVersion, Pins: map[netip.Addr]Pin{}, FirstSeen: map[string]time.Time{}, Joined: map[string]time.Time{}}}
	if path == "" {
		return st, nil
	}
	data, err := ReadFileLimited(path, maxStateBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("authorizer state: %w", err)
	}
	if err := decodeState(data, &st.f); err != nil {
		return nil, fmt.Errorf("authorizer state %s: %w (it is written only by this program: restore it from a backup rather than delete it, or pins are lost)", path, err)
	}
	return st, nil
}

func decodeState(data []byte, f *stateFile) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(f); err != nil {
		return fmt.Errorf("malformed: %w", err)
	}
	if f.APIVersion != stateVersion {
		return fmt.Errorf("apiVersion %q, want %q", f.APIVersion, stateVersion)
	}
	if f.Pins == nil {
		f.Pins = map[netip.Addr]Pin{}
	}
	if f.FirstSeen == nil {
		f.FirstSeen = map[string]time.Time{}
	}
	if f.Joined == nil {
		f.Joined = map[string]time.Time{}
	}
	return nil
}

// ReadFileLimited reads path, failing when it is larger than limit
// bytes: a state or inventory file is never read without a bound.
func ReadFileLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}

// Pin returns the pin of a, if any.
func (st *State) Pin(a netip.Addr) (Pin, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	p, ok := st.f.Pins[a.Unmap()]
	return p, ok
}

// Pins returns a copy of all pins.
func (st *State) Pins() map[netip.Addr]Pin {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make(map[netip.Addr]Pin, len(st.f.Pins))
	for a, p := range st.f.Pins {
		out[a] = p
	}
	return out
}

// Unpin removes a's pin (an address legitimately given to another
// machine) and writes the state. It reports whether there was one.
func (st *State) Unpin(a netip.Addr) (bool, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	p, ok := st.f.Pins[a.Unmap()]
	if !ok {
		return false, nil
	}
	delete(st.f.Pins, a.Unmap())
	if err := st.saveLocked(); err != nil {
		st.f.Pins[a.Unmap()] = p
		return false, err
	}
	return true, nil
}

// joined returns when machine got its first certificate.
func (st *State) joined(machine string) (time.Time, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	t, ok := st.f.Joined[machine]
	return t, ok
}

// firstSeen returns when machine was first seen.
func (st *State) firstSeen(machine string) (time.Time, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	t, ok := st.f.FirstSeen[machine]
	return t, ok
}

// recordIssue pins a to machine and records its join, unless another
// decision pinned a to a different machine in the meantime (then it
// returns that pin and false). It writes the state before returning.
func (st *State) recordIssue(a netip.Addr, machine string, now time.Time) (Pin, bool, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	a = a.Unmap()
	if p, ok := st.f.Pins[a]; ok {
		if p.Machine != machine {
			return p, false, nil
		}
		if _, joined := st.f.Joined[machine]; joined {
			return p, true, nil
		}
	}
	if st.entriesLocked() >= MaxStateEntries {
		return Pin{}, false, fmt.Errorf("authorizer state holds %d entries, the limit: remove pins of retired machines (steward-trustd-authorizer unpin)", MaxStateEntries)
	}
	pin := Pin{Machine: machine, Since: now.UTC()}
	st.f.Pins[a] = pin
	_, hadJoin := st.f.Joined[machine]
	if !hadJoin {
		st.f.Joined[machine] = now.UTC()
	}
	if err := st.saveLocked(); err != nil {
		delete(st.f.Pins, a)
		if !hadJoin {
			delete(st.f.Joined, machine)
		}
		return Pin{}, false, err
	}
	return pin, true, nil
}

// observe records first-seen times for machines without a creation
// time and forgets machines that left the inventory (one that comes
// back starts a new window). It writes the state when it changed.
func (st *State) observe(s *Snapshot, now time.Time) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	changed := false
	for _, m := range s.machines {
		if _, ok := st.f.FirstSeen[m.Name]; !ok && m.Created.IsZero() && st.entriesLocked() < MaxStateEntries {
			st.f.FirstSeen[m.Name] = now.UTC()
			changed = true
		}
	}
	for name := range st.f.FirstSeen {
		if _, ok := s.byName[name]; !ok {
			delete(st.f.FirstSeen, name)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return st.saveLocked()
}

func (st *State) entriesLocked() int {
	return len(st.f.Pins) + len(st.f.FirstSeen) + len(st.f.Joined)
}

func (st *State) saveLocked() error {
	if st.path == "" {
		return nil
	}
	data, err := json.MarshalIndent(&st.f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode authorizer state: %w", err)
	}
	if err := atomicfile.Write(st.path, append(data, '\n'), 0o600, true); err != nil {
		return fmt.Errorf("write authorizer state: %w (check that the state directory is writable)", err)
	}
	return nil
}
