package keystore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/signer"
)

// intent is the durable record written before a key is created, naming
// where it will be: a key that appears there while the record is
// outstanding is this ceremony's half-finished key, any other key is
// someone else's. It holds no secret: the address is the signer URI
// without its query, and a key URI keeps its secrets (the PKCS#11
// pin-value, RFC 7512 §2.4) in the query.
type intent struct {
	Operation   Operation        `json:"operation"`
	Address     string           `json:"address"`
	Algorithm   signer.Algorithm `json:"algorithm"`
	Time        time.Time        `json:"time"`
	ToolVersion string           `json:"toolVersion"`
}

// intentName is the intent record of op, under certdir.DirReceipts (not a
// receipt: receipts end in .json).
func intentName(op Operation) string { return path.Join(certdir.DirReceipts, string(op)+".intent") }

// keyAddress is uri without its query (RFC 3986 §3.4).
func keyAddress(uri string) string {
	a, _, _ := strings.Cut(uri, "?")
	return a
}

func readIntent(d Dir, op Operation) (*intent, error) {
	b, err := readOptional(d, intentName(op))
	if err != nil || b == nil {
		return nil, err
	}
	var in intent
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("parse %s: %w (an interrupted run's record; remove it only if no key exists at the address it names)", d.Path(intentName(op)), err)
	}
	return &in, nil
}

// keyRequest asks for the key of one operation.
type keyRequest struct {
	// op is the receipt operation recording the key (opInitKey, opRotateKey).
	op  Operation
	uri string
	alg signer.Algorithm
	// authorities, if any, bind the key to policy authorities (uri
	// gains them; see underAuthorities).
	authorities Authorities
	// resumeOnly forbids creating a key: only one an earlier run of op
	// created (or was creating) may be used. errNothingToResume otherwise.
	resumeOnly bool
}

// errNothingToResume reports that a resume-only request found no key.
var errNothingToResume = errors.New("no key of an earlier run to resume")

// createKey returns the key of req: the one an earlier run created (by
// its receipt), the one an interrupted run was creating (by its intent
// record, which it then records), or a new one, created after its intent
// record is durable and recorded by a receipt right after. It never
// adopts another key and never creates a second one while an interrupted
// run may have created a key elsewhere. resumed says what an earlier run
// had done.
func (c *Ceremony) createKey(ctx context.Context, st *state, req keyRequest) (s signer.Signer, resumed []string, err error) {
	if req.uri, err = c.underAuthorities(ctx, st, req.uri, req.authorities); err != nil {
		return nil, nil, err
	}
	s, err = c.Keys.Open(ctx, req.uri)
	switch {
	case err == nil:
		return c.claimExisting(st, req, s)
	case !errors.Is(err, signer.ErrKeyNotFound):
		return nil, nil, fmt.Errorf("open the key at the signer URI: %w", err)
	case req.resumeOnly:
		return nil, nil, errNothingToResume
	}
	return c.generate(ctx, st, req)
}

// claimExisting accepts the existing key s if the directory vouches for
// it, and closes it otherwise.
func (c *Ceremony) claimExisting(st *state, req keyRequest, s signer.Signer) (signer.Signer, []string, error) {
	desc := s.Describe()
	in := st.intents[req.op]
	var resumed string
	switch {
	case st.receipt(req.op, desc.Fingerprint, "") != nil:
		resumed = fmt.Sprintf("key %s (%s) was created by an earlier run", desc.Fingerprint, desc.Location)
		if in != nil && in.Address == keyAddress(req.uri) {
			// The run was interrupted after the receipt, before it
			// removed the intent record.
			if err := c.dropIntent(st, req.op); err != nil {
				return nil, nil, errors.Join(err, s.Close())
			}
		}
	case in != nil && in.Address == keyAddress(req.uri) && hasAlgorithm(s, in.Algorithm):
		if err := c.recordKey(st, req.op, s, in); err != nil {
			return nil, nil, errors.Join(err, s.Close())
		}
		resumed = fmt.Sprintf("key %s (%s) was created by a run interrupted before recording it; recorded now", desc.Fingerprint, desc.Location)
	default:
		return nil, nil, errors.Join(&ForeignKeyError{Fingerprint: desc.Fingerprint, Location: desc.Location, Receipts: st.dir.Path(certdir.DirReceipts)}, s.Close())
	}
	if !hasAlgorithm(s, req.alg) {
		return nil, nil, errors.Join(fmt.Errorf("%w: the key an earlier run created is %s, not %s; re-run with the flags of that run", signer.ErrKeyExists, desc.Algorithm, req.alg), s.Close())
	}
	return s, []string{resumed}, nil
}

