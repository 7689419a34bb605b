//go:build !linux

package natstest

import "os/exec"

// setDeathSignal does nothing here: only Linux kills a child with its
// parent. A node left by a crashed test process must be killed by hand.
func setDeathSignal(*exec.Cmd) {}
