package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is what the proxy does with the connections it accepts.
type Mode int

// The modes of new connections.
const (
	// Forward forwards in both directions (the default).
	Forward Mode = iota
	// BlackHole accepts the connection and forwards nothing, either way,
	// until the link is resumed: the client's connect succeeds (TCP), its
	// startup message is never answered.
	BlackHole
	// Reject accepts the connection and resets it at once, without
	// connecting to the server.
	Reject
)

// Proxy forwards TCP connections from Addr to a target address.
type Proxy struct {
	target string

	mu       sync.Mutex
	ln       net.Listener // nil while refusing
	addr     string
	mode     Mode
	delay    time.Duration // of new links
	links    map[*Link]struct{}
	closed   bool
	onAccept func(*Link)
	accepted int
	wg       sync.WaitGroup
}

// Start listens on a free loopback port and forwards every connection to
// target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, addr: ln.Addr().String(), links: map[*Link]struct{}{}}
	p.wg.Add(1)
	go p.serve(ln)
	return p, nil
}

// Addr is the address clients connect to (127.0.0.1:port).
func (p *Proxy) Addr() string { return p.addr }

// Port is the port of Addr.
func (p *Proxy) Port() int { return p.addrPort() }

func (p *Proxy) addrPort() int {
	_, port, _ := net.SplitHostPort(p.addr)
	var n int
	fmt.Sscan(port, &n)
	return n
}

// SetMode sets what happens to connections accepted from now on.
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	p.mode = m
	p.mu.Unlock()
}

// SetDelay delays every chunk forwarded on links accepted from now on.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// OnAccept calls fn with each new link, before it forwards anything (fn may
// fault it at once).
func (p *Proxy) OnAccept(fn func(*Link)) {
	p.mu.Lock()
	p.onAccept = fn
	p.mu.Unlock()
}

// Accepted returns how many connections the proxy has accepted.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Refuse closes the listening socket: new connections are refused by the
// kernel (ECONNREFUSED), as when nothing listens on the port. Links
// already open are left as they are.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
}

// Listen listens again on the same address after Refuse.
func (p *Proxy) Listen() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("faultproxy: closed")
	}
	if p.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.ln = ln
	p.wg.Add(1)
	go p.serve(ln)
	return nil
}

// Links returns the open links, in no particular order.
func (p *Proxy) Links() []*Link {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*Link, 0, len(p.links))
	for l := range p.links {
		out = append(out, l)
	}
	return out
}

// LinkByServerPort returns the open link whose server-side socket has local
// port port (what PostgreSQL shows as pg_stat_activity.client_port), or nil.
func (p *Proxy) LinkByServerPort(port int) *Link {
	for _, l := range p.Links() {
		if l.ServerPort() == port {
			return l
		}
	}
	return nil
}

// CutAll cuts every open link on both sides.
func (p *Proxy) CutAll() {
	for _, l := range p.Links() {
		l.Cut()
	}
}

// DropAnswersAll has every open link drop what the server sends (see
// Link.DropAnswers).
func (p *Proxy) DropAnswersAll() {
	for _, l := range p.Links() {
		l.DropAnswers()
	}
}

// BlackHoleAll black-holes every open link; with SetMode(BlackHole), new
// ones too: a partition.
func (p *Proxy) BlackHoleAll() {
	for _, l := range p.Links() {
		l.BlackHole()
	}
}

// ResumeAll resumes every open link.
func (p *Proxy) ResumeAll() {
	for _, l := range p.Links() {
		l.Resume()
	}
}

// Close stops listening, resets every link and waits for the proxy's
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	ln := p.ln
	p.ln = nil
	links := make([]*Link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	for _, l := range links {
		l.Cut()
	}
	p.wg.Wait()
	return nil
}

