package child

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// maxLine is the longest output line a child may write; a longer line ends
// the reading of that stream.
const maxLine = 1 << 20

// Config says how to start a child process.
type Config struct {
	// Exe is the program to run; "" runs this executable again
	// (os.Executable).
	Exe string
	// Args are the arguments after the program's name.
	Args []string
	// Env is added to this process's environment.
	Env []string
	// Stdout receives each line the child writes to its standard output,
	// without the newline, in order, from one goroutine; nil discards them.
	// The slice is valid only during the call.
	Stdout func(line []byte)
	// Stderr, when set, receives each line of the child's standard error
	// like Stdout does; otherwise the child's standard error goes to
	// StderrTo (nil: discarded).
	Stderr   func(line []byte)
	StderrTo io.Writer
	// OwnGroup starts the child in a process group of its own, so that a
	// signal aimed at the parent's group (a Ctrl-C in a terminal) does not
	// reach it.
	OwnGroup bool
}

// Process is a running child process.
type Process struct {
	// Stdin is the child's standard input; closing it is how a parent
	// that goes away tells the child to stop.
	Stdin io.WriteCloser

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts the child process. Its output streams are read until they
// end; then the process is waited for, and Done is closed.
func Start(c Config) (*Process, error) {
	exe := c.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(exe, c.Args...)
	cmd.Env = append(cmd.Environ(), c.Env...)
	if c.OwnGroup {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr io.Reader
	if c.Stderr != nil {
		if stderr, err = cmd.StderrPipe(); err != nil {
			return nil, err
		}
	} else {
		cmd.Stderr = c.StderrTo
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Stdin: stdin, cmd: cmd, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		readLines(stdout, c.Stdout)
	}()
	if stderr != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readLines(stderr, c.Stderr)
		}()
	}
	go func() {
		wg.Wait()
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// readLines calls f with each line of r until r ends.
func readLines(r io.Reader, f func([]byte)) {
	if f == nil {
		_, _ = io.Copy(io.Discard, r)
		return
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), maxLine)
	for sc.Scan() {
		f(sc.Bytes())
	}
	// A line too long stops the scanner; the rest is read and dropped so
	// that the child never blocks on a full pipe.
	_, _ = io.Copy(io.Discard, r)
}

// Pid is the child's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the child.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill ends the child with SIGKILL.
func (p *Process) Kill() error { return p.cmd.Process.Kill() }

// Done is closed when the child has exited and its output has been read.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the child exited (exec.Cmd.Wait's error); valid once Done is
// closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}