// generate creates the key of req after recording the intent to.
func (c *Ceremony) generate(ctx context.Context, st *state, req keyRequest) (signer.Signer, []string, error) {
	if in := st.intents[req.op]; in != nil && in.Address != keyAddress(req.uri) {
		return nil, nil, &InterruptedError{Operation: req.op, Address: in.Address, Since: in.Time, Record: st.dir.Path(intentName(req.op))}
	}
	in := &intent{Operation: req.op, Address: keyAddress(req.uri), Algorithm: req.alg, Time: c.now().UTC(), ToolVersion: c.Version}
	if err := c.writeIntent(st, in); err != nil {
		return nil, nil, err
	}
	s, err := c.Keys.Generate(ctx, req.uri, req.alg)
	if err != nil {
		return nil, nil, c.generateFailed(ctx, st, req, err)
	}
	c.step(string(req.op) + " key created")
	if err := c.recordKey(st, req.op, s, in); err != nil {
		return nil, nil, errors.Join(err, s.Close())
	}
	return s, nil, nil
}

// writeIntent makes in durable before its key is created.
func (c *Ceremony) writeIntent(st *state, in *intent) error {
	data, err := json.MarshalIndent(in, "", "  ")
	if err != nil {
		return err
	}
	f := File{Name: intentName(in.Operation), Data: append(data, '\n'), Mode: 0o644}
	if _, err := c.commit(st, &plan{files: []File{f}, unrecorded: true}); err != nil {
		return fmt.Errorf("record the intent to create a key (nothing was created): %w", err)
	}
	c.step(string(in.Operation) + " intent recorded")
	return nil
}

// generateFailed removes the intent record of a failed Generate unless a
// key exists at the URI after all (then a re-run sorts it out), so that
// a key someone else puts there later is never taken for ours.
func (c *Ceremony) generateFailed(ctx context.Context, st *state, req keyRequest, cause error) error {
	s, err := c.Keys.Open(ctx, req.uri)
	if err == nil {
		// Only whether a key is there matters; cause is what is reported.
		_ = s.Close()
	}
	if errors.Is(err, signer.ErrKeyNotFound) || errors.Is(cause, signer.ErrKeyExists) {
		if rerr := c.removeIntent(st, req.op); rerr != nil {
			return fmt.Errorf("create key: %w (and %w)", cause, rerr)
		}
	}
	return fmt.Errorf("create key: %w", cause)
}

// recordKey writes the key receipt of op for s and then removes the
// intent record: from then on the receipt vouches for the key.
func (c *Ceremony) recordKey(st *state, op Operation, s signer.Signer, in *intent) error {
	r := newReceipt(op, s.Describe())
	r.Details = map[string]string{"algorithm": string(in.Algorithm), "intentRecorded": in.Time.UTC().Format(time.RFC3339Nano)}
	if _, err := c.commit(st, &plan{receipt: r}); err != nil {
		desc := s.Describe()
		return &KeyNotRecordedError{Operation: op, Fingerprint: desc.Fingerprint, Location: desc.Location, Err: err}
	}
	c.step(string(op) + " key recorded")
	return c.dropIntent(st, op)
}

// dropIntent removes the intent record of op once a receipt vouches for
// the key.
func (c *Ceremony) dropIntent(st *state, op Operation) error {
	if err := c.removeIntent(st, op); err != nil {
		return fmt.Errorf("the key is recorded in %s, but %w", st.dir.Path(certdir.DirReceipts), err)
	}
	c.step(string(op) + " intent removed")
	return nil
}

// removeIntent removes the intent record of op.
func (c *Ceremony) removeIntent(st *state, op Operation) error {
	if _, err := c.commit(st, &plan{files: []File{{Name: intentName(op), Remove: true}}, unrecorded: true}); err != nil {
		return fmt.Errorf("its intent record could not be removed: %w", err)
	}
	delete(st.intents, op)
	return nil
}

// hasAlgorithm reports whether s's key is of algorithm a.
func hasAlgorithm(s signer.Signer, a signer.Algorithm) bool {
	got, err := signer.AlgorithmOf(s.Public())
	return err == nil && got == a
}