func (p *Proxy) serve(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by Refuse or Close
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.accepted++
		mode, delay, onAccept := p.mode, p.delay, p.onAccept
		if mode == Reject {
			p.mu.Unlock()
			reset(c)
			continue
		}
		l := &Link{p: p, client: c, delay: delay, blackHoled: mode == BlackHole, stop: make(chan struct{}), done: make(chan struct{})}
		l.cond = sync.NewCond(&l.mu)
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run(onAccept)
	}
}

// Link is one proxied connection: the client's socket (accepted by the
// proxy) and the server's (opened by the proxy).
type Link struct {
	p      *Proxy
	client net.Conn

	mu          sync.Mutex
	cond        *sync.Cond // signalled when the state below changes
	server      net.Conn   // nil until connected
	delay       time.Duration
	blackHoled  bool
	dropAnswers bool                                 // what the server sends is read and thrown away
	watch       [2]func(chunk []byte) (forward bool) // [toServer], [toClient]: see Watch
	clientGone  bool                                 // the client's socket was reset; the server's is kept, silent
	serverGone  bool                                 // the server's socket was reset; the client's is kept, silent
	cut         bool                                 // both sockets closed
	stop        chan struct{}
	stopOnce    sync.Once
	done        chan struct{}
}

// ServerPort is the local port of the socket to the server (0 until
// connected): the client port the server sees.
func (l *Link) ServerPort() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.server == nil {
		return 0
	}
	return l.server.LocalAddr().(*net.TCPAddr).Port
}

// ClientPort is the client's own port (the remote port of the accepted
// socket).
func (l *Link) ClientPort() int { return l.client.RemoteAddr().(*net.TCPAddr).Port }

// Done is closed once the link has ended: both of its sockets are closed.
func (l *Link) Done() <-chan struct{} { return l.done }

// Cut resets both sockets: each side sees its connection reset.
func (l *Link) Cut() {
	l.mu.Lock()
	l.cut = true
	server := l.server
	l.changedLocked()
	l.mu.Unlock()
	reset(l.client)
	if server != nil {
		reset(server)
	}
}

// CutClient makes the link half-open: the client's socket is reset (the
// client sees its connection broken) while the server's stays open and
// silent, so the server believes the client is still there until TCP
// keepalive, a timeout of its own, or someone ends the session.
func (l *Link) CutClient() {
	l.mu.Lock()
	l.clientGone = true
	l.changedLocked()
	l.mu.Unlock()
	reset(l.client)
}

// CutServer is the converse of CutClient: the server's socket is reset
// (the server ends the session) while the client's stays open and silent:
// the client's writes vanish and its reads wait.
func (l *Link) CutServer() {
	l.mu.Lock()
	l.serverGone = true
	server := l.server
	l.changedLocked()
	l.mu.Unlock()
	if server != nil {
		reset(server)
	}
}

