package keystore

import (
	"fmt"
	"time"
)

// plan is what an operation decided to write, computed from the state and
// the device's results by a pure function. commit is the only way a plan
// reaches a directory.
type plan struct {
	// op names the operation for messages ("init", "rotate --finish");
	// empty when the caller names it in its own errors.
	op string
	// files are written (or removed) in the state's directory, in this
	// order.
	files []File
	// outputs are written elsewhere (a --out file, another directory),
	// after files.
	outputs []placement
	// receipt records the operation; it is not written if alreadyDone or
	// unrecorded.
	receipt Receipt
	// alreadyDone means the directory holds the result already.
	alreadyDone bool
	// unrecorded means no receipt is written: an earlier run wrote it and
	// only the removals are left, or the files are a key's intent record,
	// which precedes its receipt.
	unrecorded bool
	// resumed and notes go to the Outcome.
	resumed, notes []string
}

// commit carries out p in st.dir: first the files in plan order, then
// the outputs, then the receipt, then the removals. The receipt is
// written only once every file it vouches for is in place, and a file
// that is to disappear (os-ca.next.crt, which tells a re-run that a
// rotation is under way; a key's intent record) goes only after the
// receipt: wherever a crash stops it, a re-run reads a state it
// recognises. Within the process, a failed write rolls the earlier ones
// back (writePlaced).
func (c *Ceremony) commit(st *state, p *plan) (*Outcome, error) {
	out := &Outcome{
		Resumed: concat(st.cleaned, st.earlier.Resumed, p.resumed),
		Written: st.earlier.Written,
		Notes:   concat(st.earlier.Notes, p.notes),
	}
	if p.alreadyDone {
		out.AlreadyDone = true
		out.Notes = append([]string{p.op + " had already completed; nothing was written"}, out.Notes...)
		return out, nil
	}
	writes, removals := p.placed(st.dir)
	if !p.unrecorded {
		rf, err := c.receiptOf(st, p)
		if err != nil {
			return nil, err
		}
		writes = append(writes, rf)
	}
	if err := writePlaced(writes); err != nil {
		return nil, p.failed(err)
	}
	if !p.unrecorded {
		st.add(p.receipt)
		out.Receipt = p.receipt
		out.Written = concat(out.Written, written(writes))
	}
	return out, c.remove(st, p, removals)
}

// record commits p under the lock of receipts: an operation whose
// outputs are not the ceremony directory's own files, recorded there.
func (c *Ceremony) record(receipts Dir, p *plan) (*Outcome, error) {
	st, unlock, err := c.begin(receipts)
	if err != nil {
		return nil, p.failed(err)
	}
	defer unlock()
	return c.commit(st, p)
}

// receiptOf completes p's receipt (stampReceipt) and renders it.
func (c *Ceremony) receiptOf(st *state, p *plan) (placement, error) {
	stampReceipt(p, st.dir, c.now(), c.Version)
	rf, err := st.receiptFile(p.receipt, c.Rand)
	if err != nil {
		return placement{}, p.failed(err)
	}
	return placement{Dir: st.dir, File: rf}, nil
}

// stampReceipt sets what every receipt records the same way: the time
// (UTC), the tool's version, and the files in the order they are
// written, removals prefixed with "-".
func stampReceipt(p *plan, d Dir, now time.Time, version string) {
	p.receipt.Time, p.receipt.ToolVersion = now.UTC(), version
	p.receipt.Files = fileNames(d, p.files)
	for _, o := range p.outputs {
		p.receipt.Files = append(p.receipt.Files, o.path())
	}
}

// placed splits p into the writes, in order, and the removals.
func (p *plan) placed(d Dir) (writes []placement, removals []File) {
	for _, f := range p.files {
		if f.Remove {
			removals = append(removals, f)
			continue
		}
		writes = append(writes, placement{Dir: d, File: f, Overwrite: true})
	}
	return append(writes, p.outputs...), removals
}

// remove carries out p's removals, after its receipt.
func (c *Ceremony) remove(st *state, p *plan, removals []File) error {
	for _, f := range removals {
		if err := st.dir.Remove(f.Name); err != nil {
			return p.failed(fmt.Errorf("everything else is written, but %s could not be removed: %w; remove it", st.dir.Path(f.Name), err))
		}
		c.step("removed " + f.Name)
	}
	return nil
}

// failed names p's operation in err, when p has a name.
func (p *plan) failed(err error) error {
	if p.op == "" {
		return err
	}
	return fmt.Errorf("%s: %w", p.op, err)
}

// written lists the paths of writes.
func written(writes []placement) []string {
	out := make([]string, len(writes))
	for i, w := range writes {
		out[i] = w.path()
	}
	return out
}

// fileNames are the paths of files in d, removals prefixed with "-".
func fileNames(d Dir, files []File) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = d.Path(f.Name)
		if f.Remove {
			out[i] = "-" + out[i]
		}
	}
	return out
}

// concat joins lists into a new one.
func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}
