package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"
)

// FileServerEnv names the directory a file-server child of this binary
// serves (MaybeRunFileServer).
const FileServerEnv = "DEVICEHUB_BENCH_FILESERVER_DIR"

// MaybeRunFileServer turns this process into the firmware bench's
// ceiling when FileServerEnv is set: Go's http.FileServer over that
// directory on a free loopback port, whose URL it prints as its first
// line; it exits when its standard input closes (its parent is gone).
// cmd/bench and the bench's tests call it first thing.
func MaybeRunFileServer() {
	dir := os.Getenv(FileServerEnv)
	if dir == "" {
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "file server:", err)
		os.Exit(1)
	}
	fmt.Println("http://" + ln.Addr().String())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	err = (&http.Server{Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: time.Minute}).Serve(ln)
	fmt.Fprintln(os.Stderr, "file server:", err)
	os.Exit(1)
}

// fileServerChild is a running MaybeRunFileServer child.
type fileServerChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	url   string
}

// startFileServer starts this binary as a file-server child over dir.
func startFileServer(ctx context.Context, dir string) (*fileServerChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), FileServerEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &fileServerChild{cmd: cmd, stdin: stdin}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(l)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case c.url = <-line:
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
	}
	if !strings.HasPrefix(c.url, "http://") {
		c.stop()
		return nil, errors.New("bench: the file-server child did not start")
	}
	return c, nil
}

func (c *fileServerChild) pid() int { return c.cmd.Process.Pid }

func (c *fileServerChild) stop() {
	_ = c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}
