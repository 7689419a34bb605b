package natstest

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill cmd when the test process dies (a
// test binary's timeout panics without running cleanups).
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
