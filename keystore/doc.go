// Package keystore is the on-device key lifecycle of steward-trustd that
// the ceremony drives: generate or import the OS CA key on a TPM, HSM or
// (on request) in a file, self-sign the CA through it, issue talosctl and
// serving certificates, rotate, and record every operation in a receipt.
// The certificate profiles are internal/pki's and the directory layout is
// internal/certdir's, shared with the daemon. It takes its clock and
// randomness as parameters so that ceremonies are testable.
package keystore
