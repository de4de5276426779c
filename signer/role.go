package signer

import "context"

// KeyRole names what a key is for, so that a backend's messages about a
// key (the file backend's warning that it is held in memory) say which
// key: the OS CA's, a tiered node's intermediate, a policy authority,
// the issuance log's checkpoint key or a witness's.
type KeyRole string

// The roles a key plays.
const (
	RoleOSCA         KeyRole = "OS CA"
	RoleIntermediate KeyRole = "intermediate CA"
	RoleAuthority    KeyRole = "policy authority"
	RoleIssuanceLog  KeyRole = "issuance log"
	RoleLogWitness   KeyRole = "log witness"
)

type roleKey struct{}

// WithKeyRole returns ctx carrying role for the keys opened with it.
func WithKeyRole(ctx context.Context, role KeyRole) context.Context {
	return context.WithValue(ctx, roleKey{}, role)
}

// KeyRoleOf returns the role ctx carries; "CA" when it carries none.
func KeyRoleOf(ctx context.Context) KeyRole {
	if r, ok := ctx.Value(roleKey{}).(KeyRole); ok && r != "" {
		return r
	}
	return "CA"
}
