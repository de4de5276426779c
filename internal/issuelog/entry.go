package issuelog

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// Events an entry records.
const (
	EventIssued  = "issued"  // a certificate left the CA
	EventDenied  = "denied"  // a request was refused
	EventReceipt = "receipt" // a ceremony receipt
)

// Entry is one logged decision, encoded as JSON.
type Entry struct {
	Version int       `json:"v"`
	Time    time.Time `json:"time"`
	Event   string    `json:"event"`
	// Kind is the certificate profile (internal/certlint kinds).
	Kind string `json:"kind,omitempty"`
	// Serial (hex) and CertSHA256 (hex of the DER) name an issued
	// certificate; Cert is its DER, so that verifiers can lint it again.
	Serial     string `json:"serial,omitempty"`
	CertSHA256 string `json:"certSha256,omitempty"`
	Cert       []byte `json:"cert,omitempty"`
	// Outcome and Reason explain a refusal (the audit line's).
	Outcome string `json:"outcome,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Peer, Subject and CSRSHA256 describe the request.
	Peer      string `json:"peer,omitempty"`
	Subject   string `json:"subject,omitempty"`
	CSRSHA256 string `json:"csrSha256,omitempty"`
	// Receipt is a ceremony receipt as written.
	Receipt json.RawMessage `json:"receipt,omitempty"`
}

// Issued is the entry of a certificate issued as kind.
func Issued(now time.Time, kind string, der []byte, serialHex string) Entry {
	return Entry{Version: 1, Time: now.UTC(), Event: EventIssued, Kind: kind, Serial: serialHex, CertSHA256: CertSHA256(der), Cert: der}
}

// CertSHA256 is the hex SHA-256 of a DER certificate, as entries name it.
func CertSHA256(der []byte) string {
	s := sha256.Sum256(der)
	return hex.EncodeToString(s[:])
}

// Marshal encodes e for Append.
func (e Entry) Marshal() ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode log entry: %w", err)
	}
	return b, nil
}

// ParseEntry decodes one entry.
func ParseEntry(b []byte) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return Entry{}, fmt.Errorf("decode log entry: %w", err)
	}
	return e, nil
}
