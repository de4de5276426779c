// Package authz is the per-machine join authorization: the decision
// protocol the daemon speaks to an authorizer (JSON over HTTP, versioned,
// docs/authorizer-protocol.md) and the rules that decide whether a
// machine may be signed for, with their durable pins.
package authz

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// APIVersion names the protocol version of requests and responses. A
// peer that sees another version refuses the message: a field whose
// meaning changed must never be read with the old meaning.
const APIVersion = "authz.steward-trustd.dev/v1"

// DecidePath is the HTTP path of the decision endpoint (POST).
const DecidePath = "/v1/decide"

// MaxMessageBytes bounds a request or response body on both sides.
const MaxMessageBytes = 64 << 10

// Request asks whether a certificate may be issued. The daemon sends it
// only after the token, the CSR and its static policy passed.
type Request struct {
	APIVersion string `json:"apiVersion"`
	// Peer is the caller's IP address as the daemon saw it.
	Peer string `json:"peer"`
	// Subject is the CSR's subject (distinguished name, RFC 4514).
	Subject string `json:"subject"`
	// DNSNames and IPAddresses are the CSR's SANs.
	DNSNames    []string `json:"dnsNames"`
	IPAddresses []string `json:"ipAddresses"`
	// CSRSHA256 is the hex SHA-256 of the PEM request.
	CSRSHA256 string `json:"csrSHA256"`
	// KeyType is e.g. "ECDSA-P256", "Ed25519", "RSA-2048".
	KeyType string `json:"keyType"`
	// TokenIndex is which of the daemon's valid tokens matched (0-based).
	TokenIndex int `json:"tokenIndex"`
	// Tenant is the daemon's tenant label, "" when it has none.
	Tenant string `json:"tenant,omitempty"`
}

// Response is the authorizer's answer. Allow is true only with Outcome
// OutcomeAllowed; anything else is a refusal.
type Response struct {
	APIVersion string `json:"apiVersion"`
	Allow      bool   `json:"allow"`
	// Outcome is one of the Outcome* names; an unknown one is a refusal.
	Outcome string `json:"outcome"`
	// Reason says why, for the audit log and the operator.
	Reason string `json:"reason"`
	// Machine names the inventory machine the request was matched to.
	Machine string `json:"machine,omitempty"`
}

// DecodeRequest reads one request, strictly: unknown fields, trailing
// data, a wrong version or more than MaxMessageBytes are errors.
func DecodeRequest(r io.Reader) (*Request, error) {
	var req Request
	if err := decodeStrict(r, &req); err != nil {
		return nil, fmt.Errorf("decision request: %w", err)
	}
	if req.APIVersion != APIVersion {
		return nil, fmt.Errorf("decision request: apiVersion %q, want %q", req.APIVersion, APIVersion)
	}
	if req.Peer == "" {
		return nil, errors.New("decision request: no peer address")
	}
	return &req, nil
}

// DecodeResponse reads one response, as strictly as DecodeRequest, and
// checks that Allow and Outcome agree: an answer that says allow with a
// denial outcome (or the reverse) is malformed, never an allow.
func DecodeResponse(r io.Reader) (*Response, error) {
	var resp Response
	if err := decodeStrict(r, &resp); err != nil {
		return nil, fmt.Errorf("decision response: %w", err)
	}
	if resp.APIVersion != APIVersion {
		return nil, fmt.Errorf("decision response: apiVersion %q, want %q", resp.APIVersion, APIVersion)
	}
	if resp.Allow != (resp.Outcome == OutcomeAllowed) {
		return nil, fmt.Errorf("decision response: allow=%t contradicts outcome %q", resp.Allow, resp.Outcome)
	}
	if !resp.Allow && !KnownDenial(resp.Outcome) {
		resp.Reason = fmt.Sprintf("outcome %q: %s", resp.Outcome, resp.Reason)
		resp.Outcome = OutcomeDenied
	}
	return &resp, nil
}

// decodeStrict decodes exactly one JSON value of at most MaxMessageBytes.
func decodeStrict(r io.Reader, v any) error {
	data, err := io.ReadAll(io.LimitReader(r, MaxMessageBytes+1))
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if len(data) > MaxMessageBytes {
		return fmt.Errorf("larger than %d bytes", MaxMessageBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}
