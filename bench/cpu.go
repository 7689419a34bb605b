package main

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cpuTimes is the machine's busy and total CPU time from /proc/stat, in
// clock ticks (zero where /proc is missing).
type cpuTimes struct{ busy, total float64 }

func readCPU() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}
	}
	var t cpuTimes
	for i, s := range f[1:] {
		v, _ := strconv.ParseFloat(s, 64)
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t
}

// busySince is the share of the machine's CPU time that was busy since t0
// (0..1; 0 when unknown).
func busySince(t0 cpuTimes) float64 {
	t1 := readCPU()
	if t1.total <= t0.total {
		return 0
	}
	return (t1.busy - t0.busy) / (t1.total - t0.total)
}

// CPUWindow measures CPU use over a stretch of time.
type CPUWindow struct {
	machine cpuTimes
	process time.Duration
	wall    time.Time
}

// CPUUse is what a window measured: the share of the whole machine's CPU
// that was busy (0..1; 0 when unknown) and how many cores this process
// (the clients, and the embedded NATS server) kept busy on average.
type CPUUse struct {
	MachineBusy  float64
	HarnessCores float64
}

func startCPU() CPUWindow {
	return CPUWindow{machine: readCPU(), process: processCPU(), wall: time.Now()}
}

// Stop returns the use since the window started.
func (w CPUWindow) Stop() CPUUse {
	u := CPUUse{MachineBusy: busySince(w.machine)}
	if wall := time.Since(w.wall); wall > 0 {
		u.HarnessCores = (processCPU() - w.process).Seconds() / wall.Seconds()
	}
	return u
}

// processCPU is this process's user+system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// holdFor holds a permit for d. The Go timer behind time.Sleep fires late
// when the runtime is busy (measured here: a 1 ms sleep took 1.1 ms idle
// and 1.5 ms while 32 workers and the embedded server shared 2 cores,
// which alone would cap the throughput at 2/3 of the N/hold ceiling). The
// runtime's poller waits for timers in whole milliseconds, but it wakes at
// once for a file descriptor, so a precise hold waits on a Linux timerfd
// (nanosecond expiry) instead: the goroutine parks in the poller, holding
// no thread and no P. A blocking nanosleep would be precise too but would
// pin a P for the whole hold. Elsewhere, or if a timerfd cannot be made,
// it falls back to time.Sleep.
func holdFor(d time.Duration, precise bool) {
	if !precise || !sleepFD(d) {
		time.Sleep(d)
	}
}

var timerFDs sync.Pool // of *os.File

// sleepFD sleeps d on a pooled timerfd; false if that is not possible.
func sleepFD(d time.Duration) bool {
	f, _ := timerFDs.Get().(*os.File)
	if f == nil {
		fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
		if err != nil {
			return false
		}
		f = os.NewFile(uintptr(fd), "timerfd")
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	if err := unix.TimerfdSettime(int(f.Fd()), 0, &spec, nil); err != nil {
		_ = f.Close()
		return false
	}
	var buf [8]byte
	if _, err := f.Read(buf[:]); err != nil {
		_ = f.Close()
		return false
	}
	timerFDs.Put(f)
	return true
}
