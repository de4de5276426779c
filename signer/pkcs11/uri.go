package pkcs11

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/steward-trustd/steward-trustd/signer"
)

// URI is a parsed RFC 7512 PKCS#11 URI restricted to what this backend
// uses. Empty string fields (and a nil ID, a nil SlotID) match anything.
//
// go-pkcs11uri was considered and not used: it accepts unknown attributes,
// its "type" check is broken, it does not trim the PIN file's newline and
// it puts file paths and attribute values into its error messages. This
// parser is strict instead (unknown or repeated attributes, empty values,
// characters outside RFC 7512's pk11-pchar/pk11-qchar and malformed
// pct-encoding are refused) and is fuzzed against go-pkcs11uri.
type URI struct {
	// Token selection, RFC 7512 §2.3 (compared with the token's
	// CK_TOKEN_INFO, trailing blanks removed).
	Token        string // token: CKA label of the token
	Manufacturer string // manufacturer: token manufacturerID
	Model        string // model
	Serial       string // serial: token serialNumber
	// Slot selection. SoftHSM slot ids are random: select by token label.
	SlotDescription  string // slot-description
	SlotManufacturer string // slot-manufacturer
	SlotID           *uint  // slot-id
	// Library selection, checked against C_GetInfo.
	LibraryManufacturer string // library-manufacturer
	LibraryDescription  string // library-description
	LibraryVersion      string // library-version: "2" or "2.6"
	// Object selection.
	Object string // object: CKA_LABEL
	ID     []byte // id: CKA_ID
	Type   string // type: only "private" is meaningful for a CA key

	// ModulePath is the absolute path of the PKCS#11 module (query
	// attribute module-path). Required: the backend never guesses a module.
	ModulePath string
	// PINSource is the absolute path of a file holding the user PIN
	// (query attribute pin-source, given as file:/path or /path).
	PINSource string
	// PINValue is the user PIN given inline (query attribute pin-value).
	// It ends up in process listings and shell histories: prefer PINSource.
	// String redacts it.
	PINValue string
	// AllowExtractable (query attribute allow-extractable=true) accepts a
	// key whose CKA_EXTRACTABLE is true or CKA_SENSITIVE is false. Without
	// it such a key is refused at open.
	AllowExtractable bool
}

// Path attributes of RFC 7512 §2.3, in the order String writes them.
var pathAttrs = []string{
	"library-manufacturer", "library-description", "library-version",
	"slot-manufacturer", "slot-description", "slot-id",
	"manufacturer", "model", "serial", "token",
	"object", "id", "type",
}

// Query attributes: RFC 7512 §2.4 ones this backend honours, and its own
// allow-extractable. module-name is refused on purpose (no module search).
var queryAttrs = []string{"module-path", "pin-source", "pin-value", "allow-extractable"}

func uriErr(format string, a ...any) error {
	return fmt.Errorf("%w: pkcs11: "+format, append([]any{signer.ErrInvalidURI}, a...)...)
}

// ParseURI parses a pkcs11: key URI. Errors wrap signer.ErrInvalidURI and
// never repeat attribute values (one of them may be a PIN).
func ParseURI(s string) (*URI, error) {
	rest, ok := strings.CutPrefix(s, Scheme+":")
	if !ok {
		return nil, uriErr("URI does not start with %q", Scheme+":")
	}
	path, query, hasQuery := strings.Cut(rest, "?")
	u := &URI{}
	seen := map[string]bool{}
	if path != "" {
		if err := u.parseSection(path, pathSection, seen); err != nil {
			return nil, err
		}
	}
	if hasQuery {
		if query == "" {
			return nil, uriErr("empty query after '?'")
		}
		if err := u.parseSection(query, querySection, seen); err != nil {
			return nil, err
		}
	}
	if err := u.validate(); err != nil {
		return nil, err
	}
	return u, nil
}

// section is one half of a pkcs11: URI, the path (RFC 7512 §2.3) or the
// query (§2.4): the same name=value grammar with its own separator,
// attribute names, characters and messages.
type section struct {
	what    string
	sep     string
	known   []string
	isChar  func(byte) bool
	set     func(u *URI, name, val string) error
	unknown func(name string) error
}

var pathSection = section{
	what: "path", sep: ";", known: pathAttrs, isChar: isPathChar,
	set: (*URI).setPath, unknown: unknownPathAttr,
}

var querySection = section{
	what: "query", sep: "&", known: queryAttrs, isChar: isQueryChar,
	set: (*URI).setQuery, unknown: unknownQueryAttr,
}

