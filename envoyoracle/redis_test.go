package envoyoracle

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// redisServer is a redis-server child process on a free loopback port, with
// no persistence.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
}

// needRedis finds redis-server: missing, it skips the test, or fails it under
// CI=true (CI installs it with scripts/install-redis.sh).
func needRedis(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is not installed (scripts/install-redis.sh installs it)")
		}
		t.Skip("redis-server is not installed (scripts/install-redis.sh installs it)")
	}
	return p
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startRedis starts redis-server on 127.0.0.1 and waits until it answers
// PING. It is killed when the test ends.
func startRedis(t *testing.T) *redisServer {
	t.Helper()
	bin := needRedis(t)
	port := freePort(t)
	cmd := exec.Command(bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--protected-mode", "yes",
		"--daemonize", "no", "--loglevel", "warning", "--dir", t.TempDir(),
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &redisServer{cmd: cmd, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // the process this test started
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := r.command("PING"); err == nil {
			return r
		} else if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s: %v", r.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// command sends one inline command and reads a one-line reply.
func (r *redisServer) command(cmd string) error {
	c, err := net.DialTimeout("tcp", r.addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\r\n", cmd); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if len(line) == 0 || line[0] == '-' {
		return fmt.Errorf("redis %s: %q", cmd, line)
	}
	return nil
}
