// Package issuelog is steward-trustd's tamper-evident issuance log: an
// append-only Merkle tree (RFC 6962 hashing, golang.org/x/mod/sumdb/tlog)
// of every decision of the daemon and every ceremony receipt, with
// checkpoints in the C2SP tlog-checkpoint/signed-note format signed by a
// separate log key, served read-only in the C2SP tlog-tiles layout.
//
// An entry is durable (written and fsynced, batched by group commit)
// before Append returns, so a certificate is never sent that the log does
// not hold. Checkpoints are signed in batches (every Interval or every
// BatchEntries entries), so a slow log key (a TPM) costs one signature a
// second, not one per certificate.
//
// On disk, in the log directory: entries.log (the entries, each framed
// with its length and CRC-32C), checkpoint (the latest signed checkpoint)
// and checkpoints/<size> (every checkpoint signed, for verifiers to check
// consistency between them).
package issuelog

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
)

// File names in the log directory.
const (
	FileEntries     = "entries.log"
	FileCheckpoint  = "checkpoint"
	DirCheckpoints  = "checkpoints"
	FileVerifier    = "log.pub" // the verifier key, written by steward-trustd-ceremony log init
	defaultInterval = time.Second
	defaultBatch    = 1024
	maxGroup        = 512 // entries per fsync
)

// ErrUnavailable wraps every failure to append: the caller must not
// issue (the daemon answers Unavailable).
var ErrUnavailable = errors.New("issuance log cannot append")

// Options configure a Log.
type Options struct {
	// Signer signs checkpoints with the log key (NewNoteSigner). Required.
	Signer *NoteSigner
	// Interval is the longest time an entry waits for a checkpoint
	// (default 1 s); BatchEntries signs earlier after that many entries
	// (default 1024).
	Interval     time.Duration
	BatchEntries int
	// Logger receives one line per change of state. Nil discards.
	Logger *slog.Logger
	// OnHealth, if set, learns every change of the append state (nil
	// error: healthy).
	OnHealth func(error)
}

// Log is an open issuance log. It is safe for concurrent use.
type Log struct {
	dir  string
	f    *os.File
	opt  Options
	reqs chan *appendReq
	kick chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup

	mu         sync.RWMutex
	offsets    []int64 // start of each record in entries.log
	end        int64   // end of the last good record
	hashes     []tlog.Hash
	appendErr  error
	checkpoint []byte
	signed     int64 // size of the latest signed checkpoint
}

type appendReq struct {
	entry []byte
	done  chan appendResult
}

type appendResult struct {
	index int64
	err   error
}

