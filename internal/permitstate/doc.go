// Package permitstate is the life cycle every backend's permit shares:
// held, then released or lost, exactly once, with a Done channel that is
// always closed and an Err that says which.
package permitstate
