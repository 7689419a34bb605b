// Package driver is what a tokensem backend is built from, as
// database/sql/driver is for database/sql: users call the root package
// and a backend (natssem, amqpsem); a backend author reads this one.
//
// It holds the token's wire format (Codec), the admission rule every
// backend applies to a delivered token before it claims the token's slot
// (Admit), and the census a backend's Inventory returns to the reconciler
// (Census, Entry, Analyze, Summarize). docs/new-backend.md says what else
// a backend must do, and the conformance suite every backend runs.
package driver