// Open opens (creating if needed) the log in dir, cuts a torn tail record
// a crash left, rebuilds the tree, checks it against the latest signed
// checkpoint, and starts the writer and the checkpoint signer.
func Open(dir string, opt Options) (*Log, error) {
	if opt.Signer == nil {
		return nil, errors.New("issuance log: no log key")
	}
	opt = opt.withDefaults()
	if err := os.MkdirAll(filepath.Join(dir, DirCheckpoints), 0o755); err != nil {
		return nil, fmt.Errorf("issuance log: directory %s is not writable: %w (fix its owner and mode, or set TRUSTD_LOG=off)", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, FileEntries), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("issuance log: directory %s is not writable: %w (fix its owner and mode, or set TRUSTD_LOG=off)", dir, err)
	}
	l := &Log{dir: dir, f: f, opt: opt, reqs: make(chan *appendReq, maxGroup), kick: make(chan struct{}, 1), stop: make(chan struct{})}
	if err := l.load(); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	l.wg.Add(2)
	go l.writer()
	go l.signer()
	return l, nil
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = defaultInterval
	}
	if o.BatchEntries <= 0 {
		o.BatchEntries = defaultBatch
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// load locks the log, reads the entries, cuts a torn tail and checks the
// latest checkpoint.
func (l *Log) load() error {
	if err := lockFile(l.f); err != nil {
		return fmt.Errorf("issuance log %s is in use by another process: %w", l.dir, err)
	}
	data, err := os.ReadFile(l.f.Name())
	if err != nil {
		return fmt.Errorf("issuance log: read: %w", err)
	}
	entries, good, err := readRecords(data)
	if errors.Is(err, errTorn) {
		l.opt.Logger.Warn("issuance log: cut a record torn by a crash (it was never acknowledged)", "file", l.f.Name(), "at", good, "bytes", len(data)-int(good))
		if err := l.f.Truncate(good); err != nil {
			return fmt.Errorf("issuance log: cut torn record: %w", err)
		}
	}
	if err := l.addHashes(entries, 0); err != nil {
		return err
	}
	l.end = good
	return l.loadCheckpoint()
}

// addHashes appends the entries' record offsets and tree hashes; start
// is the first entry's offset in entries.log.
func (l *Log) addHashes(entries [][]byte, start int64) error {
	for _, e := range entries {
		n := int64(len(l.offsets))
		hs, err := tlog.StoredHashes(n, e, l.hashReader())
		if err != nil {
			return fmt.Errorf("issuance log: hash entry %d: %w", n, err)
		}
		l.hashes = append(l.hashes, hs...)
		l.offsets = append(l.offsets, start)
		start += int64(recordHeader + len(e))
	}
	return nil
}

// loadCheckpoint reads the latest checkpoint and refuses a log whose
// entries no longer give its root: entries were altered or lost.
func (l *Log) loadCheckpoint() error {
	raw, err := os.ReadFile(filepath.Join(l.dir, FileCheckpoint))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("issuance log: %w", err)
	}
	cp, err := ParseCheckpoint(raw, l.opt.Signer.Verifier())
	if err != nil {
		return fmt.Errorf("issuance log %s: latest checkpoint: %w", l.dir, err)
	}
	if cp.Size > int64(len(l.offsets)) {
		return fmt.Errorf("issuance log %s: the checkpoint covers %d entries but only %d remain: entries were removed; run steward-trustd-ceremony log verify", l.dir, cp.Size, len(l.offsets))
	}
	root, err := tlog.TreeHash(cp.Size, l.hashReader())
	if err != nil || root != cp.Root {
		return fmt.Errorf("issuance log %s: the entries do not give the root of the checkpoint of size %d: the log was altered; run steward-trustd-ceremony log verify", l.dir, cp.Size)
	}
	l.checkpoint, l.signed = raw, cp.Size
	return nil
}

// hashReader reads the stored hashes; callers hold l.mu or own l.
func (l *Log) hashReader() tlog.HashReader {
	return tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			if x < 0 || x >= int64(len(l.hashes)) {
				return nil, fmt.Errorf("hash %d not stored", x)
			}
			out[i] = l.hashes[x]
		}
		return out, nil
	})
}

// Append adds one entry and returns its index once it is durable. An
// error wraps ErrUnavailable: nothing that depends on the entry may be
// released. An entry whose caller gave up (ctx) may still be stored.
func (l *Log) Append(ctx context.Context, entry []byte) (int64, error) {
	if len(entry) == 0 || len(entry) > MaxEntry {
		return 0, fmt.Errorf("%w: entry of %d bytes (1 to %d)", ErrUnavailable, len(entry), MaxEntry)
	}
	r := &appendReq{entry: entry, done: make(chan appendResult, 1)}
	select {
	case l.reqs <- r:
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	case <-l.stop:
		return 0, fmt.Errorf("%w: closed", ErrUnavailable)
	}
	res := <-r.done
	return res.index, res.err
}

// writer is the group commit: it takes every waiting entry (up to
// maxGroup), writes them with one write and one fsync, then answers all.
func (l *Log) writer() {
	defer l.wg.Done()
	for {
		var batch []*appendReq
		select {
		case r := <-l.reqs:
			batch = append(batch, r)
		case <-l.stop:
			return
		}
		for len(batch) < maxGroup && len(l.reqs) > 0 {
			batch = append(batch, <-l.reqs)
		}
		l.commit(batch)
	}
}

