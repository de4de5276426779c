package issuelog

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/tlog"
)

// tileHeight is C2SP tlog-tiles' fixed tile height: 2^8 hashes a tile.
const tileHeight = 8

// maxPath bounds the request paths the handler parses.
const maxPath = 128

// Handler serves the log read-only in the C2SP tlog-tiles layout under
// prefix (e.g. "/log/"): checkpoint, tile/<L>/<N>[.p/<W>] (hashes),
// tile/entries/<N>[.p/<W>] (entry bundles), and checkpoints/<size>
// (every checkpoint signed, for verifiers checking consistency). Tiles
// are immutable and cached for a year; the checkpoint for a second.
func (l *Log) Handler(prefix string) http.Handler {
	return http.StripPrefix(strings.TrimSuffix(prefix, "/"), http.HandlerFunc(l.serve))
}

func (l *Log) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "read-only log: GET or HEAD", http.StatusMethodNotAllowed)
		return
	}
	p := strings.TrimPrefix(r.URL.Path, "/")
	if len(p) > maxPath {
		http.Error(w, "path too long", http.StatusBadRequest)
		return
	}
	body, immutable, err := l.resource(p)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if p == FileCheckpoint {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	w.Header().Set("Cache-Control", "public, max-age=1")
	if immutable {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	}
	_, _ = w.Write(body) // a client that went away is not the log's failure
}

// resource is the content at p and whether it never changes.
func (l *Log) resource(p string) ([]byte, bool, error) {
	switch {
	case p == FileCheckpoint:
		cp := l.Checkpoint()
		if cp == nil {
			return nil, false, errors.New("no checkpoint signed yet")
		}
		return cp, false, nil
	case strings.HasPrefix(p, DirCheckpoints+"/"):
		size, err := strconv.ParseInt(strings.TrimPrefix(p, DirCheckpoints+"/"), 10, 64)
		if err != nil || size < 0 || size > l.signedSize() {
			return nil, false, errors.New("no such checkpoint")
		}
		b, err := os.ReadFile(filepath.Join(l.dir, DirCheckpoints, strconv.FormatInt(size, 10)))
		return b, true, err
	case strings.HasPrefix(p, "tile/"):
		b, err := l.tile(p)
		return b, true, err
	}
	return nil, false, errors.New("not found: the log serves checkpoint, checkpoints/<size>, tile/<L>/<N> and tile/entries/<N>")
}

// tile reads a hash tile or an entry bundle. C2SP paths are Go sumdb's
// without the height element, so tlog parses them once it is put back.
func (l *Log) tile(p string) ([]byte, error) {
	t, err := tlog.ParseTilePath("tile/" + strconv.Itoa(tileHeight) + "/" + strings.Replace(strings.TrimPrefix(p, "tile/"), "entries/", "data/", 1))
	if err != nil {
		return nil, fmt.Errorf("not a tile path: %s", p)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if t.L < 0 {
		return l.bundle(t)
	}
	return tlog.ReadTileData(t, l.hashReader())
}

// bundle reads the entries of data tile t from entries.log; l.mu is held.
func (l *Log) bundle(t tlog.Tile) ([]byte, error) {
	first := t.N << tileHeight
	last := first + int64(t.W)
	if last > int64(len(l.offsets)) {
		return nil, errors.New("entries not in the log yet")
	}
	end := l.end
	if last < int64(len(l.offsets)) {
		end = l.offsets[last]
	}
	raw := make([]byte, end-l.offsets[first])
	if _, err := l.f.ReadAt(raw, l.offsets[first]); err != nil {
		return nil, fmt.Errorf("read entries: %w", err)
	}
	entries, _, err := readRecords(raw)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := entryBundle(&buf, entries); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
