// Package semtest is the conformance suite every tokensem backend must
// pass: the same black-box tests, against a real broker, so the semantics of
// the backends cannot drift apart. A backend's test package builds a Backend
// and calls Run.
package semtest
