package authz

// Outcomes of a decision: the audit log's and the metrics' vocabulary.
const (
	// OutcomeAllowed: the machine is known, owns the peer address and
	// every SAN it asked for.
	OutcomeAllowed = "allowed"
	// OutcomeUnknownMachine: the peer address belongs to no known
	// machine, or to more than one.
	OutcomeUnknownMachine = "denied_unknown_machine"
	// OutcomeAddressNotOwned: an IP SAN is neither the machine's nor an
	// allowed extra.
	OutcomeAddressNotOwned = "denied_address_not_owned"
	// OutcomeNameNotOwned: a DNS SAN is neither the machine's name nor
	// allowed by a pattern.
	OutcomeNameNotOwned = "denied_name_not_owned"
	// OutcomePinned: the peer address was pinned to another machine by
	// an earlier certificate: a possible takeover.
	OutcomePinned = "denied_pinned"
	// OutcomeOutsideWindow: the machine's first certificate was asked
	// for after its join window closed.
	OutcomeOutsideWindow = "denied_outside_window"
	// OutcomeDenied is any other refusal (an authorizer's own outcome
	// this version does not know).
	OutcomeDenied = "denied_other"
	// OutcomeWouldDeny is the daemon's record of a refusal in observe
	// mode: logged and counted, the certificate issued anyway.
	OutcomeWouldDeny = "would_deny"
)

// Denials lists every refusal outcome (for metrics' label values).
func Denials() []string {
	return []string{OutcomeUnknownMachine, OutcomeAddressNotOwned, OutcomeNameNotOwned, OutcomePinned, OutcomeOutsideWindow, OutcomeDenied}
}

// KnownDenial reports whether o is one of Denials.
func KnownDenial(o string) bool {
	for _, d := range Denials() {
		if o == d {
			return true
		}
	}
	return false
}

// What the daemon tells a refused worker (the gRPC status message); the
// doctor recognizes them to point at the authorizer.
const (
	// ClientDeniedPrefix starts the PermissionDenied message of a
	// refusal; the outcome follows in parentheses.
	ClientDeniedPrefix = "this machine is not authorized for the requested certificate"
	// ClientUnavailable is the Unavailable message when no decision
	// could be made.
	ClientUnavailable = "certificate authorization is temporarily unavailable; retry later"
)
