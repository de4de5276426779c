package keystore

import (
	"fmt"
)

// plan is what an operation decided to write, computed from the state and
// the device's results by a pure function.
type plan struct {
	// op names the operation for messages ("init", "rotate --finish").
	op string
	// files are written (or removed) in this order.
	files []File
	// receipt records the operation; it is not written if alreadyDone.
	receipt Receipt
	// alreadyDone means the directory holds the result already.
	alreadyDone bool
	// recorded means an earlier run wrote the receipt and only the
	// removals are left.
	recorded bool
	// resumed and notes go to the Outcome.
	resumed, notes []string
}

// commit carries out p in st.dir: first the files in plan order, then
// the receipt, then the removals. The receipt is written only once every
// file it vouches for is in place, and a file that is to disappear
// (os-ca.next.crt, which tells a re-run that a rotation is under way)
// goes only after the receipt: wherever a crash stops it, a re-run reads
// a state it recognises. Within the process, a failed write rolls the
// earlier ones back (WritePlaced).
func (c *Ceremony) commit(st *state, p *plan) (*Outcome, error) {
	d := st.dir
	out := &Outcome{Resumed: append(st.cleaned, p.resumed...), Notes: p.notes}
	if p.alreadyDone {
		out.AlreadyDone = true
		out.Notes = append([]string{p.op + " had already completed; nothing was written"}, out.Notes...)
		return out, nil
	}
	p.receipt.Time, p.receipt.ToolVersion = c.now().UTC(), c.Version
	p.receipt.Files = fileNames(d, p.files)
	rf, err := st.receiptFile(p.receipt, c.Rand)
	if err != nil {
		return nil, err
	}
	var writes []Placed
	var removals []File
	for _, f := range p.files {
		if f.Remove {
			removals = append(removals, f)
			continue
		}
		writes = append(writes, Placed{Dir: d, File: f, Overwrite: true})
	}
	if !p.recorded {
		writes = append(writes, Placed{Dir: d, File: rf})
	}
	if err := WritePlaced(writes); err != nil {
		return nil, fmt.Errorf("%s: %w", p.op, err)
	}
	if !p.recorded {
		st.add(p.receipt)
		out.Receipt = p.receipt
		out.Written = paths(d, append(p.files, rf))
	}
	for _, f := range removals {
		if err := d.Remove(f.Name); err != nil {
			return nil, fmt.Errorf("%s: the files and the receipt %s are written, but %s could not be removed: %w; remove it", p.op, d.Path(rf.Name), d.Path(f.Name), err)
		}
		c.step("removed " + f.Name)
	}
	return out, nil
}
