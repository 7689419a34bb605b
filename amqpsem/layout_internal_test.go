package amqpsem

import "testing"

func TestTokenQueueArgs(t *testing.T) {
	tests := []struct {
		queueType, version string
		wantLimit          bool
	}{
		{Quorum, "3.10.8", false}, // -1 or 0 would drop tokens on their first return here
		{Quorum, "3.13.7", false},
		{Quorum, "4.0.5", true}, // default limit 20 must be disabled
		{Quorum, "4.1.0", true},
		{Quorum, "", false},
		{Classic, "4.0.5", false},
	}
	for _, tc := range tests {
		args := tokenQueueArgs(tc.queueType, tc.version)
		if args["x-queue-type"] != tc.queueType {
			t.Errorf("%s %s: x-queue-type = %v", tc.queueType, tc.version, args["x-queue-type"])
		}
		limit, ok := args["x-delivery-limit"]
		if ok != tc.wantLimit || (ok && limit != int64(-1)) {
			t.Errorf("%s on %q: x-delivery-limit = %v (set %v), want set %v to -1", tc.queueType, tc.version, limit, ok, tc.wantLimit)
		}
	}
}