// commit writes a batch durably; on failure it cuts what was written,
// so that no unacknowledged entry stays in the log.
func (l *Log) commit(batch []*appendReq) {
	var buf []byte
	entries := make([][]byte, len(batch))
	for i, r := range batch {
		buf = appendRecord(buf, r.entry)
		entries[i] = r.entry
	}
	first := int64(len(l.offsets))
	err := l.write(buf)
	if err == nil {
		l.mu.Lock()
		err = l.addHashes(entries, l.end)
		l.end += int64(len(buf))
		l.mu.Unlock()
	}
	l.setHealth(err)
	for i, r := range batch {
		if err != nil {
			r.done <- appendResult{err: fmt.Errorf("%w: %w", ErrUnavailable, err)}
			continue
		}
		r.done <- appendResult{index: first + int64(i)}
	}
	if int64(len(l.offsets))-l.signedSize() >= int64(l.opt.BatchEntries) {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// write appends buf at the end of the good records and fsyncs.
func (l *Log) write(buf []byte) error {
	_, err := l.f.WriteAt(buf, l.end)
	if err == nil {
		err = l.f.Sync()
	}
	if err != nil {
		if terr := l.f.Truncate(l.end); terr != nil {
			return fmt.Errorf("write %s: %w; cutting the partial write failed too: %w (restart the daemon: opening the log cuts it)", l.f.Name(), err, terr)
		}
		return fmt.Errorf("write %s: %w (disk full or failing? free space or fix the device; requests are refused meanwhile)", l.f.Name(), err)
	}
	return nil
}

// setHealth records the append state and logs and reports each change.
func (l *Log) setHealth(err error) {
	l.mu.Lock()
	was := l.appendErr
	l.appendErr = err
	l.mu.Unlock()
	if (was == nil) == (err == nil) {
		return
	}
	if err != nil {
		l.opt.Logger.Error("issuance log failing: certificates are refused until it can append", "error", err)
	} else {
		l.opt.Logger.Info("issuance log recovered", "previous_error", was.Error())
	}
	if l.opt.OnHealth != nil {
		l.opt.OnHealth(err)
	}
}

// Healthy is nil while the log appends, else the last append error.
func (l *Log) Healthy() error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.appendErr
}

// Size is the number of durable entries.
func (l *Log) Size() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return int64(len(l.offsets))
}

func (l *Log) signedSize() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.signed
}

// Checkpoint is the latest signed checkpoint (nil before the first).
func (l *Log) Checkpoint() []byte {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.checkpoint
}

// signer signs a checkpoint every Interval, or when kicked, if the log
// grew (and once at start if none was ever signed).
func (l *Log) signer() {
	defer l.wg.Done()
	t := time.NewTicker(l.opt.Interval)
	defer t.Stop()
	var failing bool
	for {
		err := l.SignCheckpoint()
		if (err != nil) != failing {
			failing = err != nil
			l.logSignState(err)
		}
		select {
		case <-t.C:
		case <-l.kick:
		case <-l.stop:
			return
		}
	}
}

func (l *Log) logSignState(err error) {
	if err != nil {
		l.opt.Logger.Error("issuance log: checkpoint signing failing (entries are still durable; checkpoints lag)", "error", err)
		return
	}
	l.opt.Logger.Info("issuance log: checkpoint signing recovered")
}

// SignCheckpoint signs a checkpoint of the current size if it is newer
// than the latest, and publishes it (checkpoint and checkpoints/<size>).
func (l *Log) SignCheckpoint() error {
	l.mu.RLock()
	size, signed, have := int64(len(l.offsets)), l.signed, l.checkpoint != nil
	root, err := tlog.TreeHash(size, l.hashReader())
	l.mu.RUnlock()
	if err != nil || (have && size <= signed) {
		return err
	}
	text := FormatCheckpoint(l.opt.Signer.Name(), size, root)
	msg, err := note.Sign(&note.Note{Text: text}, l.opt.Signer)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(l.dir, DirCheckpoints, strconv.FormatInt(size, 10)), msg, 0o644, true); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(l.dir, FileCheckpoint), msg, 0o644, true); err != nil {
		return err
	}
	l.mu.Lock()
	l.checkpoint, l.signed = msg, size
	l.mu.Unlock()
	return nil
}

// Close signs a last checkpoint and stops. Appends after Close fail.
func (l *Log) Close() error {
	close(l.stop)
	l.wg.Wait()
	err := l.SignCheckpoint()
	return errors.Join(err, l.f.Close())
}

// FormatCheckpoint is the C2SP tlog-checkpoint body: origin, tree size,
// base64 root hash, one per line.
func FormatCheckpoint(origin string, size int64, root tlog.Hash) string {
	return fmt.Sprintf("%s\n%d\n%s\n", origin, size, base64.StdEncoding.EncodeToString(root[:]))
}
