package faultproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// echoServer accepts connections and echoes each line back; it records the
// server side of every connection, so a test can see what the server saw.
type echoServer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	ended chan error // one value per connection, when the server side's read ends
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln, ended: make(chan error, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			go func() {
				_, err := io.Copy(c, c)
				s.ended <- err
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	})
	return s
}

// waitEnded waits for the server side of a connection to end, and fails
// with failure after 10 s.
func (s *echoServer) waitEnded(t *testing.T, failure string) {
	t.Helper()
	select {
	case <-s.ended:
	case <-time.After(10 * time.Second):
		t.Fatal(failure)
	}
}

// connected starts an echo server and a proxy in front of it, and returns
// them with a client connection through the proxy that has made one round
// trip, and its link.
func connected(t *testing.T) (*echoServer, *Proxy, net.Conn, *Link) {
	t.Helper()
	s := startEcho(t)
	p := startProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	if _, err := roundTrip(c, "x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return s, p, c, link(t, p)
}

func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes a line and reads it back, within d.
func roundTrip(c net.Conn, line string, d time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

// link waits for the proxy's single link to be connected to the server.
func link(t *testing.T, p *Proxy) *Link {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ls := p.Links(); len(ls) == 1 && ls[0].ServerPort() != 0 {
			return ls[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connected link; links: %d", len(p.Links()))
		}
		time.Sleep(time.Millisecond)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestForwardAndFindByServerPort(t *testing.T) {
	s := startEcho(t)
	p := startProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	if got, err := roundTrip(c, "hello", 5*time.Second); err != nil || got != "hello" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	l := link(t, p)
	s.mu.Lock()
	serverSide := s.conns[0]
	s.mu.Unlock()
	// The server sees the link's server-side port as the client's port.
	if got := serverSide.RemoteAddr().(*net.TCPAddr).Port; got != l.ServerPort() || p.LinkByServerPort(got) != l {
		t.Fatalf("server sees port %d, link's server port %d", got, l.ServerPort())
	}
	if l.ClientPort() != c.LocalAddr().(*net.TCPAddr).Port {
		t.Fatalf("client port %d, want %d", l.ClientPort(), c.LocalAddr().(*net.TCPAddr).Port)
	}
	if p.Accepted() != 1 {
		t.Fatalf("accepted %d", p.Accepted())
	}
}

func TestCutResetsBothSides(t *testing.T) {
	s, _, c, l := connected(t)
	l.Cut()
	s.waitEnded(t, "the server side never saw the cut") // the server's read ended: it saw the connection go
	if _, err := roundTrip(c, "y", 10*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("the client after a cut: %v, want a reset or EOF", err)
	}
	<-l.Done()
}

// Half-open: the client's connection is broken, the server's socket stays
// open and hears nothing, until the link is cut.
func TestCutClientLeavesTheServerSideOpen(t *testing.T) {
	s, _, c, l := connected(t)
	l.CutClient()
	if _, err := roundTrip(c, "y", 10*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("the client of a half-open link: %v, want a reset or EOF", err)
	}
	// The server side can still write (the proxy drops it) and reads
	// nothing: its connection looks alive.
	s.mu.Lock()
	serverSide := s.conns[0]
	s.mu.Unlock()
	select {
	case err := <-s.ended:
		t.Fatalf("the server side ended (%v); a half-open link keeps it open", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := serverSide.Write([]byte("late\n")); err != nil {
		t.Fatalf("the server's write on a half-open link: %v", err)
	}
	// Cutting the link for good ends the server side too.
	l.Cut()
	s.waitEnded(t, "the server side never saw the final cut")
	<-l.Done()
}

// The converse: the server's side is gone, the client's stays open and
// silent, so the client's read waits.
func TestCutServerLeavesTheClientWaiting(t *testing.T) {
	s, p, c, l := connected(t)
	l.CutServer()
	s.waitEnded(t, "the server side never saw the cut")
	if _, err := roundTrip(c, "y", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("the client of a server-cut link: %v, want its read to wait (timeout)", err)
	}
	p.Close()
	<-l.Done()
}

func TestHalfClosePassesTheFIN(t *testing.T) {
	s, _, c, l := connected(t)
	l.HalfClose(true)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the client's read after a half-close toward it: %v, want EOF", err)
	}
	// Toward the server: its echo loop sees EOF and ends.
	l.HalfClose(false)
	select {
	case err := <-s.ended:
		if err != nil {
			t.Fatalf("the server saw %v, want a clean end of stream", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server never saw the half-close")
	}
}

// A black hole stalls both directions; Resume delivers the stream intact.
func TestBlackHoleStallsAndResumeDelivers(t *testing.T) {
	_, _, c, l := connected(t)
	l.BlackHole()
	if _, err := io.WriteString(c, "during\n"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); !isTimeout(err) {
		t.Fatalf("read through a black hole: %v, want a timeout", err)
	}
	l.Resume()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "during\n" {
		t.Fatalf("after Resume: %q, %v", got, err)
	}
}

// New connections: black-holed (the TCP connect succeeds, nothing is
// answered), rejected (reset at once), refused (nothing listens), and
// listened for again.
func TestModesOfNewConnections(t *testing.T) {
	s := startEcho(t)
	p := startProxy(t, s.ln.Addr().String())

	p.SetMode(BlackHole)
	c := dial(t, p)
	if _, err := roundTrip(c, "x", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a black-holed new connection: %v, want a timeout", err)
	}
	link(t, p).Resume()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "x\n" {
		t.Fatalf("after Resume: %q, %v", got, err)
	}
	c.Close()

	p.SetMode(Reject)
	// The reset may come before the client's connect returns, or after.
	var err error
	if c, err = net.DialTimeout("tcp", p.Addr(), 5*time.Second); err == nil {
		defer c.Close()
		_, err = roundTrip(c, "x", 10*time.Second)
	}
	if err == nil || isTimeout(err) {
		t.Fatalf("a rejected connection: %v, want a reset or EOF", err)
	}

	p.SetMode(Forward)
	p.Refuse()
	if _, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while refusing: %v, want ECONNREFUSED", err)
	}
	if err := p.Listen(); err != nil {
		t.Fatal(err)
	}
	c = dial(t, p)
	if got, err := roundTrip(c, "back", 5*time.Second); err != nil || got != "back" {
		t.Fatalf("after Listen: %q, %v", got, err)
	}
}

func TestDelay(t *testing.T) {
	s := startEcho(t)
	p := startProxy(t, s.ln.Addr().String())
	p.SetDelay(100 * time.Millisecond)
	c := dial(t, p)
	start := time.Now()
	if got, err := roundTrip(c, "slow", 10*time.Second); err != nil || got != "slow" {
		t.Fatalf("delayed round trip: %q, %v", got, err)
	}
	// Both directions are delayed: at least two delays (never an upper
	// bound: the machine may be loaded).
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("round trip took %v, want at least 200ms", d)
	}
	l := link(t, p)
	l.Delay(0)
	if got, err := roundTrip(c, "fast", 10*time.Second); err != nil || got != "fast" {
		t.Fatalf("round trip after Delay(0): %q, %v", got, err)
	}
}

// Close ends every link and goroutine, black-holed ones included.
func TestCloseEndsEverything(t *testing.T) {
	s := startEcho(t)
	p, err := Start(s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	if _, err := roundTrip(c, "x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	l := link(t, p)
	l.BlackHole()
	c2 := dial(t, p)
	io.WriteString(c2, "pending\n")
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); err == nil {
		t.Fatal("the closed proxy still accepts")
	}
	if len(p.Links()) != 0 {
		t.Fatalf("%d links after Close", len(p.Links()))
	}
}

// Watch sees every chunk each way before it is forwarded, and drops those
// it refuses.
func TestWatchSeesAndDrops(t *testing.T) {
	s := startEcho(t)
	p := startProxy(t, s.ln.Addr().String())
	var mu sync.Mutex
	var sent, answered []byte
	p.OnAccept(func(l *Link) {
		l.Watch(ToServer, func(chunk []byte) bool {
			mu.Lock()
			defer mu.Unlock()
			sent = append(sent, chunk...)
			return !bytes.Contains(chunk, []byte("drop"))
		})
		l.Watch(ToClient, func(chunk []byte) bool {
			mu.Lock()
			defer mu.Unlock()
			answered = append(answered, chunk...)
			return true
		})
	})
	c := dial(t, p)
	if got, err := roundTrip(c, "hello", 5*time.Second); err != nil || got != "hello" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	// A dropped chunk never reaches the echo server: no answer comes.
	if got, err := roundTrip(c, "drop", 300*time.Millisecond); err == nil || !isTimeout(err) {
		t.Fatalf("a dropped chunk was answered: %q, %v", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if string(sent) != "hello\ndrop\n" || string(answered) != "hello\n" {
		t.Fatalf("watched %q to the server and %q to the client", sent, answered)
	}
}
