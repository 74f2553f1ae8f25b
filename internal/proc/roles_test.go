package proc_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/proc"
)

// The test binary re-executes itself as a worker: TestMain runs the role named by roleEnv instead
// of the tests. Every role that waits gives up after roleLifetime, so a process that a failed test
// leaves behind does not live on.
const (
	roleEnv      = "GORUN_PROC_TEST_ROLE"
	argEnv       = "GORUN_PROC_TEST_ARG"  // role parameter: exit code, signal number, mode
	fileEnv      = "GORUN_PROC_TEST_FILE" // where a role writes a PID
	roleLifetime = 60 * time.Second
)

// runRole runs the worker role and returns its exit code, unless the role ends the process itself.
func runRole(role string) int {
	arg := os.Getenv(argEnv)
	switch role {
	case "exit":
		code, _ := strconv.Atoi(arg)
		return code
	case "kill":
		n, _ := strconv.Atoi(arg)
		dieOfSignal(syscall.Signal(n))
		return 99
	case "sleep":
		time.Sleep(roleLifetime)
		return 0
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		time.Sleep(roleLifetime)
		return 0
	case "handle-term":
		code, _ := strconv.Atoi(arg)
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		fmt.Println("ready")
		select {
		case <-c:
			return code
		case <-time.After(roleLifetime):
			return 99
		}
	case "print":
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(os.Stdout, "out %d\n", i)
			fmt.Fprintf(os.Stderr, "err %d\n", i)
		}
		fmt.Fprint(os.Stdout, "no newline")
		return 0
	case "env":
		wd, _ := os.Getwd()
		fmt.Printf("%s %s\n", arg, wd)
		return 0
	case "fork":
		return forkGrandchild(arg)
	case "read-stdin":
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		fmt.Printf("got:%s|sid=%v\n", strings.TrimSuffix(line, "\n"), unix.Getpid() == getsid())
		return 0
	case "await-file":
		// Works until the test creates FILE.go, then leaves FILE.done.
		path := os.Getenv(fileEnv)
		for end := time.Now().Add(roleLifetime); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(path + ".go"); err == nil {
				_ = os.WriteFile(path+".done", nil, 0o644)
				return 0
			}
		}
		return 99
	case "parent":
		p, err := proc.Start(proc.Spec{Path: self(), Env: roleEnviron("sleep", "", "")})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 98
		}
		if err := writePID(p.PID()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 97
		}
		p.Wait()
		return 0
	case "guard":
		if err := proc.RunGuard(os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "guarded-parent":
		// The guard is this test binary again, in role "guard".
		os.Setenv(roleEnv, "guard")
		g, err := proc.StartGuard([]string{self()})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 98
		}
		p, err := proc.Start(proc.Spec{Path: self(), Env: roleEnviron("fork", "hang", os.Getenv(fileEnv)), Guard: g})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 98
		}
		p.Wait()
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
	return 96
}

// dieOfSignal kills the process with sig under the default disposition, without a core dump, so
// that even signals the Go runtime turns into a crash (SIGSEGV, SIGABRT) kill it as a C program
// would be killed.
func dieOfSignal(sig syscall.Signal) {
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	var dfl [4]uint64 // a zero struct sigaction: SIG_DFL, no flags, empty mask
	_, _, _ = unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0)
	_ = syscall.Kill(os.Getpid(), sig)
	time.Sleep(10 * time.Second)
}

// forkGrandchild starts a sleeping grandchild, in this process group or, with mode "setsid", in a
// session of its own holding this process's stdout; writes its PID; then exits (mode "exit",
// "setsid") or sleeps ("hang").
func forkGrandchild(mode string) int {
	cmd := exec.Command(self())
	cmd.Env = roleEnviron("sleep", "", "")
	if mode == "await" {
		cmd.Env = roleEnviron("await-file", "", os.Getenv(fileEnv))
	}
	if mode == "setsid" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		cmd.Stdout = os.Stdout
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 98
	}
	if err := writePID(cmd.Process.Pid); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 97
	}
	if mode == "hang" {
		fmt.Println("ready")
		time.Sleep(roleLifetime)
	}
	return 0
}

// writePID writes pid to the file named by fileEnv, atomically.
func writePID(pid int) error {
	path := os.Getenv(fileEnv)
	if err := os.WriteFile(path+".tmp", []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// self returns the path of the test binary.
func self() string {
	path, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return path
}

// roleEnviron returns gorun's environment plus the variables that select role. It also turns off
// the race detector's one-second sleep at a successful exit, which would only slow the tests down.
func roleEnviron(role, arg, file string) []string {
	return append(os.Environ(), roleEnv+"="+role, argEnv+"="+arg, fileEnv+"="+file,
		"GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
}

// getsid is the session of this process.
func getsid() int {
	sid, _ := unix.Getsid(0)
	return sid
}
