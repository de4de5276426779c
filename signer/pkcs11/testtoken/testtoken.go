// Package testtoken is what the throw-away PKCS#11 token helpers for
// tests (opencryptoki, tpm2pkcs11) have in common: where a token lives,
// which module serves it, its label and its PINs.
package testtoken

// Fixture describes a test token. Its PINs are test fixtures, not
// secrets.
type Fixture struct {
	// Dir holds the token's state and its PIN file.
	Dir string
	// ModulePath is the module to put in module-path.
	ModulePath string
	// Label is the token label (the URI's token=).
	Label string
	// SOPIN and PIN are the security officer and user PINs.
	SOPIN, PIN string
	// PINFile holds PIN followed by a newline, mode 0600.
	PINFile string
}