// parseSection parses one section's attributes into u; seen spans both
// sections, since RFC 7512 §2.3 allows each attribute once per URI.
func (u *URI) parseSection(s string, sec section, seen map[string]bool) error {
	for _, attr := range strings.Split(s, sec.sep) {
		name, raw, ok := strings.Cut(attr, "=")
		if !ok {
			return uriErr("%s attribute without '=' (want name=value)", sec.what)
		}
		if !knownAttr(sec.known, name) {
			return sec.unknown(name)
		}
		if seen[name] {
			return uriErr("attribute %q given twice (RFC 7512 §2.3)", name)
		}
		seen[name] = true
		val, err := unescape(raw, sec.isChar)
		if err != nil {
			return uriErr("attribute %q: %v", name, err)
		}
		if err := sec.set(u, name, val); err != nil {
			return err
		}
	}
	return nil
}

func unknownPathAttr(name string) error {
	if knownAttr(queryAttrs, name) {
		return uriErr("%q is a query attribute: put it after '?'", name)
	}
	return uriErr("unsupported path attribute %q (supported: %s)", printable(name), strings.Join(pathAttrs, ", "))
}

func unknownQueryAttr(name string) error {
	if name == "module-name" {
		return uriErr("module-name is not supported: give the absolute module-path (e.g. /usr/lib/softhsm/libsofthsm2.so)")
	}
	if knownAttr(pathAttrs, name) {
		return uriErr("%q is a path attribute: put it before '?'", name)
	}
	// The name is not echoed: with a PIN containing an unencoded '&', it
	// would be part of the PIN.
	return uriErr("unsupported query attribute (supported: %s; write '&' inside a value as %%26)", strings.Join(queryAttrs, ", "))
}

func knownAttr(list []string, name string) bool {
	for _, a := range list {
		if a == name {
			return true
		}
	}
	return false
}

// printable quotes an unknown attribute name without echoing a long or
// odd string in full.
func printable(s string) string {
	if len(s) > 32 {
		s = s[:32] + "..."
	}
	q := strconv.QuoteToASCII(s)
	return q[1 : len(q)-1]
}

func (u *URI) setPath(name, val string) error {
	if val == "" {
		return uriErr("attribute %q is empty", name)
	}
	if f := u.textAttr(name); f != nil {
		*f = val
		return nil
	}
	switch name {
	case "slot-id":
		return u.setSlotID(val)
	case "library-version":
		// RFC 7512 §2.3: 1*DIGIT [ "." 1*DIGIT ]
		maj, min, dot := strings.Cut(val, ".")
		if !allDigits(maj) || (dot && !allDigits(min)) {
			return uriErr("library-version must be N or N.M")
		}
		u.LibraryVersion = val
	case "id":
		u.ID = []byte(val)
	case "type":
		return u.setType(val)
	}
	return nil
}

// textAttr returns the field of a path attribute taken verbatim, or nil.
func (u *URI) textAttr(name string) *string {
	switch name {
	case "token":
		return &u.Token
	case "manufacturer":
		return &u.Manufacturer
	case "model":
		return &u.Model
	case "serial":
		return &u.Serial
	case "slot-description":
		return &u.SlotDescription
	case "slot-manufacturer":
		return &u.SlotManufacturer
	case "library-manufacturer":
		return &u.LibraryManufacturer
	case "library-description":
		return &u.LibraryDescription
	case "object":
		return &u.Object
	}
	return nil
}

func (u *URI) setSlotID(val string) error {
	// RFC 7512 §2.3: pk11-slot-id = "slot-id" "=" 1*DIGIT
	if !allDigits(val) {
		return uriErr("slot-id must be decimal digits")
	}
	n, err := strconv.ParseUint(val, 10, strconv.IntSize)
	if err != nil {
		return uriErr("slot-id out of range")
	}
	id := uint(n)
	u.SlotID = &id
	return nil
}

func (u *URI) setType(val string) error {
	switch val {
	case "private":
	case "public", "cert", "secret-key", "data":
		return uriErr("type=%s: a CA signing key is a private key (type=private or no type)", val)
	default:
		return uriErr("type must be one of public, private, cert, secret-key, data (RFC 7512 §2.3)")
	}
	u.Type = val
	return nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func (u *URI) setQuery(name, val string) error {
	switch name {
	case "module-path":
		if val == "" || !filepath.IsAbs(val) || filepath.Clean(val) != val || strings.ContainsRune(val, 0) {
			return uriErr("module-path must be a clean absolute path")
		}
		u.ModulePath = val
	case "pin-source":
		p, err := parsePINSource(val)
		if err != nil {
			return err
		}
		u.PINSource = p
	case "pin-value":
		if val == "" {
			return uriErr("pin-value is empty")
		}
		u.PINValue = val
	case "allow-extractable":
		switch val {
		case "true":
			u.AllowExtractable = true
		case "false":
		default:
			return uriErr("allow-extractable must be true or false")
		}
	}
	return nil
}

// parsePINSource accepts file:/abs/path, file:///abs/path or /abs/path.
// RFC 7512 §2.4 leaves other forms (e.g. "|program") to the application;
// this backend refuses them.
func parsePINSource(v string) (string, error) {
	p := v
	if rest, ok := strings.CutPrefix(v, "file:"); ok {
		p = rest
		if h, ok := strings.CutPrefix(rest, "//"); ok {
			// file://host/path: only an empty host is local (RFC 8089 §2).
			if !strings.HasPrefix(h, "/") {
				return "", uriErr("pin-source: file URI must not name a host")
			}
			p = h
		}
	}
	if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0) {
		return "", uriErr("pin-source must be file:/absolute/clean/path")
	}
	return p, nil
}

