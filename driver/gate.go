package driver

import "strings"

// gatePrefix starts the name of every gate. No semaphore name can start
// with '_' (tokensem.ValidateName), so a gate's resources never collide
// with a semaphore's, and a backend's List can tell gates apart.
const gatePrefix = "_gate_"

// GateName returns the name of the gate of semaphore name: the one-permit
// semaphore beside it through which its weighted callers
// (tokensem.Weighted) take turns. Its tokens are tokens like any other.
func GateName(name string) string { return gatePrefix + name }

// IsGate reports whether name is a gate's name.
func IsGate(name string) bool { return strings.HasPrefix(name, gatePrefix) }
