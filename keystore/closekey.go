package keystore

import (
	"errors"
	"fmt"

	"github.com/steward-trustd/steward-trustd/signer"
)

// closeKey closes a key the ceremony opened and adds a failure to close
// it to *err: a TPM or PKCS#11 session left open is a failure the
// operator sees, not one dropped.
func closeKey(s signer.Signer, err *error) {
	if cerr := s.Close(); cerr != nil {
		*err = errors.Join(*err, fmt.Errorf("close key %s: %w", s.Describe().Location, cerr))
	}
}
