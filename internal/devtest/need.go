package devtest

import "testing"

// NeedAvailable fails tb (when Required) or skips it when err, the
// answer of a device helper's availability check, is not nil; what names
// the device ("opencryptoki").
func NeedAvailable(tb testing.TB, what string, err error) {
	tb.Helper()
	if err == nil {
		return
	}
	if Required() {
		tb.Fatalf("%s is required (CI=true or STEWARD_REQUIRE_DEVICES=1): %v", what, err)
	}
	tb.Skipf("skipping: %v (set STEWARD_REQUIRE_DEVICES=1 to make this a failure)", err)
}