// HalfClose closes one direction cleanly (FIN): toClient true ends what the
// client reads (it sees end of stream but may still write); false ends what
// the server reads.
func (l *Link) HalfClose(toClient bool) {
	l.mu.Lock()
	server := l.server
	l.mu.Unlock()
	c := server
	if toClient {
		c = l.client
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// BlackHole stops forwarding in both directions, silently, until Resume.
func (l *Link) BlackHole() {
	l.mu.Lock()
	l.blackHoled = true
	l.cond.Broadcast()
	l.mu.Unlock()
}

// Resume forwards again after BlackHole, the stream intact.
func (l *Link) Resume() {
	l.mu.Lock()
	l.blackHoled = false
	l.cond.Broadcast()
	l.mu.Unlock()
}

// DropAnswers throws away, from now on, whatever the server sends the
// client, while what the client sends still reaches the server: the
// client's statements run, and their answers are lost on the way, as over
// a network that fails in one direction. The server sees its writes
// succeed.
func (l *Link) DropAnswers() {
	l.mu.Lock()
	l.dropAnswers = true
	l.mu.Unlock()
}

// Direction is which way a chunk travels on a link.
type Direction int

// The two directions of a link.
const (
	ToServer Direction = iota // what the client sends
	ToClient                  // what the server answers
)

// Watch calls fn with every chunk read in direction d from now on, before it
// is forwarded; fn returns false to drop the chunk. A test reads the
// protocol with it (counting messages, spotting a statement) and faults the
// link at the right byte: fn may call the link's faults, or start a
// goroutine that does. fn runs on the link's pump for d, one chunk at a
// time; chunks are cut wherever the sockets' reads return, not at message
// boundaries. Install it from OnAccept to see a link's first bytes.
func (l *Link) Watch(d Direction, fn func(chunk []byte) (forward bool)) {
	l.mu.Lock()
	l.watch[d] = fn
	l.mu.Unlock()
}

// Delay delays each chunk forwarded from now on by d (0: no delay).
func (l *Link) Delay(d time.Duration) {
	l.mu.Lock()
	l.delay = d
	l.mu.Unlock()
}

// changedLocked wakes the pumps after a cut; l.mu is held.
func (l *Link) changedLocked() {
	l.cond.Broadcast()
	l.stopOnce.Do(func() { close(l.stop) })
}

// run connects to the server and forwards until both directions end.
func (l *Link) run(onAccept func(*Link)) {
	defer l.p.wg.Done()
	defer func() {
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
		close(l.done)
	}()
	server, err := net.DialTimeout("tcp", l.p.target, 10*time.Second)
	if err != nil {
		reset(l.client)
		return
	}
	l.mu.Lock()
	l.server = server
	stopped := l.cut || l.clientGone || l.serverGone
	l.mu.Unlock()
	if stopped {
		reset(server)
		reset(l.client)
		return
	}
	if onAccept != nil {
		onAccept(l)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.pump(server, l.client, false) }()
	go func() { defer wg.Done(); l.pump(l.client, server, true) }()
	wg.Wait()
}

// pump copies src to dst; toClient says which way. It ends when src ends
// or the link is cut. Of a half-open link, the pump reading the side that
// is kept goes on reading it, and drops what it reads, until that side
// closes or the link is cut.
func (l *Link) pump(dst, src net.Conn, toClient bool) {
	buf := make([]byte, 32<<10)
	for {
		if !l.gate() {
			break
		}
		n, err := src.Read(buf)
		if n > 0 {
			if !l.gate() {
				break
			}
			l.mu.Lock()
			d, drop := l.delay, toClient && l.dropAnswers
			watch := l.watch[ToServer]
			if toClient {
				watch = l.watch[ToClient]
			}
			l.mu.Unlock()
			if watch != nil && !watch(buf[:n]) {
				drop = true
			}
			if drop {
				continue
			}
			if d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-l.stop:
					t.Stop()
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				if l.open() {
					reset(src) // the other side is gone: so is this one
				}
				break
			}
		}
		if err != nil {
			if l.open() {
				if errors.Is(err, io.EOF) {
					if tc, ok := dst.(*net.TCPConn); ok {
						tc.CloseWrite() // pass the FIN on
					}
				} else {
					reset(dst) // pass the reset on
				}
			}
			break
		}
	}
	l.mu.Lock()
	drain := (l.clientGone && toClient) || (l.serverGone && !toClient)
	l.mu.Unlock()
	if !drain {
		return
	}
	// The kept side may write; it must see no error until the link is cut
	// or it closes itself (the server ended the session).
	for {
		if _, err := src.Read(buf); err != nil {
			reset(src)
			return
		}
	}
}

// open reports whether the link is neither cut nor half-open.
func (l *Link) open() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.cut && !l.clientGone && !l.serverGone
}

// gate waits while the link is black-holed; false once forwarding must stop
// (cut, or one side gone).
func (l *Link) gate() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.blackHoled && !l.cut && !l.clientGone && !l.serverGone {
		l.cond.Wait()
	}
	return !l.cut && !l.clientGone && !l.serverGone
}

// reset closes c with a TCP reset (linger 0), as a broken connection looks.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}
