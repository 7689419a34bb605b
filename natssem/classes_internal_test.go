package natssem

import "testing"

func TestServerAtLeast(t *testing.T) {
	for v, want := range map[string]bool{
		"2.12.0": true, "2.12.0-beta.1": true, "2.15.2": true, "3.0.0": true,
		"2.11.9": false, "2.10.24": false, "1.99.0": false, "": false, "2": false, "x.y.z": false,
	} {
		if got := serverAtLeast(v, 2, 12); got != want {
			t.Errorf("serverAtLeast(%q, 2, 12) = %v, want %v", v, got, want)
		}
	}
}
