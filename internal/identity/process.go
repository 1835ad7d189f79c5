package identity

import (
	"crypto/rand"
	"os"
	"strconv"
	"strings"
	"sync"
)

// ProcessLabel is this process as other processes see it: host/pid:nonce.
// Host and pid alone do not tell processes apart: two containers of one
// pod share the host name and both run as pid 1, and a restarted container
// is labelled like its predecessor, whose backends may outlive it (a
// leaked lock held until TCP keepalive ends them); four random base-36
// characters, drawn once per process, do.
func ProcessLabel() string { return processLabel() }

// ShortProcessLabel is ProcessLabel as application_name carries it (see
// [Holder.AppName]): a long host shortened.
func ShortProcessLabel() string { return shortProcess(processLabel(), appNameProcessLen) }

// processLabel computes ProcessLabel's value once.
var processLabel = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	host = SafeToken(host, "-")
	if host == "" {
		host = "localhost"
	}
	var b [4]byte
	rand.Read(b[:])
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	nonce := make([]byte, len(b))
	for i, x := range b {
		nonce[i] = digits[int(x)%len(digits)]
	}
	return host + "/" + strconv.Itoa(os.Getpid()) + ":" + string(nonce)
})

// shortProcess fits a process label into n bytes for application_name:
// a long host keeps its start and its end (a Kubernetes pod's unique
// suffix), joined by "~".
func shortProcess(p string, n int) string {
	if len(p) <= n {
		return p
	}
	host, pid, _ := strings.Cut(p, "/")
	keep := n - len(pid) - 2 // "~" and "/"
	if keep < 4 {
		return p[:n]
	}
	tail := min(6, keep/2)
	return host[:keep-tail] + "~" + host[len(host)-tail:] + "/" + pid
}