func (u *URI) validate() error {
	if u.ModulePath == "" {
		return uriErr("module-path is required, e.g. ?module-path=/usr/lib/softhsm/libsofthsm2.so")
	}
	if u.PINSource != "" && u.PINValue != "" {
		return uriErr("give pin-source or pin-value, not both (RFC 7512 §2.4)")
	}
	if u.PINSource == "" && u.PINValue == "" {
		return uriErr("a user PIN is required: add pin-source=file:/path/to/pin")
	}
	if u.Token == "" && u.Serial == "" && u.SlotID == nil {
		return uriErr("name the token: token=LABEL (or serial=, slot-id=)")
	}
	if u.Object == "" && u.ID == nil {
		return uriErr("name the key: object=LABEL and/or id=%%XX...")
	}
	return nil
}

// String returns the URI in canonical form with pin-value redacted, so
// that it is safe in logs and errors. Encode returns the full URI.
func (u *URI) String() string { return u.format(true) }

// Encode returns the URI in canonical form, including any pin-value.
// ParseURI(u.Encode()) yields u again.
func (u *URI) Encode() string { return u.format(false) }

func (u *URI) format(redact bool) string {
	var path []string
	add := func(name, val string) {
		if val != "" {
			path = append(path, name+"="+escape(val, isPathChar))
		}
	}
	add("library-manufacturer", u.LibraryManufacturer)
	add("library-description", u.LibraryDescription)
	add("library-version", u.LibraryVersion)
	add("slot-manufacturer", u.SlotManufacturer)
	add("slot-description", u.SlotDescription)
	if u.SlotID != nil {
		path = append(path, "slot-id="+strconv.FormatUint(uint64(*u.SlotID), 10))
	}
	add("manufacturer", u.Manufacturer)
	add("model", u.Model)
	add("serial", u.Serial)
	add("token", u.Token)
	add("object", u.Object)
	if u.ID != nil {
		// IDs are binary: encode every byte, as p11tool does.
		var b strings.Builder
		for _, c := range u.ID {
			fmt.Fprintf(&b, "%%%02X", c)
		}
		path = append(path, "id="+b.String())
	}
	add("type", u.Type)
	var q []string
	qadd := func(name, val string) {
		if val != "" {
			q = append(q, name+"="+escape(val, isQueryChar))
		}
	}
	qadd("module-path", u.ModulePath)
	if u.PINSource != "" {
		qadd("pin-source", "file:"+u.PINSource)
	}
	if u.PINValue != "" {
		if redact {
			q = append(q, "pin-value=REDACTED")
		} else {
			qadd("pin-value", u.PINValue)
		}
	}
	if u.AllowExtractable {
		q = append(q, "allow-extractable=true")
	}
	s := Scheme + ":" + strings.Join(path, ";")
	if len(q) > 0 {
		s += "?" + strings.Join(q, "&")
	}
	return s
}

// keyLocation describes the key for Describe().Location: token, object,
// id and module, never a PIN.
func (u *URI) keyLocation() string {
	c := *u
	c.PINSource, c.PINValue, c.AllowExtractable = "", "", false
	return c.String()
}

// RFC 7512 §2.3: pk11-pchar and pk11-qchar, without pct-encoded.
func isUnreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

func isResAvail(c byte) bool {
	return strings.IndexByte(":[]@!$'()*+,=", c) >= 0
}

func isPathChar(c byte) bool { return isUnreserved(c) || isResAvail(c) || c == '&' }

func isQueryChar(c byte) bool {
	return isUnreserved(c) || isResAvail(c) || c == '/' || c == '?' || c == '|'
}

// unescape decodes pct-encoding strictly: every other byte must be
// allowed by ok, and every '%' must start two hex digits.
func unescape(s string, ok func(byte) bool) (string, error) {
	if !strings.Contains(s, "%") {
		for i := 0; i < len(s); i++ {
			if !ok(s[i]) {
				return "", fmt.Errorf("character %q must be pct-encoded", s[i])
			}
		}
		return s, nil
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '%' {
			if i+2 >= len(s) {
				return "", fmt.Errorf("truncated pct-encoding")
			}
			if !isHex(s[i+1]) || !isHex(s[i+2]) {
				return "", fmt.Errorf("malformed pct-encoding")
			}
			i += 2
			continue
		}
		if !ok(s[i]) {
			return "", fmt.Errorf("character %q must be pct-encoded", s[i])
		}
	}
	return url.PathUnescape(s)
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// escape pct-encodes every byte that ok does not allow as is.
func escape(s string, ok func(byte) bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if ok(c) && c != '%' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}
