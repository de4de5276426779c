package issuelog

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"golang.org/x/mod/sumdb/tlog"
)

// maxResponse bounds one fetched resource: a full entry bundle at most.
const maxResponse = (1 << tileHeight) * (2 + MaxEntry)

// Fetch reads a served log (base URL ending in /log) into a Snapshot: the
// latest checkpoint and the entry bundles it covers. The checkpoint is
// verified later, by Verify, like the others collected.
func Fetch(ctx context.Context, c *http.Client, base string) (*Snapshot, error) {
	base = strings.TrimSuffix(base, "/")
	raw, err := get(ctx, c, base+"/"+FileCheckpoint)
	if err != nil {
		return nil, err
	}
	text, _, _ := strings.Cut(string(raw), "\n\n")
	cp, err := parseBody(text + "\n")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", base, err)
	}
	s := &Snapshot{Checkpoints: map[string][]byte{base + "/" + FileCheckpoint: raw}}
	for n := int64(0); n<<tileHeight < cp.Size; n++ {
		w := min(cp.Size-n<<tileHeight, 1<<tileHeight)
		t := tlog.Tile{H: tileHeight, L: -1, N: n, W: int(w)}
		b, err := get(ctx, c, base+"/tile/entries/"+strings.TrimPrefix(t.Path(), "tile/8/data/"))
		if err != nil {
			return nil, err
		}
		entries, err := parseBundle(b)
		if err != nil {
			return nil, fmt.Errorf("entry bundle %d: %w", n, err)
		}
		if int64(len(entries)) != w {
			return nil, fmt.Errorf("entry bundle %d: %d entries, want %d", n, len(entries), w)
		}
		s.Entries = append(s.Entries, entries...)
	}
	return s, nil
}

func get(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch log: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end or bounded; nothing to report
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err == nil && len(b) > maxResponse {
		err = fmt.Errorf("larger than %d bytes", maxResponse)
	}
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", url, err)
	}
	return b, nil
}
