package server

import (
	"encoding/json"
	"testing"
)

func TestSANListMatchesJSONMarshal(t *testing.T) {
	for _, l := range [][]string{
		nil,
		{"worker-1"},
		{"worker-1.example.", "10.5.0.2", "fd00::2"},
		{`odd"name`, "tab\tname", "<script>", "ünï"},
	} {
		got, err := sanList(l).MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(l)
		if l == nil {
			want = []byte("[]")
		}
		if string(got) != string(want) {
			t.Errorf("%q: got %s, want %s", l, got, want)
		}
	}
}
